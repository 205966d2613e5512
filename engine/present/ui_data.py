"""Data shaping for the dashboard's tables and charts: pure functions, no Streamlit, unit tested.

Everything a page draws comes from here or from the engine: memory breakdowns, KV cache bytes for
a context x batch grid, comparison rows with $/1M output tokens, the cost-vs-quality Pareto
frontier, % differences between two reports, acceptance by draft position, and the coloured
token stream of the speculative playground.
"""
from __future__ import annotations

import html
import math
from typing import Iterable, Mapping, Sequence

from engine.common.formulas import usd_per_million_tokens
from engine.common.errors import UserError

MB = 1e6

# ---------------------------------------------------------------- token origins (playground)

# origin -> (legend text, background colour). Origins come from generate/speculative traces.
ORIGINS: dict[str, tuple[str, str]] = {
    "target": ("target (no draft, or first token)", "#e9ecef"),
    "accepted": ("accepted draft token", "#b7e4c7"),
    "bonus": ("bonus token (all drafts accepted)", "#a5d8ff"),
    "resample": ("resampled by the target after a rejection", "#ffd8a8"),
}


def token_spans_html(pieces: Iterable[tuple[str, str]]) -> str:
    """(text, origin) pairs as escaped <span>s coloured by origin; unknown origins are grey."""
    out = []
    for text, origin in pieces:
        label, colour = ORIGINS.get(origin, (str(origin), "#dee2e6"))
        out.append(f'<span class="tok tok-{html.escape(str(origin))}" title="{html.escape(label)}" '
                   f'style="background:{colour};border-radius:3px;padding:0 1px">{html.escape(str(text))}</span>')
    return ('<div class="scl-stream" style="white-space:pre-wrap;font-family:monospace;line-height:1.7">'
            + "".join(out) + "</div>")


def legend_html() -> str:
    items = [f'<span style="background:{c};border-radius:3px;padding:1px 6px;margin-right:8px">{html.escape(t)}</span>'
             for t, c in ORIGINS.values()]
    return '<div class="scl-legend" style="font-size:0.85em">' + "".join(items) + "</div>"


def origin_counts(trace: Sequence[str]) -> dict[str, int]:
    out = {k: 0 for k in ORIGINS}
    for o in trace:
        out[o] = out.get(o, 0) + 1
    return out


# ---------------------------------------------------------------- memory

