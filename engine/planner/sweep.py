"""Where quantization and speculation stop paying, and how many replicas share one GPU.

`batch_sweep` tabulates decode cost against batch per precision (with and without speculation, and
the acceptance speculation needs to pay there), `crossovers` says in words where each gain fades,
`break_even_acceptance` is that needed acceptance, `packing` counts independent replicas of one model
that fit on one GPU.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from engine.common import step_model
from engine.common.vocab import PRECISIONS
from engine.planner import counts
from engine.planner.acceptance import acceptance_from_mean_length
from engine.planner.calibration import Calibration
from engine.planner.candidates import candidates, cannot_run, runnable
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU
from engine.planner.roofline import DEFAULT_MEM_UTIL, GIB, Deployment, RooflineSteps, decode_step, memory, spec_step
from engine.planner.shapes import ModelShape
from engine.planner.speculation import SpecConfig
from engine.planner.why import ms
from engine.planner.workload import MAX_TOKENS

MAX_SWEEP_BATCH = 1_000_000     # sequences in one decode step; beyond this a batch is a typing mistake
BEST_GAMMAS = range(1, 9)       # the draft lengths a sweep tries for the best gamma at each batch (0 too)


def _check_count(field: str, v, lo: int, hi: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise PlanError(field, f"must be a number from {lo} to {hi:,.0f}, got {v!r}")


def break_even_acceptance(dep: Deployment, batch: float, context: float) -> float | None:
    """The per-token acceptance below which speculation stops paying at this batch: the a whose E(a, g)
    equals a round's cost over a plain step's, (verify + drafting) / plain. None when even a = 1 (E = g+1)
    cannot pay for the round."""
    sp = dep.spec
    assert sp is not None
    plain = decode_step(replace(dep, spec=None, draft=None), batch, context).total
    need = spec_step(dep, batch, context).total / plain
    if need >= sp.gamma + 1:
        return None
    return acceptance_from_mean_length(need, sp.gamma)


def best_gamma(dep: Deployment, batch: float, context: float) -> tuple[int, float]:
    """(gamma, speedup against plain decoding) of the draft length that pays best at this batch, up to
    max(BEST_GAMMAS): the rule of our server's adaptive policy (engine.common.step_model.best_gamma), with T
    from this roofline instead of the server's measured tables. (0, 1.0) when no gamma pays."""
    sp = dep.spec
    assert sp is not None
    steps = RooflineSteps(dep, context)
    expected = [1.0] + [replace(sp, gamma=g).expected_tokens for g in BEST_GAMMAS]
    g = step_model.best_gamma(steps, expected, batch)
    return g, step_model.speedup(steps, expected, batch, g)


def batch_sweep(model: ModelShape, gpu: GPU, precisions: Sequence[str], batches: Sequence[int], context: int,
                spec: SpecConfig | None = None, draft: ModelShape | None = None, tp: int = 1,
                family: str = "serving", calibration: Calibration | None = None) -> list[dict]:
    """Decode cost vs batch, per precision, with and without speculation: where quantization and
    speculation stop paying. Rows: batch, precision, step_ms, tpot_ms, tok_s, bound, fits,
    spec_tpot_ms, spec_speedup, best_gamma, best_gamma_speedup, speedup_vs_first_precision."""
    for b in batches:
        _check_count("batches", b, 1, MAX_SWEEP_BATCH)
    _check_count("context", context, 0, MAX_TOKENS)
    rows = []
    base: dict[int, float] = {}
    for p in (c.precision for c in runnable(candidates([gpu], precisions, (tp,)), model)):
        dep = Deployment(model, gpu, p, tp, family=family, calibration=calibration)
        mem = memory(dep)
        for b in batches:
            st = decode_step(dep, b, context)
            row = {"batch": b, "precision": p, "step_ms": ms(st.total), "tpot_ms": ms(st.total),
                   "tok_s": b / st.total, "bound": st.bound,
                   "kv_share": st.t_kv / st.t_memory if st.t_memory else 0.0,
                   "fits": mem.max_concurrency(context) >= b}
            if spec is not None:
                sdep = replace(dep, spec=spec, draft=draft)
                ss = spec_step(sdep, b, context)
                row["spec_tpot_ms"] = ms(ss.total / ss.expected_tokens)
                row["spec_speedup"] = st.total * ss.expected_tokens / ss.total
                row["spec_bound"] = ss.verify.bound
                row["break_even_acceptance"] = break_even_acceptance(sdep, b, context)
                row["best_gamma"], row["best_gamma_speedup"] = best_gamma(sdep, b, context)
            base.setdefault(b, row["tok_s"])
            row["speedup_vs_first_precision"] = row["tok_s"] / base[b]
            rows.append(row)
    return rows


