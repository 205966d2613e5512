"""The comparison columns: each names the record field it shows, its unit, its definition and how to draw it.

Every table the lab prints (CLI md/csv/json, the pages, the report HTML) and every bar chart is
driven by this list; units and definitions come from common.fields where the column shows a
record field as is (scaled), and are written here for the derived ones.

A column with an `interval` reads the 95% interval of its figure from the record's
metrics.intervals (measure/stats.py defines them): rows carry it as `<name>_lo` and `<name>_hi`,
tables show `median ± h` where h is the larger distance to either end, charts draw it as error bars.
The `category` view is the per-category table: the same columns read metrics.by_category[c].
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.common.formulas import usd_per_million_tokens
from engine.common import fields as F
from engine.common.fields import CAT, IV, M, N, QUALITY_AT, SPEC_AT, W
from engine.measure.stats import MIN_INTERVAL_REPS

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
    interval: Callable[[Any, float | None], tuple | None] | None = None  # (lo, hi) of the 95% interval
    fmt: str | None = None  # printf-style format where a page table shows more than the rounded number

    def value(self, rec, usd_per_hour: float | None = None):
        v = self.get(rec, usd_per_hour)
        return v if self.text else _round(v, self.digits)

    def bounds(self, rec, usd_per_hour: float | None = None) -> tuple:
        """(lo, hi) of the value's interval, rounded like the value; (None, None) without one."""
        b = self.interval(rec, usd_per_hour) if self.interval else None
        if not b:
            return None, None
        return _round(b[0], self.digits), _round(b[1], self.digits)


def _metric(path: str, scale: float = 1.0) -> Callable:
    def get(rec, _usd):
        v = num(F.get(rec.metrics or {}, path))
        return None if v is None else v * scale
    return get


def _interval_of(rec, path: str) -> dict | None:
    """metrics.intervals[path] of a record, when it is there."""
    ivs = (rec.metrics or {}).get(M.intervals)
    iv = ivs.get(path) if isinstance(ivs, dict) else None
    return iv if isinstance(iv, dict) else None


def _speed_spread(rec) -> str | None:
    iv = _interval_of(rec, M.decode_tok_s)
    if iv is None or num(iv.get(IV.n)) is None:
        return None
    n = int(iv[IV.n])
    if iv.get(IV.kind) == "range":
        return f"range of {n} reps"
    if iv.get(IV.kind) is None and n < MIN_INTERVAL_REPS:  # stored before ranges: a bootstrap of few draws
        return f"bootstrap of {n} reps (about their range)"
    return f"95% interval, {n} reps"


def _interval(path: str, scale: float = 1.0) -> Callable:
    """The record's interval of the metric at `path` (metrics.intervals[path]), times `scale`."""
    def get(rec, _usd):
        iv = _interval_of(rec, path)
        if iv is None:
            return None
        lo, hi = num(iv.get(IV.lo)), num(iv.get(IV.hi))
        return None if lo is None or hi is None else (lo * scale, hi * scale)
    return get


def metric_column(name: str, path: str, label: str, unit: str | None = None, scale: float = 1.0,
                  interval: bool = False, **kw) -> Column:
    """A record field shown as is (times `scale`): its definition comes from common.fields; with
    interval=True its 95% interval comes from metrics.intervals at the same path."""
    f = F.lookup(path)
    return Column(name, label, unit if unit is not None else f.unit, f.definition, _metric(path, scale),
                  interval=_interval(path, scale) if interval else None, **kw)


def _draft(rec) -> dict:
    return (rec.config or {}).get("draft") or {}


def _weights_total(rec, _usd):
    m = rec.metrics or {}
    w, d = num(m.get(M.weight_bytes)), num(m.get(M.draft_weight_bytes))
    return None if w is None else (w + (d or 0)) / MB


def _run_memory(rec, usd):
    w, kv = _weights_total(rec, usd), num((rec.metrics or {}).get(M.kv_bytes))
    return None if w is None else w + (kv or 0) / MB


def _usd_per_1m(rec, usd):
    if usd is None:
        return None
    return usd_per_million_tokens(num((rec.metrics or {}).get(M.decode_tok_s)), usd)


def _usd_interval(rec, usd):
    """Cost falls as tokens/s rises: the cost interval is the tok/s interval's ends, swapped."""
    b = _interval(M.decode_tok_s)(rec, usd)
    if usd is None or b is None or b[0] <= 0:
        return None
    return usd_per_million_tokens(b[1], usd), usd_per_million_tokens(b[0], usd)


def _noise(rec) -> dict | None:
    n = (rec.metrics or {}).get(M.noise)
    return n if isinstance(n, dict) and isinstance(n.get(N.noisy), bool) else None


