"""This machine's price: the user's $/hour, kept as the override of the price table's "this machine" row.

One price serves every view: the one-stream $/1M of the comparison tables, the reports and the
planner's "this machine" plans. It lives in the store's GPU overrides (gpus.load_gpus merges them),
read and written through the store passed in; pure otherwise (no Streamlit, no SQLite here).
"""
from __future__ import annotations

from typing import Protocol

from engine.common.formulas import DEFAULT_USD_PER_HOUR, check_price
from engine.planner.gpus import THIS_MACHINE

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


def set_machine_price(store: Overrides, usd_per_hour: float, source: str = "set in the dashboard") -> float:
    """Store this machine's $/hour (refused unless a positive number), keeping the row's other overrides."""
    price = check_price(usd_per_hour)
    kept = next((ov for ov in store.gpu_overrides() if ov.get("name") == THIS_MACHINE), {})
    fields = {k: v for k, v in kept.items() if k != "name"}
    store.set_gpu_override(THIS_MACHINE, {**fields, PRICE: price, "price_source": source})
    return price
