"""The user's prices: overrides of the price table's rows (gpus.py), read and written through the store passed in.

The shipped data/gpus.csv is never written: a price from the user's contract, and this machine's
$/hour, live in the store's GPU overrides, which gpus.load_gpus merges on top. This machine's price
serves every view: the one-stream $/1M of the comparison tables, the reports and the planner's
"this machine" plans. Pure otherwise (no Streamlit, no SQLite here).
"""
from __future__ import annotations

from typing import Protocol

from engine.common.formulas import DEFAULT_USD_PER_HOUR, check_price
from engine.planner.gpus import THIS_MACHINE, load_gpus

PRICE = "price_usd_per_hr"


class Overrides(Protocol):
    """What this module needs of a store (engine.measure.store.Store has it)."""

    def gpu_overrides(self) -> list[dict]: ...

    def set_gpu_override(self, name: str, fields: dict) -> None: ...


def machine_price(store: Overrides, default: float = DEFAULT_USD_PER_HOUR) -> float:
    """This machine's $/hour as the user set it; `default` until they set one."""
    for ov in store.gpu_overrides():
        p = ov.get(PRICE)
        if ov.get("name") == THIS_MACHINE and isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0:
            return float(p)
    return default


def set_gpu_price(store: Overrides, name: str, usd_per_hour: float, source: str) -> float:
    """Store a GPU's $/hour, keeping its row's other overrides. Refused before anything is stored unless
    it is a positive number for a GPU the table knows (CatalogError/UserError naming the field)."""
    price = check_price(usd_per_hour)
    overrides = store.gpu_overrides()
    kept = next((ov for ov in overrides if ov.get("name") == name), {})
    fields = {**{k: v for k, v in kept.items() if k != "name"}, PRICE: price, "price_source": source}
    load_gpus([ov for ov in overrides if ov.get("name") != name] + [{"name": name, **fields}])
    store.set_gpu_override(name, fields)
    return price


def set_machine_price(store: Overrides, usd_per_hour: float, source: str = "set in the dashboard") -> float:
    """Store this machine's $/hour (the price every page shows costs at)."""
    return set_gpu_price(store, THIS_MACHINE, usd_per_hour, source)
