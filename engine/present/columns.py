"""The comparison columns: each names the record field it shows, its unit, its definition and how to draw it.

Every table the lab prints (CLI md/csv/json, the pages, the report HTML) and every bar chart is
driven by this list; units and definitions come from measure.fields where the column shows a
record field as is (scaled), and are written here for the derived ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.common.formulas import usd_per_million_tokens
from engine.measure import fields as F

MB = 1e6


def num(x) -> float | None:
    """x as a float when it is a finite number (never a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _round(x, digits):
    x = num(x) if not isinstance(x, int) or isinstance(x, bool) else x
    if x is None or digits is None:
        return x
    return round(x, digits)


@dataclass(frozen=True)
class Column:
    """One column: `get(record, usd_per_hour)` returns its raw value; `digits` rounds it for display."""

    name: str
    label: str
    unit: str
    definition: str
    get: Callable[[Any, float | None], Any]
    digits: int | None = 2
    better: str | None = None  # "lower" | "higher": charts and highlights
    chart: str | None = None  # bar-chart title, when the column is charted
    views: frozenset = field(default_factory=lambda: frozenset({"cli", "page", "report"}))
    text: bool = False  # left-aligned text rather than a number

    def value(self, rec, usd_per_hour: float | None = None):
        v = self.get(rec, usd_per_hour)
        return v if self.text else _round(v, self.digits)


def _metric(path: str, scale: float = 1.0) -> Callable:
    def get(rec, _usd):
        v = num(F.get(rec.metrics or {}, path))
        return None if v is None else v * scale
    return get


def metric_column(name: str, path: str, label: str, unit: str | None = None, scale: float = 1.0, **kw) -> Column:
    """A record field shown as is (times `scale`): its definition comes from measure.fields."""
    f = F.lookup(path)
    return Column(name, label, unit if unit is not None else f.unit, f.definition, _metric(path, scale), **kw)


def _draft(rec) -> dict:
    return (rec.config or {}).get("draft") or {}


def _weights_total(rec, _usd):
    m = rec.metrics or {}
    w, d = num(m.get("weight_bytes")), num(m.get("draft_weight_bytes"))
    return None if w is None else (w + (d or 0)) / MB


def _usd_per_1m(rec, usd):
    if usd is None:
        return None
    return usd_per_million_tokens(num((rec.metrics or {}).get("decode_tok_s")), usd)


def _kernels(rec):
    k = rec.kernels or {}
    return k.get("cpu") if (rec.config or {}).get("device", "cpu") == "cpu" else k.get("cuda")


def _text(fn):
    return lambda rec, _usd: fn(rec)


COLUMNS: tuple[Column, ...] = (
    Column("config", "configuration", "", "model@precision, + draft kind@precision and gamma, b = batch",
           _text(lambda r: r.label), text=True),
    Column("system", "system", "", "the system measured (this lab's engine, or a peer)",
           _text(lambda r: (r.config or {}).get("system") or "serving-cost-lab"), text=True,
           views=frozenset({"cli", "page"})),
    Column("model", "model", "", "catalog name or folder", _text(lambda r: (r.config or {}).get("model")),
           text=True, views=frozenset({"cli"})),
    Column("precision", "precision", "", "target precision", _text(lambda r: (r.config or {}).get("precision")),
           text=True),
    Column("draft", "draft", "", "draft kind: none, model, self or ngram",
           _text(lambda r: _draft(r).get("kind") or "none"), text=True),
    Column("draft_precision", "draft precision", "", "the draft's precision",
           _text(lambda r: _draft(r).get("precision")), text=True),
    Column("gamma", "gamma", "tokens", "largest number of draft tokens per round",
           lambda r, _u: _draft(r).get("gamma"), digits=None),
    Column("batch", "batch", "sequences", "sequences decoded together",
           lambda r, _u: (r.config or {}).get("batch_size", 1), digits=None),
    metric_column("weights_MB", "weight_bytes", "weights MB", "MB", 1 / MB, digits=1, views=frozenset({"cli"})),
    Column("weights_total_MB", "weights MB", "MB", "bytes of the target's weights plus the draft's (a second copy)",
           _weights_total, digits=1, better="lower", chart="Memory: weights (target + draft)",
           views=frozenset({"page", "report"})),
    Column("qlayers_vs_fp32", "quantized / fp32", "", F.lookup("quantized_layers").definition,
           lambda r, _u: num(((r.metrics or {}).get("quantized_layers") or {}).get("ratio")), digits=3,
           views=frozenset({"cli"})),
    metric_column("peak_rss_MB", "peak_rss_bytes", "peak RSS MB", "MB", 1 / MB, digits=1, better="lower",
                  chart="Memory: peak process RSS"),
    metric_column("kv_MB", "kv_bytes", "KV cache MB", "MB", 1 / MB, views=frozenset({"page"})),
    metric_column("ttft_ms", "ttft_s", "TTFT ms", "ms", 1000.0, digits=1, better="lower",
                  chart="Time to first token"),
    metric_column("tok_ms_p50", "token_latency_ms_median", "ms/token p50", better="lower",
                  chart="Per-token latency (median)"),
    metric_column("tok_ms_p90", "token_latency_ms_p90", "ms/token p90", views=frozenset({"cli", "page"})),
    metric_column("tok_s", "decode_tok_s", "tokens/s", better="higher", chart="Decode throughput"),
    metric_column("bw_eff", "bw_efficiency", "bandwidth efficiency", views=frozenset({"cli", "page"})),
    metric_column("accept_rate", "spec.acceptance_rate", "acceptance", "share", better="higher",
                  chart="Draft acceptance rate"),
    metric_column("accept_len", "spec.mean_acceptance_length", "acceptance length"),
    metric_column("expected_len", "spec.expected_length", "expected length", views=frozenset({"cli", "page"})),
    metric_column("speedup", "spec.speedup", "speedup"),
    metric_column("quality_loss_kl", "quality.kl_mean", "KL vs fp32", digits=5, better="lower",
                  chart="Quality loss: KL(fp32 || config)"),
    metric_column("top1", "quality.top1_agreement", "same top-1", digits=4),
    metric_column("ppl", "quality.perplexity", "perplexity", digits=3),
    Column("usd_per_1m_out", "$/1M out, one stream", "USD",
           "$/hour / (decode tokens/s x 3600) x 1e6: the cost of output tokens from one stream at the measured "
           "batch size, the machine busy all the time (not cost under load)", _usd_per_1m, digits=4, better="lower",
           chart="$ per 1M output tokens (one stream at the measured batch)", views=frozenset({"page", "report"})),
    Column("kernels", "kernels", "", "the kernel path that ran (CPU ISA or CUDA)", _text(_kernels), text=True,
           views=frozenset({"cli", "page"})),
    Column("created_at", "measured at", "", "when the run was recorded (UTC)", _text(lambda r: r.created_at),
           text=True, views=frozenset({"page"})),
    Column("run", "run id", "", "the record's id in the store", _text(lambda r: r.run_id), text=True),
)

BY_NAME = {c.name: c for c in COLUMNS}
CHARTS = tuple(c for c in COLUMNS if c.chart)


def for_view(view: str) -> list[Column]:
    return [c for c in COLUMNS if view in c.views]


def definitions(names) -> list[tuple[str, str]]:
    """(label, definition with unit) for the named columns, in table order."""
    out = []
    for n in names:
        c = BY_NAME.get(n)
        if c is not None and not c.text:
            out.append((c.label, c.definition + (f" [{c.unit}]" if c.unit else "")))
    return out
