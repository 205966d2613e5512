"""Bandwidth efficiency e_w by GPU generation x kernel family x precision, fitted to the published
measurements of data/published_measurements.csv, and its leave-one-out check.

A fit point is a single-GPU row whose step is weight streaming: decode_tok_s at batch 1, or itl_ms
at <= MAX_FIT_USERS users (a decode round at that batch). Its e_w is closed-form: the measured step
less the roofline's other terms (KV reads, all-reduce, fixed overheads; none depends on e_w) is
the time the weights took,  e_w = W / (BW * (t - t_kv - t_comm - t_overhead)).
A cell's e_w is the median of its points' (robust to one odd source); efficiency.FitTable holds the
cells and falls back to (family, precision) over all generations, then to the family's default.
For torch-compile (gpt-fast, torchao: 7B to 70B models of the same kernels) a per-layer fixed cost
is fitted too: the value on PER_LAYER_GRID that makes each cell's points agree best (the median
|log(e_w / cell median)|), as long as every point stays fittable; small models, whose step has
the same number of kernels per layer for far fewer bytes, otherwise look less efficient.
The shipped table is data/efficiency_fit.csv (`python -m engine plan refit` rewrites it; a test
recomputes it); docs/PLANNER.md ("Fitted efficiencies") shows it and the leave-one-out errors.
"""
from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from engine.common.fields import M
from engine.planner import shapes
from engine.planner.efficiency import ALL_GENERATIONS, EMPTY_FIT, FIT_PATH, MIN_POOLED_POINTS, FitCell, FitTable
from engine.planner.gpus import GPU, load_gpus
from engine.planner.published import check_published, deployment_for, excluded, load_published, predict_published
from engine.planner.roofline import decode_step
from engine.planner.shapes import ModelShape

MAX_FIT_USERS = 4   # up to here a decode round of an 8B on one GPU is still >= 80% weight reads
OVERHEAD_FAMILIES = ("torch-compile",)                       # families with models of several sizes per cell
PER_LAYER_GRID = tuple(round(0.005 * i, 3) for i in range(13))   # 0 .. 0.06 ms per layer


@dataclass(frozen=True)
class FitPoint:
    """One published row the fit uses: its cell and its closed-form e_w (None, with `reason`, when
    the other terms already exceed the measured step or e_w would pass 1)."""

    id: str
    generation: str
    family: str
    precision: str
    mem_bw: float | None
    reason: str = ""

    @property
    def cell(self) -> tuple[str, str, str]:
        return self.generation, self.family, self.precision


def fit_step(row: Mapping) -> tuple[float, float, float] | None:
    """(measured step seconds, batch, context) of a row the fit can use, else None."""
    if excluded(row) or int(row.get("tp") or 1) != 1:
        return None
    c = json.loads(row.get("condition") or "{}")
    meas = float(row["measured"])
    if row["metric"] == M.decode_tok_s and c.get("batch", 1) == 1:
        return 1.0 / meas, 1.0, float(c.get("context", 128))
    if row["metric"] == "itl_ms" and c.get("concurrency", 0) <= MAX_FIT_USERS:
        return meas / 1e3, float(c["concurrency"]), c["input"] + c["output"] / 2.0
    return None