def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, context: int, batch: int,
                   bytes_per_value: int = 4) -> int:
    """K and V for every layer, kv head and slot: 2 * layers * kv_heads * head_dim * context * batch * bytes."""
    for name, v in (("context", context), ("batch", batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"{name} {v!r} is not a positive whole number", f"enter a {name} of at least 1")
    return 2 * num_layers * num_kv_heads * head_dim * context * batch * bytes_per_value


def kv_grid(num_layers: int, num_kv_heads: int, head_dim: int, contexts: Sequence[int], batches: Sequence[int],
            bytes_per_value: int = 4) -> list[dict]:
    """One row per (context, batch) with the KV cache size in bytes and MB."""
    rows = []
    for c in contexts:
        for b in batches:
            n = kv_cache_bytes(num_layers, num_kv_heads, head_dim, int(c), int(b), bytes_per_value)
            rows.append({"context": int(c), "batch": int(b), "kv_bytes": n, "kv_MB": round(n / MB, 2)})
    return rows


def activation_bytes(hidden: int, intermediate: int, vocab: int, num_heads: int, context: int, batch: int,
                     bytes_per_value: int = 4) -> int:
    """Estimated activation workspace of a prefill over `context` tokens (the overhead bar).

    hidden states and projections (4*hidden + 3*intermediate per token), the attention weights of
    one layer (heads * context^2, CPU attention materialises them with a mask) and the last
    position's fp32 logits. An estimate, labelled as such in the UI.
    """
    per_token = (4 * hidden + 3 * intermediate) * bytes_per_value
    attn = num_heads * context * context * bytes_per_value
    logits = vocab * 4
    return batch * (context * per_token + attn + logits)


LAYER_ORDER = ("embedding", "attention", "mlp", "norm", "head")


def memory_breakdown(weights: Mapping[str, int], kv_bytes: int, overhead_bytes: int) -> list[dict]:
    """Rows for the stacked memory bar: weights by layer type, then KV cache, then overhead."""
    rows = []
    keys = [k for k in LAYER_ORDER if k in weights] + sorted(k for k in weights if k not in LAYER_ORDER)
    total = sum(int(v) for v in weights.values()) + int(kv_bytes) + int(overhead_bytes)
    for k in keys:
        rows.append({"part": f"weights: {k}", "group": "weights", "bytes": int(weights[k])})
    rows.append({"part": "KV cache", "group": "kv cache", "bytes": int(kv_bytes)})
    rows.append({"part": "activations (estimate)", "group": "overhead", "bytes": int(overhead_bytes)})
    for r in rows:
        r["MB"] = round(r["bytes"] / MB, 2)
        r["share"] = (r["bytes"] / total) if total else 0.0
    return rows


# ---------------------------------------------------------------- comparison rows

def _num(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def comparison_row(rec, usd_per_hour: float) -> dict:
    """tables.row plus what the dashboard charts: memory, $/1M output tokens, quality loss."""
    from engine.present.tables import row

    r = row(rec)
    m = rec.metrics or {}
    q = m.get("quality") or {}
    tok_s = _num(m.get("decode_tok_s"))
    r["usd_per_1m_out"] = _round(usd_per_million_tokens(tok_s, usd_per_hour), 4)
    r["memory_MB"] = r.get("peak_rss_MB") if r.get("peak_rss_MB") is not None else r.get("weights_MB")
    # A draft (another model, or the target's own weights converted again) is a second copy in memory.
    w, draft_w = _num(m.get("weight_bytes")), _num(m.get("draft_weight_bytes"))
    r["weights_total_MB"] = None if w is None else round((w + (draft_w or 0)) / MB, 1)
    r["kv_MB"] = _round((_num(m.get("kv_bytes")) or 0) / MB, 2) if m.get("kv_bytes") is not None else None
    r["quality_loss_kl"] = _num(q.get("kl_mean"))
    r["top1_loss"] = None if _num(q.get("top1_agreement")) is None else round(1 - q["top1_agreement"], 4)
    r["created_at"] = rec.created_at
    return r


def comparison_rows(records: Iterable, usd_per_hour: float) -> list[dict]:
    return [comparison_row(r, usd_per_hour) for r in records]


def _round(x, n):
    return None if x is None else round(x, n)


# column, chart title, unit, better ("lower" | "higher")
CHARTS: list[tuple[str, str, str, str]] = [
    ("weights_total_MB", "Memory: weights (target + draft)", "MB", "lower"),
    ("peak_rss_MB", "Memory: peak process RSS", "MB", "lower"),
    ("ttft_ms", "Time to first token", "ms", "lower"),
    ("tok_ms_p50", "Per-token latency (median)", "ms", "lower"),
    ("tok_s", "Decode throughput", "tokens/s", "higher"),
    ("accept_rate", "Draft acceptance rate", "share", "higher"),
    ("quality_loss_kl", "Quality loss: KL(fp32 || config)", "nats/token", "lower"),
    ("usd_per_1m_out", "$ per 1M output tokens", "USD", "lower"),
]


def chart_series(rows: Sequence[dict], column: str) -> tuple[list[str], list[float | None]]:
    """Labels and values for one bar chart (rows without the metric keep a None gap)."""
    return [str(r.get("config")) for r in rows], [_num(r.get(column)) for r in rows]


def available_charts(rows: Sequence[dict]) -> list[tuple[str, str, str, str]]:
    """The charts with at least one value, and those without (as a second list of titles)."""
    return [c for c in CHARTS if any(_num(r.get(c[0])) is not None for r in rows)]


def missing_charts(rows: Sequence[dict]) -> list[str]:
    return [c[1] for c in CHARTS if not any(_num(r.get(c[0])) is not None for r in rows)]


# ---------------------------------------------------------------- Pareto frontier

def pareto_frontier(points: Sequence[Mapping], x: str, y: str) -> list[bool]:
    """Which points are on the frontier when both x and y are to be minimised (e.g. cost, quality loss).

    A point is on the frontier when no other point is at least as good on both and strictly
    better on one. Points missing either value are never on it.
    """
    vals = [(_num(p.get(x)), _num(p.get(y))) for p in points]
    out = []
    for i, (xi, yi) in enumerate(vals):
        if xi is None or yi is None:
            out.append(False)
            continue
        dominated = any(
            j != i and xj is not None and yj is not None and xj <= xi and yj <= yi and (xj < xi or yj < yi)
            for j, (xj, yj) in enumerate(vals)
        )
        out.append(not dominated)
    return out


def frontier_line(points: Sequence[Mapping], x: str, y: str) -> list[dict]:
    """Frontier points sorted by x, for drawing the step line."""
    flags = pareto_frontier(points, x, y)
    on = [p for p, f in zip(points, flags) if f]
    return sorted(on, key=lambda p: (_num(p.get(x)), _num(p.get(y))))


# ---------------------------------------------------------------- report differences

DIFF_METRICS: list[tuple[str, str]] = [
    ("tok_s", "higher"), ("ttft_ms", "lower"), ("tok_ms_p50", "lower"), ("weights_total_MB", "lower"),
    ("peak_rss_MB", "lower"), ("accept_rate", "higher"), ("quality_loss_kl", "lower"), ("usd_per_1m_out", "lower"),
]


def pct_diff(base, new) -> float | None:
    """(new - base) / |base| * 100; None when either is missing or base is 0."""
    b, n = _num(base), _num(new)
    if b is None or n is None or b == 0:
        return None
    return (n - b) / abs(b) * 100.0


def report_diff(base_rows: Sequence[Mapping], other_rows: Sequence[Mapping], key: str = "config",
                metrics: Sequence[tuple[str, str]] = DIFF_METRICS) -> list[dict]:
    """Match rows of two reports by `key` (the run label) and give % differences, base = first.

    Each output row: key, in_base, in_other, then per metric <m>_base, <m>_other, <m>_pct and
    <m>_better (True/False/None: whether the other report is better on that metric). Labels only
    in one report are listed with the other side empty. Duplicate labels are numbered (#2, #3...).
    """
    def keyed(rows):
        out, seen = {}, {}
        for r in rows:
            k = str(r.get(key))
            seen[k] = seen.get(k, 0) + 1
            out[k if seen[k] == 1 else f"{k} #{seen[k]}"] = r
        return out

    b, o = keyed(base_rows), keyed(other_rows)
    order = list(b) + [k for k in o if k not in b]
    rows = []
    for k in order:
        rb, ro = b.get(k), o.get(k)
        r = {key: k, "in_base": rb is not None, "in_other": ro is not None}
        for m, better in metrics:
            vb = _num(rb.get(m)) if rb else None
            vo = _num(ro.get(m)) if ro else None
            p = pct_diff(vb, vo)
            r[f"{m}_base"], r[f"{m}_other"], r[f"{m}_pct"] = vb, vo, None if p is None else round(p, 2)
            r[f"{m}_better"] = None if p is None or p == 0 else ((p > 0) == (better == "higher"))
        rows.append(r)
    return rows


def diff_table(diff_rows: Sequence[Mapping], key: str = "config",
               metrics: Sequence[tuple[str, str]] = DIFF_METRICS) -> list[dict]:
    """A compact view: one column per metric holding the % difference (None where not comparable)."""
    return [{key: r[key], **{f"{m} %": r.get(f"{m}_pct") for m, _ in metrics}} for r in diff_rows]


# ---------------------------------------------------------------- speculation

def acceptance_rows(spec: Mapping | None) -> list[dict]:
    """Per draft position (1-based): share accepted, and how often that position was proposed."""
    if not spec:
        return []
    rates = spec.get("position_rate") or []
    drafted = spec.get("position_drafted") or []
    return [{"position": i + 1, "acceptance": _num(r), "proposed": (drafted[i] if i < len(drafted) else None)}
            for i, r in enumerate(rates)]


def expected_length(a: float | None, gamma: float) -> float | None:
    """(1 - a^(g+1)) / (1 - a): tokens per target pass under i.i.d. acceptance (g + 1 at a = 1)."""
    a = _num(a)
    if a is None or gamma is None:
        return None
    if a >= 1.0:
        return gamma + 1.0
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)


def expected_length_curve(a: float | None, max_gamma: int = 16) -> list[dict]:
    if _num(a) is None:
        return []
    return [{"gamma": g, "expected_length": expected_length(a, g)} for g in range(1, max_gamma + 1)]


def spec_summary(rec) -> dict | None:
    """Measured vs theoretical acceptance length and the speedup over the same target, for the playground."""
    m = rec.metrics or {}
    s = m.get("spec")
    if not s:
        return None
    a = _num(s.get("acceptance_rate"))
    g = _num(s.get("mean_gamma")) or _num(s.get("gamma"))
    return {
        "acceptance_rate": a,
        "mean_acceptance_length": _num(s.get("mean_acceptance_length")),
        "theoretical_length": expected_length(a, g) if g is not None else None,
        "mean_gamma": g,
        "tok_s": _num(m.get("decode_tok_s")),
        "baseline_tok_s": _num(s.get("baseline_tok_s")),
        "speedup": _num(s.get("speedup")),
        "rounds": s.get("rounds"),
        "draft_s": _num(s.get("draft_s")),
        "verify_s": _num(s.get("verify_s")),
    }


# ---------------------------------------------------------------- runs picker

def run_choice_label(rec) -> str:
    return f"{rec.label} · {rec.created_at.replace('T', ' ')[:19]} · {rec.run_id}"


def eta_text(done: int, total: int, eta_s: float | None) -> str:
    if total <= 0:
        return "nothing to run"
    if done >= total:
        return f"{done}/{total} runs done"
    if eta_s is None:
        return f"{done}/{total} runs done, estimating time left after the first run"
    m, s = divmod(int(round(eta_s)), 60)
    left = f"{m} min {s:02d} s" if m else f"{s} s"
    return f"{done}/{total} runs done, about {left} left"


# ---------------------------------------------------------------- the answer, in words

def highlights(rows: Sequence[Mapping]) -> list[str]:
    """One-line answers: cheapest, fastest, smallest, most faithful, and the Pareto set."""
    out = []

    def best(col, lower=True):
        cand = [r for r in rows if _num(r.get(col)) is not None]
        if not cand:
            return None
        return (min if lower else max)(cand, key=lambda r: _num(r.get(col)))

    r = best("usd_per_1m_out")
    if r:
        out.append(f"Cheapest per output token: {r['config']} at ${r['usd_per_1m_out']:.4g} per 1M output tokens.")
    r = best("tok_s", lower=False)
    if r:
        out.append(f"Fastest decode: {r['config']} at {r['tok_s']:.3g} tokens/s.")
    r = best("weights_total_MB")
    if r:
        out.append(f"Least memory for weights: {r['config']} ({r['weights_total_MB']:.0f} MB).")
    q = [x for x in rows if _num(x.get("quality_loss_kl")) is not None]
    if q:
        nonref = [x for x in q if x.get("precision") not in ("fp32",)] or q
        r = min(nonref, key=lambda x: x["quality_loss_kl"])
        out.append(f"Closest to fp32 among reduced precisions: {r['config']} (KL {r['quality_loss_kl']:.3g}).")
        front = [x["config"] for x in frontier_line(rows, "usd_per_1m_out", "quality_loss_kl")]
        if front:
            out.append("Cost-vs-quality frontier (nothing is both cheaper and closer to fp32): "
                       + "; ".join(front) + ".")
    sp = [x for x in rows if _num(x.get("speedup")) is not None]
    for x in sp:
        out.append(f"Speculation: {x['config']} is {x['speedup']:.2f}x the same target without a draft "
                   f"(acceptance {x['accept_rate'] if x.get('accept_rate') is not None else 'n/a'}).")
    return out


# ---------------------------------------------------------------- figures (plotly, no Streamlit)

PALETTE = ["#4c6ef5", "#12b886", "#fab005", "#fa5252", "#7950f2", "#15aabf", "#82c91e", "#e64980"]


def _safe(s) -> str:
    """Labels pass through html.escape: plotly renders a few HTML tags in text, entities as characters."""
    return html.escape(str(s))


def _short(v) -> str:
    """Bar labels: 3 significant digits, thousands without exponents (2,520 not 2.52e+03)."""
    if v is None:
        return ""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def bar_figure(rows: Sequence[Mapping], column: str, title: str, unit: str, better: str = "lower"):
    import plotly.graph_objects as go

    labels, values = chart_series(rows, column)
    labels = [_safe(x) for x in labels]
    fig = go.Figure(go.Bar(
        x=labels, y=values, marker_color=[PALETTE[i % len(PALETTE)] for i in range(len(labels))],
        text=[_short(v) for v in values], textposition="auto",
        hovertemplate="%{x}<br>%{y:.4g} " + _safe(unit) + "<extra></extra>"))
    fig.update_layout(title=dict(text=f"{_safe(title)} <span style='font-size:11px'>({_safe(unit)}, "
                                      f"{'lower' if better == 'lower' else 'higher'} is better)</span>"),
                      margin=dict(l=40, r=10, t=50, b=90), height=340, showlegend=False,
                      xaxis=dict(tickangle=-25, automargin=True), yaxis=dict(title=_safe(unit)))
    return fig


def pareto_axes(rows: Sequence[Mapping]) -> tuple[str, str, str] | None:
    """(x, y, y title) for the cost frontier: cost vs quality loss when quality was measured, else cost vs memory."""
    has_cost = any(_num(r.get("usd_per_1m_out")) is not None for r in rows)
    if not has_cost:
        return None
    if any(_num(r.get("quality_loss_kl")) is not None for r in rows):
        return "usd_per_1m_out", "quality_loss_kl", "quality loss: KL(fp32 || config), nats/token"
    return "usd_per_1m_out", "weights_total_MB", "weights in memory, MB (quality not measured)"


def pareto_figure(rows: Sequence[Mapping]):
    """Cost vs quality loss scatter, frontier points marked and joined; None if there is no cost."""
    import plotly.graph_objects as go

    axes = pareto_axes(rows)
    if axes is None:
        return None
    x, y, ytitle = axes
    pts = [r for r in rows if _num(r.get(x)) is not None and _num(r.get(y)) is not None]
    if not pts:
        return None
    flags = pareto_frontier(pts, x, y)
    front = frontier_line(pts, x, y)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p[x] for p, f in zip(pts, flags) if not f], y=[p[y] for p, f in zip(pts, flags) if not f],
        text=[_safe(p["config"]) for p, f in zip(pts, flags) if not f], mode="markers", name="dominated",
        marker=dict(size=10, color="#adb5bd"), hovertemplate="%{text}<br>$%{x:.4g}/1M<br>%{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=[p[x] for p in front], y=[p[y] for p in front], text=[_safe(p["config"]) for p in front],
        mode="lines+markers+text", textposition="top center", name="Pareto frontier",
        line=dict(shape="hv", color="#e8590c"), marker=dict(size=13, color="#e8590c", symbol="star"),
        hovertemplate="%{text}<br>$%{x:.4g}/1M<br>%{y:.4g}<extra></extra>"))
    fig.update_layout(title="Cost vs quality: the frontier (lower-left is better)", height=380,
                      margin=dict(l=50, r=10, t=50, b=50),
                      xaxis=dict(title="$ per 1M output tokens"), yaxis=dict(title=_safe(ytitle)),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def memory_figure(breakdown: Sequence[Mapping], title: str = "Memory breakdown"):
    import plotly.graph_objects as go

    colours = {"weights": None, "kv cache": "#fa5252", "overhead": "#adb5bd"}
    weight_colours = ["#4c6ef5", "#12b886", "#fab005", "#7950f2", "#15aabf", "#82c91e", "#e64980"]
    fig = go.Figure()
    for i, r in enumerate(breakdown):
        c = colours.get(r["group"]) or weight_colours[i % len(weight_colours)]
        fig.add_trace(go.Bar(x=[r["MB"]], y=["memory"], orientation="h", name=_safe(r["part"]), marker_color=c,
                             hovertemplate=_safe(r["part"]) + ": %{x:.1f} MB<extra></extra>"))
    total = sum(r["MB"] for r in breakdown)
    fig.update_layout(barmode="stack", title=f"{_safe(title)}: {total:,.0f} MB", height=260,
                      margin=dict(l=10, r=10, t=50, b=40), xaxis=dict(title="MB"), yaxis=dict(visible=False),
                      legend=dict(orientation="h", y=-0.35))
    return fig


def kv_figure(grid: Sequence[Mapping]):
    import plotly.graph_objects as go

    fig = go.Figure()
    for b in sorted({r["batch"] for r in grid}):
        pts = [r for r in grid if r["batch"] == b]
        fig.add_trace(go.Scatter(x=[r["context"] for r in pts], y=[r["kv_MB"] for r in pts], mode="lines+markers",
                                 name=f"batch {b}"))
    fig.update_layout(title="KV cache by context and batch", height=320, margin=dict(l=50, r=10, t=50, b=40),
                      xaxis=dict(title="context (tokens)", type="log"), yaxis=dict(title="MB", type="log"))
    return fig


def acceptance_figure(rows: Sequence[Mapping]):
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=[r["position"] for r in rows], y=[r["acceptance"] for r in rows],
                           marker_color="#12b886", text=[f"{r['acceptance']:.0%}" if r["acceptance"] is not None
                                                         else "" for r in rows], textposition="auto"))
    fig.update_layout(title="Acceptance by draft position", height=300, margin=dict(l=40, r=10, t=50, b=40),
                      xaxis=dict(title="draft position", dtick=1), yaxis=dict(title="share accepted", range=[0, 1.05]))
    return fig


