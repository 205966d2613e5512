"""Many runs: the grid of configurations, the Home page's default comparison, and running a list in order."""
from __future__ import annotations

import json
import time
from dataclasses import replace

from engine.measure.records import RunRecord
from engine.measure.runs import ModelPool, RunConfig


def sweep_configs(base: RunConfig, precisions, drafts, draft_precisions, gammas, batch_sizes=(1,)) -> list[RunConfig]:
    """The grid target precision x draft x draft precision x gamma x batch, without duplicates."""
    out, seen = [], set()
    for p in precisions:
        for d in drafts:
            for dp in (draft_precisions if d in ("model", "self") else [None]):
                for g in (gammas if d != "none" else [None]):
                    for bsz in batch_sizes:
                        c = replace(base, precision=p, draft=d, draft_precision=dp or base.draft_precision,
                                    gamma=g or base.gamma, batch_size=bsz)
                        key = json.dumps(c.to_dict(), sort_keys=True)
                        if key not in seen:
                            seen.add(key)
                            out.append(c)
    return out


DEFAULT_WORKLOAD = "chat:2,code:2"  # small, so the Home page's one click stays a few minutes


def default_comparison(model: str = "default", draft_model: str = "default-draft", max_new_tokens: int = 48,
                       self_draft: bool = False, workload: str | None = DEFAULT_WORKLOAD,
                       reps: int = 3) -> list[RunConfig]:
    """fp32 vs int8 vs int4 vs int4 with speculative decoding, the Home page's one-click comparison."""
    base = RunConfig(model=model, draft_model=draft_model, max_new_tokens=max_new_tokens, baseline=False,
                     workload=workload, reps=reps)
    spec = replace(base, precision="int4", draft="self" if self_draft else "model", draft_precision="int4",
                   gamma=4, baseline=True)
    return [replace(base, precision="fp32"), replace(base, precision="int8"), replace(base, precision="int4"), spec]


def run_many(configs: list, pool: ModelPool, store=None, on_progress=None, should_cancel=None,
             progress=None) -> list[RunRecord]:
    """Run configs in order; each record is stored as it finishes, so a cancel keeps what is done.

    Each config measures itself (`config.measure(pool, store, progress)`): a RunConfig in this
    process, a peers.PeerConfig in a fresh one (a peer that is unavailable comes back as a record
    with notes and no metrics, and is not stored).

    on_progress(done, total, eta_s, record) is called after each run; eta_s extrapolates the mean
    time per run so far. should_cancel() is checked before each run.
    """
    out: list[RunRecord] = []
    t0 = time.perf_counter()
    for i, c in enumerate(configs):
        if should_cancel and should_cancel():
            break
        rec = c.measure(pool, store, progress)
        out.append(rec)
        if on_progress:
            per = (time.perf_counter() - t0) / len(out)
            on_progress(len(out), len(configs), per * (len(configs) - len(out)), rec)
    return out