def fit_points(rows: Sequence[Mapping], gpus: Mapping[str, GPU] | None = None,
               models: Mapping[str, ModelShape] | None = None,
               per_layer_ms: Mapping[str, float] | None = None) -> list[FitPoint]:
    """The fit points of `rows`, each with its closed-form e_w (module docstring), given the
    fitted per-layer costs per family."""
    gpus = gpus if gpus is not None else load_gpus()
    models = models if models is not None else shapes.load_models()
    out = []
    for r in rows:
        got = fit_step(r)
        if got is None:
            continue
        t, batch, ctx = got
        dep = deployment_for(r, gpus, models, FitTable({}, dict(per_layer_ms or {})) if per_layer_ms else EMPTY_FIT)
        st = decode_step(dep, batch, ctx)
        rest = t - st.t_kv - st.t_comm - st.t_overhead
        key = dict(id=r["id"], generation=dep.gpu.generation, family=dep.family, precision=dep.precision)
        if rest <= 0:
            out.append(FitPoint(**key, mem_bw=None, reason=f"KV, all-reduce and overheads ({(t - rest) * 1e3:.1f} ms) "
                                                           f"exceed the measured step ({t * 1e3:.1f} ms)"))
            continue
        e = st.weight_bytes / (rest * dep.gpu.mem_bw_tbs * 1e12)
        if e > 1.0:
            out.append(FitPoint(**key, mem_bw=None, reason=f"implies e_w {e:.2f} > 1: the family's fixed overheads "
                                                           f"({st.t_overhead * 1e3:.1f} ms) are too large for it"))
            continue
        out.append(FitPoint(**key, mem_bw=e))
    return out


def fit_table(points: Sequence[FitPoint], per_layer_ms: Mapping[str, float] | None = None) -> FitTable:
    """Median e_w per (generation, family, precision) and per (family, precision) over all generations."""
    groups: dict[tuple[str, str, str], list[FitPoint]] = {}
    for p in points:
        if p.mem_bw is None:
            continue
        groups.setdefault(p.cell, []).append(p)
        groups.setdefault((ALL_GENERATIONS, p.family, p.precision), []).append(p)
    cells = {k: FitCell(*k, statistics.median(p.mem_bw for p in ps), tuple(p.id for p in ps))
             for k, ps in sorted(groups.items())}
    return FitTable(cells, dict(per_layer_ms or {}))