def expected_length_figure(a: float | None, measured: float | None, gamma: float | None, max_gamma: int = 16):
    import plotly.graph_objects as go

    curve = expected_length_curve(a, max_gamma)
    fig = go.Figure()
    if curve:
        fig.add_trace(go.Scatter(x=[c["gamma"] for c in curve], y=[c["expected_length"] for c in curve],
                                 mode="lines", name=f"theory (1-a^(g+1))/(1-a), a={a:.2f}"))
    if measured is not None and gamma is not None:
        fig.add_trace(go.Scatter(x=[gamma], y=[measured], mode="markers", name="measured",
                                 marker=dict(size=14, color="#e8590c", symbol="diamond")))
    fig.update_layout(title="Mean acceptance length vs gamma", height=300, margin=dict(l=40, r=10, t=50, b=40),
                      xaxis=dict(title="gamma (draft tokens per round)"),
                      yaxis=dict(title="tokens per target pass"), legend=dict(orientation="h", y=-0.3))
    return fig


# ---------------------------------------------------------------- hardware (the one helper with side effects)

def nvml_gpus() -> list[dict]:
    """GPUs NVML reports (name, memory, driver), even when torch is a CPU build; [] when none or no driver."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
        pynvml.nvmlInit()
    except Exception:
        return []
    out = []
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                        "memory_GB": round(mem.total / 1e9, 1), "used_GB": round(mem.used / 1e9, 1),
                        "driver": drv.decode() if isinstance(drv, bytes) else str(drv)})
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def machine_rows(facts: Mapping, bw_gbs: float | None, gpus: Sequence[Mapping], kernels: Mapping | None) -> list[dict]:
    """Label/value rows for the Home page's hardware box."""
    rows = [("CPU", facts.get("cpu_model")), ("SIMD level", facts.get("simd")),
            ("cores / torch threads", f"{facts.get('cores')} / {facts.get('torch_threads')}"),
            ("memory", f"{(facts.get('memory_bytes') or 0) / 2**30:.1f} GiB"),
            ("measured read bandwidth", f"{bw_gbs:.1f} GB/s" if bw_gbs else "not measured"),
            ("our CPU kernels", (kernels or {}).get("cpu", "unknown"))]
    if gpus:
        for g in gpus:
            rows.append((f"GPU {g['index']}", f"{g['name']}, {g['memory_GB']} GB, driver {g['driver']}"))
    elif facts.get("gpu_name"):
        rows.append(("GPU", facts["gpu_name"]))
    else:
        rows.append(("GPU", "none detected (runs use the CPU)"))
    rows.append(("OS", facts.get("os")))
    return [{"what": k, "value": "" if v is None else str(v)} for k, v in rows]


