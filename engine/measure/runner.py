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
    """What a work item returns when it could not run here (llama.cpp absent, a GGUF missing): said, never stored.
    `runs`: the records it will therefore not make (a load sweep's points not sent)."""
    label: str
    notes: str
    runs: int = 1


def measure_one(config, pool: ModelPool, store=None, progress=None, on_token=None, kind: str = "bench",
                should_cancel=None, on_record=None):
    """One work item measured: a RunConfig here (execute, stored as a record of `kind`, `on_token` streaming its
    first generation), anything else by its own `measure(pool, store, progress)`: a peer in a fresh process, a
    quality score (engine.measure.quality.QualityItem, engine.peers.quality_worker.LlamaQualityItem).

    An item that lands several records or can stop part-way (`owns_progress`: a load sweep, a model load) is
    also given `should_cancel` and `on_record`, and returns the records it landed (or None: done, no record).
    """
    if isinstance(config, RunConfig):
        return execute(config, pool, store, progress, on_token=on_token, kind=kind)
    if getattr(config, "owns_progress", False):
        return config.measure(pool, store, progress, should_cancel=should_cancel, on_record=on_record)
    return config.measure(pool, store, progress)


def could_not_run(rec: RunRecord | Skipped) -> bool:
    """Skipped, or a peer that could not run (a record with notes and no metrics): said, never stored."""
    return isinstance(rec, Skipped) or (rec.kind == "peer" and not rec.metrics)


def run_many(items: list, pool: ModelPool, store=None, *, say=None, should_cancel=None, on_record=None,
             on_skip=None, on_token=None, on_item=None, kind: str = "bench", noun: str = "run") -> list[RunRecord]:
    """The loop that runs work items in order: the CLI's bench, quality and accuracy, the backend's jobs.

    Each item is measured by `measure_one` and stored as it finishes, so a cancel keeps what is done.
    say(message) gets each item's "run i/n (label)" and its progress under that prefix; should_cancel() is
    checked before each item; on_record(record) and on_skip(skipped) are called as each lands or could not
    run; on_item(item, outcome) once each item is over (outcome: its record, records, Skipped or None);
    on_token streams the first item's first generation. A UserError is raised again naming the item.
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
            got = measure_one(item, pool, store, (lambda s, p=prefix: say(f"{p}: {s}")) if say else None,
                              on_token=on_token if i == 0 else None, kind=kind, should_cancel=should_cancel,
                              on_record=on_record)
        except UserError as e:
            raise UserError(f"{item.label}: {e.problem}", e.fix) from e
        if isinstance(got, list):  # landed one by one by the item itself
            out.extend(got)
        elif got is not None and could_not_run(got):
            if on_skip:
                on_skip(got)
        elif got is not None:
            out.append(got)
            if on_record:
                on_record(got)
        if on_item:
            on_item(item, got)
    return out
