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
Then the step model's other terms, each from the points its term dominates, in order, each point's
value closed-form given what was fitted before it (the term's value = the median):
  allreduce_us by link  TP > 1 weight-streaming rows: (t - the step at zero latency) / (2 * layers)
  prefill_layer_us by family   TTFT rows: (t - the prefill without it) / layers
  per_seq_us by family  rows at > MAX_FIT_USERS users (ITL, or throughput turned into a round:
                        s = (c*O/thr - c*T_p) / O): (s - the round without it) / c
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
from engine.planner.efficiency import (ALL_GENERATIONS, EMPTY_FIT, FIT_PATH, MIN_POOLED_POINTS, MIN_TERM_POINTS,
                                       TERM_WORDS, FitCell, FitTable, FitTerm)
from engine.planner.gpus import GPU, load_gpus
from engine.planner.published import (check_published, deployment_for, excluded, load_published, predict_published,
                                      published_table_markdown)
from engine.planner.queueing import closed_loop_point
from engine.planner.roofline import decode_step, link_kind, prefill_step
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
    fitted per-layer costs per family (the other terms at their defaults: they are fitted after e_w)."""
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
        key = dict(id=r["id"], generation=dep.gpu.generation, family=dep.family, precision=dep.precision)
        gpu = t - st.t_overhead - (0.0 if st.overlap else st.t_launch)
        if st.overlap and gpu <= st.t_launch:
            out.append(FitPoint(**key, mem_bw=None, reason=f"launch-bound: the family's launches "
                                                           f"({st.t_launch * 1e3:.1f} ms) take the whole step"))
            continue
        rest = gpu - st.t_kv - st.t_comm
        if rest <= 0:
            out.append(FitPoint(**key, mem_bw=None, reason=f"KV, all-reduce and overheads ({(t - rest) * 1e3:.1f} ms) "
                                                           f"exceed the measured step ({t * 1e3:.1f} ms)"))
            continue
        e = st.weight_bytes / (rest * dep.gpu.mem_bw_tbs * 1e12)
        if e > 1.0:
            out.append(FitPoint(**key, mem_bw=None, reason=f"implies e_w {e:.2f} > 1: the family's fixed overheads "
                                                           f"({(st.t_overhead + st.t_launch) * 1e3:.1f} ms) are too "
                                                           f"large for it"))
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


def _term_point(kind: str, row: Mapping, gpus, models, table: FitTable) -> tuple[str, float] | None:
    """(key, the value of term `kind` this row implies given `table`), or None when the row is not
    one of the term's points (module docstring)."""
    if excluded(row):
        return None
    c = json.loads(row.get("condition") or "{}")
    tp, metric, meas = int(row.get("tp") or 1), row["metric"], float(row["measured"])
    if kind == "allreduce_us":
        if tp <= 1:
            return None
        if metric == M.decode_tok_s and c.get("batch", 1) == 1:
            t, batch, ctx = 1.0 / meas, 1.0, float(c.get("context", 128))
        elif metric == "itl_ms" and c.get("concurrency", 0) <= MAX_FIT_USERS:
            t, batch, ctx = meas / 1e3, float(c["concurrency"]), c["input"] + c["output"] / 2.0
        else:
            return None
        dep = deployment_for(row, gpus, models, table)
        if dep.family_obj().launch_overlaps:
            return None
        lat = dep.term("allreduce_us")[0] * 1e-6
        calls = 2 * dep.model.layers
        zero = decode_step(dep, batch, ctx).total - calls * lat
        return link_kind(dep.gpu), (t - zero) / calls * 1e6
    if kind == "prefill_layer_us":
        if metric != "ttft_ms":
            return None
        dep = deployment_for(row, gpus, models, table)
        layers = dep.model.layers
        zero = prefill_step(dep, c["input"]).total - dep.term("prefill_layer_us")[0] * 1e-6 * layers
        return dep.family_obj().name, (meas / 1e3 - zero) / layers * 1e6
    if kind == "per_seq_us":
        if metric not in ("itl_ms", "output_tok_s") or c.get("concurrency", 0) <= MAX_FIT_USERS:
            return None
        dep = deployment_for(row, gpus, models, table)
        cl = closed_loop_point(dep, c["concurrency"], c["input"], c["output"])
        if not cl.get("fits"):
            return None
        b, out = cl["effective_batch"], c["output"]
        s = meas / 1e3 if metric == "itl_ms" else (b * out / meas - b * cl["prefill_s"]) / out
        cur = dep.term("per_seq_us")[0] * 1e-6
        return dep.family_obj().name, (s - (cl["round_s"] - cur * b)) / b * 1e6
    raise ValueError(kind)


TERM_ORDER = ("allreduce_us", "prefill_layer_us", "per_seq_us")


def fit_terms(rows: Sequence[Mapping], gpus, models, table: FitTable, drop: str | None = None) -> FitTable:
    """`table` with the step model's other terms fitted in TERM_ORDER (module docstring), without
    the row `drop`. A term's value is the median of its points', never below 0."""
    for kind in TERM_ORDER:
        got: dict[str, list[tuple[str, float]]] = {}
        for r in rows:
            if r["id"] == drop:
                continue
            kv = _term_point(kind, r, gpus, models, table)
            if kv is not None:
                got.setdefault(kv[0], []).append((r["id"], kv[1]))
        terms = dict(table.terms)
        for key, pts in sorted(got.items()):
            terms[(kind, key)] = FitTerm(kind, key, max(0.0, statistics.median(v for _, v in pts)),
                                         tuple(i for i, _ in pts))
        table = FitTable(table.cells, table.per_layer_ms, terms)
    return table


def refit(path: str | Path | None = None) -> FitTable:
    """The table the shipped published rows give (what data/efficiency_fit.csv must hold)."""
    rows = load_published(path)
    gpus, models = load_gpus(), shapes.load_models()
    return fit_terms(rows, gpus, models, choose(candidates(rows, gpus, models)))


def write_fit(table: FitTable, path: str | Path | None = None) -> Path:
    p = Path(path) if path else FIT_PATH
    with open(p, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["kind", "generation", "family", "precision", "value", "points", "ids"])
        for fam, d in sorted(table.per_layer_ms.items()):
            ids = sorted({i for c in table.cells.values() if c.family == fam for i in c.ids})
            w.writerow(["per_layer_ms", ALL_GENERATIONS, fam, ALL_GENERATIONS, f"{d:g}", len(ids), " ".join(ids)])
        for t in table.terms.values():
            w.writerow([t.kind, ALL_GENERATIONS, ALL_GENERATIONS, t.key, f"{t.value:.6g}", len(t.ids), " ".join(t.ids)])
        for c in table.cells.values():
            w.writerow(["e_w", c.generation, c.family, c.precision, f"{c.mem_bw:.4f}", len(c.ids), " ".join(c.ids)])
    return p


def leave_one_out(path: str | Path | None = None) -> dict[str, dict]:
    """For every fitted point (of e_w or of a term): the prediction with the full fit and with every
    cell and term refitted without it. {id: {in_sample, loo, loo_error_pct, loo_basis, fits}}; points
    the fit could not use carry `reason`."""
    rows = load_published(path)
    gpus, models = load_gpus(), shapes.load_models()
    cands = candidates(rows, gpus, models)
    full = fit_terms(rows, gpus, models, choose(cands))
    points = cands[full.per_layer_ms.get(OVERHEAD_FAMILIES[0], 0.0)]
    by_id = {r["id"]: r for r in rows}
    uses = {p.id: "e_w" for p in points}
    uses.update({i: kind for (kind, _), t in full.terms.items() if len(t.ids) >= MIN_TERM_POINTS for i in t.ids})
    out = {}
    for p in points:
        if p.mem_bw is None:
            out[p.id] = {"reason": p.reason}
    for rid, kind in uses.items():
        if rid in out:
            continue
        r = by_id[rid]
        loo = fit_terms(rows, gpus, models, choose(cands, drop=rid), drop=rid)
        meas = float(r["measured"])
        dep = deployment_for(r, gpus, models, loo)
        basis = dep.efficiency()[1]
        if kind != "e_w":
            basis = f"{dep.term(kind)[1]}; {basis}"
        pred_loo = predict_published(r, gpus, models, loo)
        out[rid] = {"in_sample": predict_published(r, gpus, models, full), "loo": pred_loo, "fits": kind,
                    "loo_error_pct": 100.0 * (pred_loo - meas) / meas, "loo_basis": basis}
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
            r["fit_use"] = "fit" if got["fits"] == "e_w" else f"fit ({TERM_WORDS[got['fits']][0]})"
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
    terms = ["| term | for | value | points | published rows |", "|---|---|---:|---:|---|"]
    for t in table.terms.values():
        words, unit = TERM_WORDS[t.kind]
        used = "" if len(t.ids) >= MIN_TERM_POINTS else " (unused: < 2 points)"
        terms.append(f"| {words} | {t.key}{used} | {t.value:.3g} {unit} | {len(t.ids)} | {', '.join(t.ids)} |")
    lines = [f"Fitted per-layer cost: {', '.join(f'{f} {d:g} ms' for f, d in sorted(table.per_layer_ms.items()))}.", "",
             *terms, "",
             "| generation | family | precision | e_w | points | published rows |", "|---|---|---|---:|---:|---|"]
    for c in table.cells.values():
        gen = c.generation
        if c.generation == ALL_GENERATIONS:
            gen = "all (fallback)" if len(c.ids) >= MIN_POOLED_POINTS else "all (unused: < 2 points)"
        lines.append(f"| {gen} | {c.family} | {c.precision} | {c.mem_bw:.2f} | {len(c.ids)} | {', '.join(c.ids)} |")
    return "\n".join(lines)


def write_docs(table: FitTable, rows: Sequence[dict], path: str | Path) -> Path:
    """Rewrite docs/PLANNER.md's generated parts: the blocks between <!-- name:start --> and
    <!-- name:end --> (the fitted table, the published table) and the summary line after the latter."""
    p = Path(path)
    doc = p.read_text()
    for name, body in (("fit-table", fit_table_markdown(table)), ("published-table", published_table_markdown(rows))):
        start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
        doc = doc[:doc.index(start) + len(start)] + body + "\n" + doc[doc.index(end):]
    after = "<!-- published-table:end -->\n\n"
    a = doc.index(after) + len(after)
    doc = doc[:a] + summary_line(rows) + doc[doc.index("\n", a):]
    p.write_text(doc)
    return p
