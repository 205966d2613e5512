"""The planner against this machine's own load records: calibrate from them, then
predict each closed-loop point (`load --profile concurrent:C` against the lab's server) with the
same functions a plan uses, term by term, so a miss names the term that misses
(`python -m engine plan check load`).

Held out: each point is predicted by a model calibrated on the other records (leave one out), so the
check does not grade a fit on the very points that made it; with fewer than two other closed-loop points
it falls back to in-sample, and the row says which (`sample`). It tests the model's form (a measured decode
line, a measured prefill rate, the closed loop that serializes prefills with decode rounds) and its
interpolation between concurrencies on this machine, not the fit's transfer to other machines (that is the
published check).
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from engine.common.fields import L
from engine.planner import shapes
from engine.planner.calibration import LAB_SERVER, Calibration, calibrate, record_precision
from engine.planner.errors import PlanError
from engine.planner.gpus import load_gpus
from engine.planner.queueing import closed_loop_point
from engine.planner.roofline import Deployment

TOLERANCE = 0.25  # the bar: each point's output tok/s within 25%


def _closed_loop_points(records: Iterable[Mapping]) -> list[Mapping]:
    """Load records of the lab's server, without a draft, at a fixed concurrency (closed loop)."""
    out = []
    for r in records:
        cfg = r.get("config") or {}
        if (r.get("kind") == "load" and cfg.get("system") == LAB_SERVER and not cfg.get("draft")
                and (cfg.get("profile") or {}).get("kind") == "concurrent"
                and ((r.get("metrics") or {}).get("load") or {}).get(L.completed)):
            out.append(r)
    return out


def check_load(records: Sequence[Mapping], probe: Mapping | None = None,
               calibration: Calibration | None = None, held_out: bool = True) -> list[dict]:
    """One row per closed-loop load point of the lab's server: measured and predicted output tok/s,
    time to first token and inter-token latency, and the error of each."""
    points = _closed_loop_points(records)
    if not points:
        raise PlanError("records", "no closed-loop load record of the lab's server (run `python -m engine load "
                                   "--url <our server> --profile concurrent:C` at a few concurrencies)")
    here = load_gpus(probe=probe)["this machine"]
    rows = []
    for r in sorted(points, key=lambda r: (r["config"]["precision"] or "", r["config"]["profile"]["streams"])):
        others = [x for x in records if x is not r]
        out_of_sample = held_out and calibration is None and len(_closed_loop_points(others)) >= 2
        cal = calibration if calibration is not None else calibrate(others if out_of_sample else records)
        cfg, m = r["config"], r["metrics"]["load"]
        w = cfg.get("workload") or {}
        n = w.get("requests") or 1
        inp = max(1, round((w.get("prompt_tokens_total") or 0) / n))
        out = max(1, round((w.get("requested_output_tokens_total") or 0) / n))
        prec = record_precision(cfg)
        slots = (cfg.get("server") or {}).get("slots")
        dep = Deployment(shapes.get_model(cfg["model"]), here, prec, calibration=cal,
                         max_batch=int(slots) if slots else 256)
        c = int(cfg["profile"]["streams"])
        p = closed_loop_point(dep, c, inp, out)
        eff_src = dep.efficiency()[1]
        # What a client measures between tokens: the decode round plus the prefills of the other c - 1
        # users that land while it decodes, spread over its tokens (the closed loop's c * T_p + O * s).
        itl_client = p["itl_s"] + (p["effective_batch"] - 1) * p["prefill_s"] / max(1, out - 1)
        row = {"run_id": r.get("run_id"), "model": cfg["model"], "precision": prec, "concurrency": c,
               "input_tokens": inp, "output_tokens": out, "source": eff_src,
               "sample": "held out" if out_of_sample else "in-sample"}
        for name, pred, meas in (("output_tok_s", p.get("output_tok_s"), m.get(L.output_tok_s)),
                                 ("ttft_s", p.get("ttft_s"), m.get(L.ttft_s_p50)),
                                 ("itl_s", itl_client, m.get(L.itl_s_p50))):
            row[f"{name}_predicted"], row[f"{name}_measured"] = pred, meas
            row[f"{name}_error_pct"] = (100.0 * (pred - meas) / meas) if pred and meas else None
        e = row["output_tok_s_error_pct"]
        row["within"] = e is not None and abs(e) <= 100 * TOLERANCE
        row["misses"] = _missing_term(row)
        rows.append(row)
    return rows


def _missing_term(row: Mapping) -> str:
    """The model term further from its measurement: the prefill (time to first token) or the
    decode step (inter-token latency); '' when the point is within the tolerance."""
    if row["within"]:
        return ""
    t, i = row.get("ttft_s_error_pct"), row.get("itl_s_error_pct")
    cands = [(abs(v), name) for v, name in ((t, "prefill (time to first token)"),
                                            (i, "decode step (inter-token latency)")) if v is not None]
    return max(cands)[1] if cands else "unknown: the record lacks ttft_s_p50 and itl_s_p50"


def check_load_markdown(rows: Sequence[Mapping]) -> str:
    """The self-check table: predicted / measured and the error of each term."""
    lines = ["| model | precision | concurrency | output tok/s pred / meas | error | TTFT pred / meas (s) | error "
             "| ITL pred / meas (ms) | error | within 25% | term that misses | calibrated on |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]

    def pct(v):
        return "" if v is None else f"{v:+.0f}%"

    for r in rows:
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['concurrency']} | "
            f"{r['output_tok_s_predicted']:.1f} / {r['output_tok_s_measured']:.1f} | "
            f"{pct(r['output_tok_s_error_pct'])} | "
            f"{r['ttft_s_predicted']:.3f} / {r['ttft_s_measured'] or 0:.3f} | {pct(r['ttft_s_error_pct'])} | "
            f"{r['itl_s_predicted'] * 1e3:.1f} / {(r['itl_s_measured'] or 0) * 1e3:.1f} | "
            f"{pct(r['itl_s_error_pct'])} | "
            f"{'yes' if r['within'] else 'no'} | {r['misses']} | "
            f"{'the other records' if r['sample'] == 'held out' else 'all records, this point included'} |")
    return "\n".join(lines)
