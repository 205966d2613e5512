"""Many runs: running a list of configurations in order (the grids themselves are grid.py's)."""
from __future__ import annotations

import time

from engine.measure.grid import DEFAULT_WORKLOAD, default_comparison, sweep_configs  # noqa: F401  (re-exported)
from engine.measure.pool import ModelPool
from engine.measure.records import RunRecord
from engine.measure.run_config import RunConfig
from engine.measure.runs import execute


def measure_one(config, pool: ModelPool, store=None, progress=None) -> RunRecord:
    """One configuration measured: a RunConfig here (execute), anything else by its own `measure` (a peer in a
    fresh process)."""
    if isinstance(config, RunConfig):
        return execute(config, pool, store, progress)
    return config.measure(pool, store, progress)


def run_many(configs: list, pool: ModelPool, store=None, on_progress=None, should_cancel=None,
             progress=None) -> list[RunRecord]:
    """Run configs in order; each record is stored as it finishes, so a cancel keeps what is done.

    Each config is measured by `measure_one`: a RunConfig in this process, a peers.PeerConfig in a fresh
    one (a peer that is unavailable comes back as a record with notes and no metrics, and is not stored).

    on_progress(done, total, eta_s, record) is called after each run; eta_s extrapolates the mean
    time per run so far. should_cancel() is checked before each run.
    """
    out: list[RunRecord] = []
    t0 = time.perf_counter()
    for i, c in enumerate(configs):
        if should_cancel and should_cancel():
            break
        rec = measure_one(c, pool, store, progress)
        out.append(rec)
        if on_progress:
            per = (time.perf_counter() - t0) / len(out)
            on_progress(len(out), len(configs), per * (len(configs) - len(out)), rec)
    return out