# ---------------------------------------------------------------- capacity from measured throughput

def capacity_rows(rows: Sequence[Mapping], usd_per_hour: float, tokens_per_day: float) -> list[dict]:
    """Machines like this one needed for `tokens_per_day` output tokens at each run's measured tokens/s.

    machines = ceil(tokens_per_day / (tok_s * 86400)); $/month = machines * $/hour * 730;
    $/1M output tokens assumes the machines are busy all the time (the floor on cost).
    """
    from engine.common.formulas import HOURS_PER_MONTH, check_price

    check_price(usd_per_hour)
    t = _num(tokens_per_day)
    if t is None or t <= 0:
        raise UserError(f"tokens per day {tokens_per_day!r} is not a positive number", "enter the output tokens "
                        "you need per day, e.g. 1000000")
    out = []
    for r in rows:
        tok_s = _num(r.get("tok_s"))
        per_day = tok_s * 86400 if tok_s else None
        machines = math.ceil(t / per_day) if per_day else None
        out.append({
            "config": r.get("config"), "tok_s": tok_s,
            "tokens_per_day_per_machine": None if per_day is None else round(per_day),
            "machines": machines,
            "usd_per_month": None if machines is None else round(machines * usd_per_hour * HOURS_PER_MONTH, 2),
            "usd_per_1m_out": _round(usd_per_million_tokens(tok_s, usd_per_hour), 4),
            "utilization": None if machines is None else round(t / (machines * per_day), 3),
        })
    return out


def plan_rows(plans: Sequence[Mapping], top: int | None = None) -> list[dict]:
    """Planner results (Plan.to_dict()) as table rows: feasible first as the planner sorted them."""
    rows = []
    for p in plans[:top] if top else plans:
        rows.append({
            "plan": p.get("label"), "feasible": p.get("feasible"), "gpus": p.get("gpus_total"),
            "usd_per_hr": _round(_num(p.get("usd_per_hr")), 2),
            "usd_per_month": _round(_num(p.get("usd_per_month")), 0),
            "usd_per_1m_out": _round(_num(p.get("usd_per_1m_output")), 4),
            "ttft_p90_ms": None if _num(p.get("ttft_p90_s")) is None else round(p["ttft_p90_s"] * 1e3, 1),
            "tpot_p90_ms": None if _num(p.get("tpot_p90_s")) is None else round(p["tpot_p90_s"] * 1e3, 2),
            "batch": _round(_num(p.get("batch")), 1), "utilization": _round(_num(p.get("utilization")), 3),
            "bound": p.get("bound"), "why_not": "; ".join(p.get("reasons") or []),
        })
    return rows
