"""The grids of configurations: a sweep's (precision x draft x draft precision x gamma x batch) and the
Home page's default comparison. Pure (no torch): the pages build them and send them to the backend.
"""
from __future__ import annotations

import json
from dataclasses import replace

from engine.common.errors import UserError
from engine.common.setup import EngineSetup
from engine.common.vocab import WEIGHT_BITS, parse_precision, parse_precision_spec
from engine.measure.run_config import RunConfig


def _self_draft_saves(precision: str, draft_precision: str) -> bool:
    """A self-draft pays only when it reads fewer bytes than its target (EngineSetup.validate refuses the rest)."""
    try:
        return WEIGHT_BITS[parse_precision(draft_precision)] < WEIGHT_BITS[parse_precision_spec(precision)[0]]
    except UserError:
        return True  # an unknown precision is refused by name when the config is validated


def sweep_configs(base: RunConfig, precisions, drafts, draft_precisions, gammas, batch_sizes=(1,),
                  left_out: list | None = None) -> list[RunConfig]:
    """The grid target precision x draft x draft precision x gamma x batch, without duplicates.

    A self-draft at a precision no cheaper than its target is left out of the grid (it would save
    nothing and is refused) and named in `left_out`, for the caller to say so; a grid of nothing
    else is refused, saying why.
    """
    out, seen = [], set()
    left_out = [] if left_out is None else left_out
    for p in precisions:
        for d in drafts:
            for dp in (draft_precisions if d in ("model", "self") else [None]):
                if d == "self" and not _self_draft_saves(p, dp):
                    left_out.append(f"{p} + self@{dp}")
                    continue
                for g in (gammas if d != "none" else [None]):
                    for bsz in batch_sizes:
                        setup = replace(base.setup, precision=p, draft=d, gamma=g or base.setup.gamma,
                                        draft_precision=dp or base.setup.draft_precision)
                        c = replace(base, setup=setup, batch_size=bsz)
                        key = json.dumps(c.to_dict(), sort_keys=True)
                        if key not in seen:
                            seen.add(key)
                            out.append(c)
    if not out and left_out:
        raise UserError(f"every configuration of the grid is a self-draft no cheaper than its target "
                        f"({', '.join(left_out)})",
                        "draft at a cheaper precision than the target (int4 drafting int8 or bf16, say)")
    return out


DEFAULT_WORKLOAD = "chat:2,code:2"  # small, so the Home page's one click stays a few minutes


def default_comparison(model: str = "default", draft_model: str = "default-draft", max_new_tokens: int = 48,
                       self_draft: bool = False, workload: str | None = DEFAULT_WORKLOAD,
                       reps: int = 3) -> list[RunConfig]:
    """fp32 vs int8 vs int4, and speculative decoding paired with its own baseline: the Home page's one click.

    The speculative run is int4 drafted by the 0.5B draft model at int4, or, with `self_draft`, int8
    drafted by its own int4 weights (a self-draft must read fewer bytes than its target to save anything).
    """
    base = RunConfig(EngineSetup(model=model, draft_model=draft_model), max_new_tokens=max_new_tokens,
                     baseline=False, workload=workload, reps=reps)
    spec_setup = replace(base.setup, precision="int8" if self_draft else "int4",
                         draft="self" if self_draft else "model", draft_precision="int4", gamma=4)
    spec = replace(base, setup=spec_setup, baseline=True)
    return [replace(base, setup=replace(base.setup, precision=p)) for p in ("fp32", "int8", "int4")] + [spec]