def dispersion(points: Sequence[FitPoint]) -> float:
    """Median |log(e_w / its cell's median)| over the cells with >= 2 points: how well one e_w per cell holds."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    for p in points:
        if p.mem_bw is not None:
            cells.setdefault(p.cell, []).append(p.mem_bw)
    devs = [abs(math.log(e / statistics.median(v))) for v in cells.values() if len(v) >= 2 for e in v]
    return statistics.median(devs) if devs else 0.0


def candidates(rows: Sequence[Mapping], gpus: Mapping[str, GPU], models: Mapping[str, ModelShape]
               ) -> dict[float, list[FitPoint]]:
    """The fit points at every per-layer cost of the grid (the other families' points do not move)."""
    return {d: fit_points(rows, gpus, models, {f: d for f in OVERHEAD_FAMILIES}) for d in PER_LAYER_GRID}


def choose(cands: Mapping[float, list[FitPoint]], drop: str | None = None) -> FitTable:
    """The fit without the point `drop`: the per-layer cost whose cells agree best (every point of the
    family still fittable), then the cells' medians at it."""
    best = None
    for d, pts in cands.items():
        pts = [p for p in pts if p.id != drop]
        fam = [p for p in pts if p.family in OVERHEAD_FAMILIES]
        if d > 0 and any(p.mem_bw is None for p in fam):
            continue
        score = dispersion(fam)
        if best is None or score < best[0] - 1e-12:
            best = (score, d, pts)
    _, d, pts = best
    return fit_table(pts, {f: d for f in OVERHEAD_FAMILIES})


def refit(path: str | Path | None = None) -> FitTable:
    """The table the shipped published rows give (what data/efficiency_fit.csv must hold)."""
    return choose(candidates(load_published(path), load_gpus(), shapes.load_models()))


def write_fit(table: FitTable, path: str | Path | None = None) -> Path:
    p = Path(path) if path else FIT_PATH
    with open(p, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["kind", "generation", "family", "precision", "value", "points", "ids"])
        for fam, d in sorted(table.per_layer_ms.items()):
            ids = sorted({i for c in table.cells.values() if c.family == fam for i in c.ids})
            w.writerow(["per_layer_ms", ALL_GENERATIONS, fam, ALL_GENERATIONS, f"{d:g}", len(ids), " ".join(ids)])
        for c in table.cells.values():
            w.writerow(["e_w", c.generation, c.family, c.precision, f"{c.mem_bw:.4f}", len(c.ids), " ".join(c.ids)])
    return p


def leave_one_out(path: str | Path | None = None) -> dict[str, dict]:
    """For every fitted point: the prediction with the full fit and with the fit refitted without it.
    {id: {in_sample, loo, loo_error_pct, loo_basis}}; points the fit could not use carry `reason`."""
    rows = load_published(path)
    gpus, models = load_gpus(), shapes.load_models()
    cands = candidates(rows, gpus, models)
    full = choose(cands)
    points = cands[full.per_layer_ms.get(OVERHEAD_FAMILIES[0], 0.0)]
    by_id = {r["id"]: r for r in rows}
    out = {}
    for p in points:
        r = by_id[p.id]
        if p.mem_bw is None:
            out[p.id] = {"reason": p.reason}
            continue
        loo = choose(cands, drop=p.id)
        meas = float(r["measured"])
        pred_in = predict_published(r, gpus, models, full)
        pred_loo = predict_published(r, gpus, models, loo)
        dep = deployment_for(r, gpus, models, loo)
        out[p.id] = {"e_w": p.mem_bw, "in_sample": pred_in, "loo": pred_loo,
                     "loo_error_pct": 100.0 * (pred_loo - meas) / meas, "loo_basis": dep.efficiency()[1]}
    return out


def check_with_loo(path: str | Path | None = None) -> list[dict]:
    """check_published's rows (predictions with the shipped fit), each with its fit use and, for
    fitted points, the leave-one-out prediction and error."""
    rows = check_published(path)
    loo = leave_one_out(path)
    for r in rows:
        got = loo.get(r["id"])
        if r.get("excluded"):
            r["fit_use"] = "excluded"
        elif got is None:
            r["fit_use"] = "check"
        elif "reason" in got:
            r["fit_use"] = "not fitted: " + got["reason"]
        else:
            r["fit_use"] = "fit"
            r.update(got)
    return rows


def loo_summary(rows: Sequence[dict]) -> dict:
    """n, median and max |LOO error| over the fitted points."""
    errs = sorted(abs(r["loo_error_pct"]) for r in rows if "loo_error_pct" in r)
    if not errs:
        return {"n": 0, "median": float("nan"), "max": float("nan")}
    return {"n": len(errs), "median": statistics.median(errs), "max": errs[-1]}


def summary_line(rows: Sequence[dict]) -> str:
    """One line for the CLI and the docs: the leave-one-out summary and the whole check's."""
    s = loo_summary(rows)
    kept = sorted(abs(r["error_pct"]) for r in rows if not r.get("excluded"))
    med = statistics.median(kept) if kept else float("nan")
    return (f"{s['n']} fitted points: leave-one-out median |error| {s['median']:.1f}%, max {s['max']:.0f}%; "
            f"{len(rows)} measurements ({len(rows) - len(kept)} excluded from the fit and this summary): "
            f"median |error| {med:.0f}%, max {kept[-1] if kept else float('nan'):.0f}%")


def fit_table_markdown(table: FitTable) -> str:
    """The docs table of the fitted cells: e_w, points, and which rows."""
    lines = [f"Fitted per-layer cost: {', '.join(f'{f} {d:g} ms' for f, d in sorted(table.per_layer_ms.items()))}.", "",
             "| generation | family | precision | e_w | points | published rows |", "|---|---|---|---:|---:|---|"]
    for c in table.cells.values():
        gen = c.generation
        if c.generation == ALL_GENERATIONS:
            gen = "all (fallback)" if len(c.ids) >= MIN_POOLED_POINTS else "all (unused: < 2 points)"
        lines.append(f"| {gen} | {c.family} | {c.precision} | {c.mem_bw:.2f} | {len(c.ids)} | {', '.join(c.ids)} |")
    return "\n".join(lines)
