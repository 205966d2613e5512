"""Run records as rows: one flat dict per record, printed as markdown, csv or json (llama-bench style)."""
from __future__ import annotations

import csv
import io
import json


def _mb(x):
    return None if x is None else round(x / 1e6, 1)


def _r(x, n=2):
    return None if x is None else round(x, n)


def row(rec) -> dict:
    """The comparison columns every view shares."""
    m, c = rec.metrics, rec.config
    spec = m.get("spec") or {}
    q = m.get("quality") or {}
    draft = c.get("draft") or {}
    return {
        "run": rec.run_id,
        "config": rec.label,
        "system": c.get("system") or "serving-cost-lab",
        "model": c.get("model"),
        "precision": c.get("precision"),
        "draft": draft.get("kind") or "none",
        "draft_precision": draft.get("precision"),
        "gamma": draft.get("gamma"),
        "batch": c.get("batch_size", 1),
        "weights_MB": _mb(m.get("weight_bytes")),
        "qlayers_vs_fp32": _r((m.get("quantized_layers") or {}).get("ratio"), 3),
        "peak_rss_MB": _mb(m.get("peak_rss_bytes")),
        "ttft_ms": _r((m.get("ttft_s") or 0) * 1000, 1) if m.get("ttft_s") is not None else None,
        "tok_ms_p50": _r(m.get("token_latency_ms_median")),
        "tok_ms_p90": _r(m.get("token_latency_ms_p90")),
        "tok_s": _r(m.get("decode_tok_s")),
        "bw_eff": _r(m.get("bw_efficiency")),
        "accept_rate": _r(spec.get("acceptance_rate")),
        "accept_len": _r(spec.get("mean_acceptance_length")),
        "expected_len": _r(spec.get("expected_length")),
        "speedup": _r(spec.get("speedup")),
        "kl_mean": _r(q.get("kl_mean"), 5),
        "top1": _r(q.get("top1_agreement"), 4),
        "ppl": _r(q.get("perplexity"), 3),
        "kernels": (rec.kernels or {}).get("cpu") if c.get("device", "cpu") == "cpu" else (rec.kernels or {}).get("cuda"),
    }


def format_rows(rows: list[dict], fmt: str = "md", columns: list[str] | None = None) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=1)
    if not rows:
        return "(no runs)"
    cols = columns or [k for k in rows[0] if any(r.get(k) is not None for r in rows)]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()
    cell = lambda v: "" if v is None else str(v)  # noqa: E731
    widths = {c: max(len(c), *(len(cell(r.get(c))) for r in rows)) for c in cols}
    lines = ["| " + " | ".join(c.ljust(widths[c]) for c in cols) + " |",
             "| " + " | ".join("-" * widths[c] for c in cols) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(cell(r.get(c)).ljust(widths[c]) for c in cols) + " |")
    return "\n".join(lines)