def noise_label(rec) -> str | None:
    """'quiet', or '⚠ noisy: ' and which checks fired, in short; None without a noise check (peers, older runs)."""
    n = _noise(rec)
    if n is None:
        return None
    if not n[N.noisy]:
        return "quiet" if n.get(N.interval_checked) else "quiet (1 repetition: no interval)"
    lim = n.get(N.limits) if isinstance(n.get(N.limits), dict) else {}
    parts = []
    widths = n.get(N.interval_half_width) if isinstance(n.get(N.interval_half_width), dict) else {}
    for path, short in ((M.decode_tok_s, "tok/s"), (M.token_latency_ms_median, "ms/token")):
        w = num(widths.get(path))
        if w is not None and w > (num(lim.get("interval")) or 0.10):
            parts.append(f"{short} ±{w:.0%}")
    drop = num(n.get(N.probe_drop))
    if drop is not None and drop > (num(lim.get("probe_drop")) or 0.15):
        parts.append(f"bandwidth −{drop:.0%}")
    share = num(n.get(N.cpu_pressure_share))
    if share is not None and share > (num(lim.get("cpu_pressure")) or 0.25):
        parts.append(f"CPU waits {share:.0%}")
    if not parts:
        parts = [str(x) for x in n.get(N.reasons) or []][:2]
    return "⚠ noisy: " + ", ".join(parts)


def _workload(rec) -> str | None:
    w = (rec.metrics or {}).get(M.workload)
    if not isinstance(w, dict):
        return (rec.config or {}).get("workload")
    s = str(w.get(W.name) or "")
    if isinstance(w.get(W.reps), int):
        s += f" ×{w[W.reps]}"
    if w.get(W.skipped):
        s += f" ({w[W.skipped]} skipped)"
    return s or None


def _prompts(rec, _usd):
    m = rec.metrics or {}
    if isinstance(m.get(CAT.prompts), int):  # a category block
        return m[CAT.prompts]
    w = m.get(M.workload)
    return w.get(W.prompts) if isinstance(w, dict) else None


def _kernels(rec):
    k = rec.kernels or {}
    return k.get("cpu") if (rec.config or {}).get("device", "cpu") == "cpu" else k.get("cuda")


NOT_RECORDED = "—"  # a run recorded before the record said (old records open; the cell says so)


def family_label(rec) -> str:
    """The model family that ran (record.config.architecture.family), or '—' for a record without one."""
    arch = (rec.config or {}).get("architecture")
    fam = arch.get("family") if isinstance(arch, dict) else None
    return str(fam) if fam else NOT_RECORDED


def _on_cuda(rec) -> bool:
    return str((rec.config or {}).get("device") or "cpu").startswith("cuda")


def step_reasons(rec) -> list[tuple[str, int]]:
    """Why forward passes took the PyTorch path (record.kernels.reference_reasons), most frequent first."""
    reasons = (rec.kernels or {}).get("reference_reasons")
    if not isinstance(reasons, dict):
        return []
    counted = [(str(why), int(n)) for why, n in reasons.items() if num(n)]
    return sorted(counted, key=lambda x: -x[1])


def step_path(rec) -> str:
    """Which forward pass ran (record.kernels): the fused C++ step (the CUDA graph on a GPU), the PyTorch
    path and its most frequent reason, or both with their step counts; '—' for a record that did not count."""
    k = rec.kernels or {}
    fast, slow = num(k.get("fused_steps")), num(k.get("reference_steps"))
    if not fast and not slow:
        return NOT_RECORDED
    fast_name = "CUDA graph" if _on_cuda(rec) else "fused C++ step"
    reasons = step_reasons(rec)
    why = reasons[0][0] + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else "") if reasons else ""
    slow_text = "PyTorch" + (f": {why}" if why else "")
    if not slow:
        return fast_name
    if not fast:
        return slow_text
    return f"{fast_name} ×{fast:.0f}, PyTorch ×{slow:.0f}" + (f": {why}" if why else "")


def _machine(rec) -> str | None:
    """The kind of machine a record ran on: CPU model, plus the GPU where it ran on one (record.machine)."""
    m = getattr(rec, "machine", None) or {}
    cpu = m.get("cpu_model")
    gpu = m.get("gpu_name") if str((rec.config or {}).get("device", "")).startswith("cuda") else None
    parts = [str(x) for x in (cpu, gpu) if x]
    return " + ".join(parts) or None


def _text(fn):
    return lambda rec, _usd: fn(rec)


# The named views: each table the lab draws shows the columns whose `views` name it, in COLUMNS' order.
VIEWS = {
    "cli": "the CLI's tables, CSV and JSON (python -m engine runs/bench)",
    "page": "the dashboard's comparison table (Home, Compare, Reports)",
    "report": "the report's HTML table",
    "category": "the per-category table: the same columns read from metrics.by_category[c]",
    "detail": "one run's facts beside its result (the Playground's run)",
}
_ALL_AND_CATEGORY = frozenset({"cli", "page", "report", "category"})

