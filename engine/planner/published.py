"""The planner against published measurements: data/published_measurements.csv, recomputed with
the same functions the plans use (`python -m engine plan check published`; docs/PLANNER.md holds
the table and a test keeps it current). A row's `excluded` cell, when not empty, says why the fit
(planner.fit) does not use it; it is still predicted and shown.
"""
from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

from engine.common.fields import M
from engine.common.paths import DATA
from engine.planner import shapes
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU, find_gpu, load_gpus
from engine.planner.efficiency import FitTable
from engine.planner.queueing import closed_loop_point
from engine.planner.roofline import Deployment, decode_step, forward_cost, memory, prefill_step
from engine.planner.shapes import ModelShape

PUBLISHED_PATH = DATA / "published_measurements.csv"


def load_published(path: str | Path | None = None) -> list[dict]:
    with open(Path(path) if path else PUBLISHED_PATH, newline="") as f:
        return [r for r in csv.DictReader(f) if (r.get("id") or "").strip() and not r["id"].startswith("#")]


def excluded(row: Mapping) -> str:
    """Why the fit leaves this row out ('' = it may use it)."""
    return (row.get("excluded") or "").strip()


def deployment_for(row: Mapping, gpus: Mapping[str, GPU], models: Mapping[str, ModelShape],
                   fit: FitTable | None = None) -> Deployment:
    """The replica a published row measured: its GPU (with the row's overrides), model, precision,
    TP, kernel family and conditions."""
    g = find_gpu(row["gpu"], gpus)
    if g is None:
        raise PlanError("gpu", f"unknown GPU '{row['gpu']}' in published row {row.get('id')}")
    if (row.get("gpu_overrides") or "").strip():
        g = replace(g, **json.loads(row["gpu_overrides"]))
    m = shapes.get_model(row["model"], models)
    c = json.loads(row.get("condition") or "{}")
    return Deployment(m, g, row["precision"], int(row.get("tp") or 1), family=row.get("family") or "serving",
                      quantize_head=bool(c.get("quantize_head", False)), group_size=int(c.get("group_size", 64)),
                      kv_dtype=c.get("kv_dtype", "bf16"), mem_util=c.get("mem_util"), fit=fit)


def predict_published(row: Mapping, gpus: Mapping[str, GPU] | None = None,
                      models: Mapping[str, ModelShape] | None = None, fit: FitTable | None = None) -> float:
    """The planner's prediction for one published measurement (see data/published_measurements.csv);
    fit: the efficiency table to use (None: the shipped one)."""
    gpus = gpus if gpus is not None else load_gpus()
    models = models if models is not None else shapes.load_models()
    dep = deployment_for(row, gpus, models, fit)
    m = dep.model
    c = json.loads(row.get("condition") or "{}")
    metric = row["metric"]
    if metric == M.decode_tok_s:
        return 1.0 / decode_step(dep, c.get("batch", 1), c.get("context", 128)).total
    if metric == "itl_ms":
        cl = closed_loop_point(dep, c["concurrency"], c["input"], c["output"])
        return cl["itl_s"] * 1e3
    if metric == "output_tok_s":
        return closed_loop_point(dep, c["concurrency"], c["input"], c["output"])["output_tok_s"]
    if metric == "ttft_ms":
        return prefill_step(dep, c["input"]).total * 1e3
    if metric == "kv_cache_tokens":
        return memory(dep).kv_budget_tokens
    if metric == "spec_speedup":
        mal = float(c["mean_accepted"])
        ctx = c.get("context", 256)
        plain = decode_step(dep, 1, ctx).total
        verify = forward_cost(dep, m, dep.precision, 1, ctx, c.get("verify_tokens", 1)).total
        draft_t = 0.0
        if c.get("draft_model"):
            dm = shapes.get_model(c["draft_model"], models)
            draft_t = c.get("draft_steps", 1) * forward_cost(dep, dm, dep.precision, 1, ctx,
                                                             c.get("draft_tokens", 1)).total
        elif c.get("draft_cost_ratio") is not None:
            draft_t = c.get("draft_steps", 1) * c["draft_cost_ratio"] * plain
        return mal * plain / (verify + draft_t)
    raise PlanError("metric", f"unknown metric '{metric}' in published row {row.get('id')}")


def check_published(path: str | Path | None = None) -> list[dict]:
    """Recompute every prediction of data/published_measurements.csv: id, source, prediction,
    measurement, error % ((prediction - measured) / measured)."""
    gpus, models = load_gpus(), shapes.load_models()
    out = []
    for r in load_published(path):
        pred = predict_published(r, gpus, models)
        meas = float(r["measured"])
        out.append({"id": r["id"], "source": r["source"], "what": r["what"], "metric": r["metric"],
                    "unit": r.get("unit", ""), "predicted": pred, "measured": meas,
                    "error_pct": 100.0 * (pred - meas) / meas, "in_sample": r.get("in_sample", "no"),
                    "reference": r.get("reference", ""), "excluded": excluded(r)})
    return out


def published_table_markdown(rows: Sequence[dict]) -> str:
    """The docs table: one line per published measurement. Rows from fit.check_with_loo also carry
    their use by the fit and, for fitted points, the leave-one-out prediction and error."""
    lines = ["| id | measurement | source | predicted | measured | error | LOO predicted | LOO error | fit |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        loo = (f"{_fmt(r['loo'])} {r['unit']} | {r['loo_error_pct']:+.0f}%" if "loo" in r else "– | –")
        use = r.get("fit_use") or ("excluded" if r.get("excluded") else "check")
        lines.append(f"| {r['id']} | {r['what']} | {r['source']} | {_fmt(r['predicted'])} {r['unit']} | "
                     f"{_fmt(r['measured'])} {r['unit']} | {r['error_pct']:+.0f}% | {loo} | {use} |")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"