def crossovers(rows: Sequence[dict], threshold: float = 1.05) -> list[str]:
    """Plain-language summary of a batch sweep: the batch where speculation drops below 1x, and
    where a precision's gain over the first one falls below `threshold`."""
    out = []
    by_p: dict[str, list[dict]] = {}
    for r in rows:
        by_p.setdefault(r["precision"], []).append(r)
    first = next(iter(by_p), None)
    for p, rs in by_p.items():
        rs = sorted(rs, key=lambda r: r["batch"])
        if "spec_speedup" in rs[0]:
            lose = next((r["batch"] for r in rs if r["spec_speedup"] < 1.0), None)
            out.append(f"{p}: speculation " + (f"stops paying at batch {lose} (the verify pass of gamma+1 "
                                               f"tokens per sequence costs more than the tokens it saves)"
                                               if lose else "still pays at the largest batch swept"))
            if "best_gamma" in rs[0]:
                none = next((r["batch"] for r in rs if r["best_gamma"] == 0), None)
                out.append(f"{p}: the best gamma by batch is " + ", ".join(f"{r['best_gamma']} at {r['batch']}"
                                                                           for r in rs)
                           + (f"; from batch {none} no gamma pays (an adaptive server drafts nothing there)"
                              if none else "; some gamma pays at every batch swept"))
            need = [(r["batch"], r.get("break_even_acceptance")) for r in rs]
            out.append(f"{p}: speculation needs an acceptance above "
                       + ", ".join(f"{a:.2f} at batch {b}" if a is not None else f"1 (never pays) at batch {b}"
                                   for b, a in need))
        if p != first and rs and rs[0]["speedup_vs_first_precision"] > threshold:
            fade = next((r for r in rs if r["speedup_vs_first_precision"] < threshold), None)
            why = ""
            if fade is not None:
                why = ("compute-bound" if fade["bound"] == "compute" else
                       f"KV-cache reads are {fade['kv_share']:.0%} of the memory time")
            out.append(f"{p}: {rs[0]['speedup_vs_first_precision']:.2f}x faster than {first} at batch "
                       f"{rs[0]['batch']}" + (f", under {threshold:.2f}x from batch {fade['batch']} ({why})"
                                             if fade else ", still ahead at the largest batch swept"))
    return out


def packing(model: ModelShape, gpu: GPU, precisions: Sequence[str] = PRECISIONS, context_tokens: int = 4096,
            concurrency: int = 1, kv_dtype: str = "bf16", per_replica_overhead_gib: float = 0.5,
            mem_util: float | None = None) -> list[dict]:
    """Multi-model packing: how many independent replicas of `model` fit on one GPU per precision,
    each holding its weights, `per_replica_overhead_gib` (CUDA context, workspaces; assumption)
    and KV for `concurrency` requests of `context_tokens`."""
    _check_count("context_tokens", context_tokens, 1, MAX_TOKENS)
    _check_count("concurrency", concurrency, 1, MAX_SWEEP_BATCH)
    util = mem_util if mem_util is not None else DEFAULT_MEM_UTIL.get(gpu.kind, 0.9)
    usable = gpu.memory_gb * GIB * util
    rows = []
    for p in precisions:
        fits_gpu = cannot_run(model, gpu, p) is None
        wb = counts.weight_bytes(model, p)
        kv = counts.kv_cache_bytes(model, context_tokens, kv_dtype) * concurrency
        per = wb + kv + per_replica_overhead_gib * GIB
        n = int(usable // per) if fits_gpu else 0
        rows.append({"precision": p, "replicas": n, "runnable": fits_gpu, "weights_gb": wb / 1e9,
                     "kv_gb": kv / 1e9, "per_replica_gb": per / 1e9, "usable_gb": usable / 1e9})
    return rows