COLUMNS: tuple[Column, ...] = (
    Column("config", "configuration", "", "model@precision, + draft kind@precision and gamma, b = batch",
           _text(lambda r: r.label), text=True, views=_ALL_AND_CATEGORY),
    Column("system", "system", "", "the system measured (this lab's engine, or a peer)",
           _text(lambda r: (r.config or {}).get("system") or "serving-cost-lab"), text=True,
           views=frozenset({"cli", "page"})),
    Column("model", "model", "", "catalog name or folder", _text(lambda r: (r.config or {}).get("model")),
           text=True, views=frozenset({"cli"})),
    Column("family", "family", "", "the model family that ran (record.config.architecture; docs/MODELS.md lists the "
           "families); — for a run recorded before records named it",
           _text(family_label), text=True, views=frozenset({"cli", "page", "report", "detail"})),
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
    Column("workload", "workload", "", "the prompts measured (category:count, engine.measure.workloads), × the "
           "repetitions of each; prompts too long for the context are skipped and counted",
           _text(_workload), text=True),
    Column("category", "category", "", "workload category ('all': every prompt of the run)",
           _text(lambda r: getattr(r, "category", None)), text=True, views=frozenset({"category"})),
    Column("prompts", "prompts", "", "prompts measured (each once per repetition)", _prompts, digits=None,
           views=frozenset({"category"})),
    metric_column("weights_MB", M.weight_bytes, "weights MB", "MB", 1 / MB, digits=1, views=frozenset({"cli"})),
    Column("weights_total_MB", "weights MB", "MB", "bytes of the target's weights plus the draft's (a second copy)",
           _weights_total, digits=1, better="lower", chart="Memory: weights (target + draft)",
           views=frozenset({"page", "report"})),
    Column("qlayers_vs_fp32", "quantized / fp32", "", F.lookup(M.quantized_layers).definition,
           lambda r, _u: num(((r.metrics or {}).get(M.quantized_layers) or {}).get("ratio")), digits=3,
           views=frozenset({"cli"})),
    metric_column("peak_rss_MB", M.peak_rss_bytes, "peak RSS MB (whole process)", "MB", 1 / MB, digits=1),
    metric_column("kv_MB", M.kv_bytes, "KV cache MB", "MB", 1 / MB, views=frozenset({"page"})),
    Column("run_memory_MB", "weights + KV MB", "MB", "this run's own memory: the target's and the draft's weights "
           "plus the KV caches it allocated (the process's peak RSS also counts every other model it holds)",
           _run_memory, digits=1, better="lower", chart="Memory: this run's weights + KV cache",
           views=frozenset({"page", "report"})),
    metric_column("ttft_ms", M.ttft_s, "TTFT ms", "ms", 1000.0, digits=1, better="lower",
                  chart="Time to first token", interval=True, views=_ALL_AND_CATEGORY),
    metric_column("tok_ms_p50", M.token_latency_ms_median, "ms/token p50", better="lower",
                  chart="Per-token latency (median)", interval=True),
    metric_column("tok_ms_p90", M.token_latency_ms_p90, "ms/token p90", views=frozenset({"cli", "page"})),
    metric_column("tok_s", M.decode_tok_s, "tokens/s", better="higher", chart="Decode throughput", interval=True,
                  views=_ALL_AND_CATEGORY),
    Column("noise", "noise", "", "the noise guard (engine/measure/noise.py): noisy when the tokens/s or "
           "per-token latency interval reaches beyond ±10% of the median, the bandwidth probe dropped more than "
           "15% between the run's start and end, or a task waited for a CPU during more than 25% of the run",
           _text(noise_label), text=True),
    Column("spread", "speed ±", "", "what a speed figure's ± is: a 95% bootstrap interval over repetitions (5 or "
           "more), or the range of the repetitions' own medians (fewer than 5; engine/measure/stats.py)",
           _text(_speed_spread), text=True, views=frozenset({"cli", "page", "report"})),
    Column("noisy", "noisy", "", "the noise guard's flag (true, false, or empty: not checked)",
           _text(lambda r: (_noise(r) or {}).get(N.noisy)), text=True, views=frozenset()),
    metric_column("bw_eff", M.bw_efficiency, "bandwidth efficiency", views=frozenset({"cli", "page"})),
    metric_column("accept_rate", SPEC_AT.acceptance_rate, "acceptance", "share", better="higher",
                  chart="Draft acceptance rate", interval=True, views=_ALL_AND_CATEGORY),
    metric_column("accept_rate_req", SPEC_AT.acceptance_rate_request_mean, "acceptance, per request", "share",
                  interval=True, views=frozenset({"page", "report", "category"})),
    metric_column("accept_len", SPEC_AT.mean_acceptance_length, "acceptance length", interval=True,
                  views=_ALL_AND_CATEGORY),
    metric_column("accept_len_req", SPEC_AT.mean_acceptance_length_request_mean, "acceptance length, per request",
                  interval=True, views=frozenset({"page", "report", "category"})),
    metric_column("expected_len", SPEC_AT.expected_length, "expected length", views=frozenset({"cli", "page"})),
    metric_column("speedup", SPEC_AT.speedup, "speedup", interval=True, views=_ALL_AND_CATEGORY),
    metric_column("quality_loss_kl", QUALITY_AT.kld_mean, "KL vs fp32", digits=5, better="lower", fmt="%.5f",
                  chart="Quality loss: KL(fp32 || config)"),
    metric_column("top1", QUALITY_AT.top1_agreement, "same top-1", digits=4),
    metric_column("ppl", QUALITY_AT.perplexity, "perplexity", digits=3),
    Column("usd_per_1m_out", "$/1M out, one stream", "USD",
           "$/hour / (decode tokens/s x 3600) x 1e6: the cost of output tokens from one stream at the measured "
           "batch size, the machine busy all the time (not cost under load)", _usd_per_1m, digits=4, better="lower",
           chart="$ per 1M output tokens, one stream at the measured batch size", views=frozenset({"page", "report"}),
           interval=_usd_interval, fmt="$%.4f"),
    Column("path", "step path", "", "the forward pass that ran: the fused C++ step (one call per step; the CUDA "
           "graph on a GPU), or the PyTorch path and why (the most frequent reason; step counts where both ran); "
           "— for a run recorded before records counted steps", _text(step_path), text=True,
           views=frozenset({"cli", "page", "detail"})),
    Column("kernels", "kernels", "", "the kernel path that ran (CPU ISA or CUDA)", _text(_kernels), text=True,
           views=frozenset({"cli", "page", "detail"})),
    Column("machine", "machine", "", "the kind of machine the run measured on (CPU model, and the GPU where it "
           "ran on one): across a Ray cluster, configurations may run on different machines", _text(_machine),
           text=True, views=frozenset()),
    Column("created_at", "measured at", "", "when the run was recorded (UTC)", _text(lambda r: r.created_at),
           text=True, views=frozenset({"page"})),
    Column("run", "run id", "", "the record's id in the store", _text(lambda r: r.run_id), text=True),
)

