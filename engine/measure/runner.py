"""The one loop that runs work items in order (what to run, the grids, is grid.py's)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.common.errors import UserError
from engine.measure.pool import ModelPool
from engine.measure.records import RunRecord
from engine.measure.run_config import RunConfig
from engine.measure.runs import execute


@dataclass(frozen=True)
class Skipped:
    """What a work item returns when it could not run here (llama.cpp absent, a GGUF missing): said, never stored."""
    label: str
    notes: str


def measure_one(config, pool: ModelPool, store=None, progress=None, on_token=None,
                kind: str = "bench") -> RunRecord | Skipped:
    """One work item measured: a RunConfig here (execute, stored as a record of `kind`, `on_token` streaming its
    first generation), anything else by its own `measure(pool, store, progress)`: a peer in a fresh process, a
    quality score (engine.measure.quality.QualityItem, engine.peers.quality_worker.LlamaQualityItem)."""
    if isinstance(config, RunConfig):
        return execute(config, pool, store, progress, on_token=on_token, kind=kind)
    return config.measure(pool, store, progress)


def could_not_run(rec: RunRecord | Skipped) -> bool:
    """Skipped, or a peer that could not run (a record with notes and no metrics): said, never stored."""
    return isinstance(rec, Skipped) or (rec.kind == "peer" and not rec.metrics)


def run_many(items: list, pool: ModelPool, store=None, *, say=None, should_cancel=None, on_record=None,
             on_skip=None, on_token=None, kind: str = "bench", noun: str = "run") -> list[RunRecord]:
    """The loop that runs work items in order: the CLI's bench and quality, the backend's runs, peers and
    llama-quality jobs.

    Each item is measured by `measure_one` and stored as it finishes, so a cancel keeps what is done.
    say(message) gets each item's "run i/n (label)" and its progress under that prefix; should_cancel() is
    checked before each item; on_record(record) and on_skip(record) are called as each lands or could not
    run; on_token streams the first item's first generation. A UserError is raised again naming the item.
    Returns the records that landed.
    """
    out: list[RunRecord] = []
    n = len(items)
    for i, item in enumerate(items):
        if should_cancel and should_cancel():
            break
        prefix = f"{noun} {i + 1}/{n} ({item.label})" if n > 1 else item.label
        if say:
            say(prefix)
        try:
            rec = measure_one(item, pool, store, (lambda s, p=prefix: say(f"{p}: {s}")) if say else None,
                              on_token=on_token if i == 0 else None, kind=kind)
        except UserError as e:
            raise UserError(f"{item.label}: {e.problem}", e.fix) from e
        if could_not_run(rec):
            if on_skip:
                on_skip(rec)
            continue
        out.append(rec)
        if on_record:
            on_record(rec)
    return out
