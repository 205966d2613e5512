"""The loaded models a process keeps between runs, and the test-model registry it loads from first.

A sweep, the dashboard and the backend measure many configurations of the same few models; the
pool keeps the most recently used ones loaded, within a count (`keep`) and, when given, a memory
budget in weight bytes, dropping the least recently used first.
"""
from __future__ import annotations

import gc
import threading
from collections import OrderedDict

from engine.common.errors import UserError
from engine.infer.loader import LoadedModel, load

# Extra models by name: factory(spec, device) -> LoadedModel. Tests register small random-init models
# here (tests/tiny.py); production code registers none, so the catalog is all a user sees.
_REGISTERED: dict[str, tuple] = {}


def register_model(name: str, factory, label: str | None = None) -> None:
    """Serve `name` from `factory(spec, device)` instead of the catalog (a test hook)."""
    _REGISTERED[name] = (factory, label or name)


def unregister_model(name: str) -> None:
    _REGISTERED.pop(name, None)


def registered_models() -> dict[str, str]:
    """Registered model names and their labels."""
    return {n: lbl for n, (_, lbl) in _REGISTERED.items()}


def describe(lm: LoadedModel) -> dict:
    """A loaded model as the pool lists it: name, precision (its label) and weight bytes."""
    return {"name": lm.name, "precision": lm.spec.label, "bytes": lm.weight_bytes}


class ModelPool:
    """Loaded models keyed by (name, spec, device), least recently used dropped first: past `keep`
    models, and past `budget_bytes` of weights (None: no byte budget)."""

    def __init__(self, keep: int = 3, budget_bytes: int | None = None):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise UserError(f"a model pool keeping {keep!r} models holds nothing", "keep at least 1 model")
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
                                         or budget_bytes < 1):
            raise UserError(f"model pool budget {budget_bytes!r} is not a positive number of bytes",
                            "give the bytes of weights the pool may hold, or None for no budget")
        self.keep = keep
        self.budget_bytes = budget_bytes
        self._models: OrderedDict[tuple, LoadedModel] = OrderedDict()
        self.lock = threading.RLock()  # one generation at a time: no two runs share a KV cache

    def get(self, name, spec, device, progress=None, should_stop=None) -> LoadedModel:
        """The model at `spec`, loaded once (a calibration asks `should_stop()` between layers)."""
        key = (name, spec, device)
        with self.lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            self._evict(self.keep - 1)  # room for one more before loading: two copies never overlap
            lm = _REGISTERED[name][0](spec, device) if name in _REGISTERED else load(name, spec, device, progress,
                                                                                   should_stop)
            self._models[key] = lm
            self._evict(self.keep, keep_newest=True)  # its size is known only once loaded
            return lm

    def _evict(self, most: int, keep_newest: bool = False) -> None:
        """Drop the least recently used until at most `most` models and the byte budget hold (the newest
        model stays when `keep_newest`, even alone over the budget: a run needs it)."""
        dropped = False
        floor = 1 if keep_newest else 0
        while len(self._models) > floor and (len(self._models) > most or self._over_budget()):
            self._models.popitem(last=False)
            dropped = True
        if dropped:
            gc.collect()

    def _over_budget(self) -> bool:
        return self.budget_bytes is not None and self.bytes() > self.budget_bytes

    def bytes(self) -> int:
        """Weight bytes of every model the pool holds."""
        return sum(lm.weight_bytes for lm in self._models.values())

    def peek(self, name, spec, device) -> LoadedModel | None:
        """The model if the pool holds it, without loading it."""
        with self.lock:
            return self._models.get((name, spec, device))

    def models(self) -> list[LoadedModel]:
        """What the pool holds, least recently used first: a snapshot taken without the lock, which a run holds
        for minutes (copying the dict's values is one step under the GIL)."""
        return list(self._models.values())

    def loaded(self) -> list[dict]:
        """What the pool holds, least recently used first: name, precision (its label) and weight bytes."""
        return [describe(lm) for lm in self.models()]

    def clear(self):
        with self.lock:
            self._models.clear()
            gc.collect()