BY_NAME = {c.name: c for c in COLUMNS}
CHARTS = tuple(c for c in COLUMNS if c.chart)


def for_view(view: str) -> list[Column]:
    if view not in VIEWS:
        raise KeyError(f"no view '{view}': the views are {', '.join(VIEWS)}")
    return [c for c in COLUMNS if view in c.views]


PM_DEFINITION = ("± the larger distance from the median to an end of its 95% interval (speed: over repetitions; "
                 "acceptance: over prompts); with fewer than 5 repetitions a speed figure's ± reaches the lowest and "
                 "highest repetition instead, a range, not a 95% interval (the 'speed ±' column says which)")


@dataclass(frozen=True)
class Cell:
    """One column of a drawn table: the row key it shows, its label, its help text and format."""

    name: str
    label: str
    help: str
    fmt: str | None = None
    text: bool = False


def table_cells(view: str) -> list[Cell]:
    """A view as a page draws it: each column, followed by its ± (`<name>_pm`, rows.with_half_widths) where
    it has an interval. Labels, help (definition and unit) and formats all come from the columns above."""
    out = []
    for c in for_view(view):
        out.append(Cell(c.name, c.label, c.definition + (f" [{c.unit}]" if c.unit else ""), c.fmt, c.text))
        if c.interval is not None:
            out.append(Cell(f"{c.name}_pm", "±", PM_DEFINITION))
    return out


def plus_minus(value, lo, hi):
    """The ± of a value: the larger distance to either end of its interval (None without one)."""
    v, a, b = num(value), num(lo), num(hi)
    if v is None or a is None or b is None:
        return None
    return max(b - v, v - a, 0.0)


def display(col: Column, row: dict) -> str:
    """A row's cell as text: the value rounded, and '± h' when the row carries its interval."""
    v = row.get(col.name)
    if v is None:
        return ""
    if col.text or col.interval is None:
        return str(v)
    h = plus_minus(v, row.get(f"{col.name}_lo"), row.get(f"{col.name}_hi"))
    if h is None:
        return str(v)
    return f"{v} ± {_round(h, col.digits) if col.digits is not None else h}"


def definitions(names) -> list[tuple[str, str]]:
    """(label, definition with unit) for the named columns, in table order."""
    out = []
    for n in names:
        c = BY_NAME.get(n)
        if c is not None and not c.text:
            out.append((c.label, c.definition + (f" [{c.unit}]" if c.unit else "")))
    return out
