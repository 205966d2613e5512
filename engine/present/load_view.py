"""The load tables: each column declared once (columns.py's Column), rows from `load` records.

A load record's metrics live under metrics.load (common/fields.py LOAD); acceptance over the load
point, where the server's counters gave it, under metrics.spec.
"""
from __future__ import annotations

from engine.common import fields as F
from engine.common.fields import LOAD_AT, SPEC_AT, L, M
from engine.present.columns import Column, metric_column, num
from engine.present.load_cost import goodput_tok_s, kv_of, kv_text

MS = 1000.0


def _cfg(rec) -> dict:
    return rec.config or {}


def _text(fn):
    return lambda rec, _usd: fn(rec)


def _profile(rec) -> str | None:
    return (_cfg(rec).get("profile") or {}).get("label")


def _count(name: str, key: str, label: str) -> Column:
    """A count of metrics.load shown as a whole number (its definition from common.fields)."""
    def get(rec, _usd):
        v = num(((rec.metrics or {}).get(M.load) or {}).get(key))
        return None if v is None else int(v)
    f = F.lookup(f"{M.load}.{key}")
    return Column(name, label, f.unit, f.definition, get, digits=None)


LOAD_COLUMNS: tuple[Column, ...] = (
    Column("system", "system", "", "the server measured (launched by the lab, or a URL)",
           _text(lambda r: _cfg(r).get("label") or _cfg(r).get("system")), text=True),
    Column("profile", "load", "", "the load profile: synchronous, concurrent:N, throughput, constant:R/s, poisson:R/s",
           _text(_profile), text=True),
    _count("requests", L.requests, "requests"),
    _count("failed", L.failed, "failed"),
    metric_column("out_tok_s", LOAD_AT.output_tok_s, "output tok/s", digits=1, better="higher",
                  chart="Output throughput under load"),
    metric_column("req_s", LOAD_AT.request_s, "requests/s", digits=3),
    metric_column("goodput", LOAD_AT.goodput_req_s, "goodput req/s", digits=3, better="higher",
                  chart="Goodput (requests/s meeting every SLO)"),
    Column("goodput_tok_s", "goodput tok/s", "tokens/s", "output tokens/s of the requests that met every SLO (the "
           "goodput chart's figure; engine.present.load_cost.goodput_tok_s)", lambda r, _u: goodput_tok_s(r)[0],
           digits=1),
    metric_column("slo_share", LOAD_AT.slo_attainment, "met SLO", digits=2),
    metric_column("ttft_p50_ms", LOAD_AT.ttft_s_p50, "TTFT p50 ms", "ms", MS, digits=0),
    metric_column("ttft_p90_ms", LOAD_AT.ttft_s_p90, "TTFT p90 ms", "ms", MS, digits=0, better="lower",
                  chart="TTFT p90 under load"),
    metric_column("ttft_p99_ms", LOAD_AT.ttft_s_p99, "TTFT p99 ms", "ms", MS, digits=0),
    metric_column("itl_p50_ms", LOAD_AT.itl_s_p50, "ITL p50 ms", "ms", MS, digits=1),
    metric_column("itl_p90_ms", LOAD_AT.itl_s_p90, "ITL p90 ms", "ms", MS, digits=1, better="lower",
                  chart="Inter-token latency p90 under load"),
    metric_column("gap_p50_ms", LOAD_AT.gap_s_p50, "gap p50 ms", "ms", MS, digits=1),
    metric_column("gap_p99_ms", LOAD_AT.gap_s_p99, "gap p99 ms", "ms", MS, digits=1),
    metric_column("e2e_p50_s", LOAD_AT.e2e_s_p50, "e2e p50 s", digits=2),
    metric_column("e2e_p90_s", LOAD_AT.e2e_s_p90, "e2e p90 s", digits=2),
    metric_column("e2e_p99_s", LOAD_AT.e2e_s_p99, "e2e p99 s", digits=2),
    Column("prefix_hit", "prefix-cache hits", "share", "prompt tokens found in the server's prefix cache over "
           "those looked up during the point (vllm:prefix_cache_hits / vllm:prefix_cache_queries)",
           lambda r, _usd: (((r.metrics or {}).get(M.load) or {}).get("prefix_cache") or {}).get("hit_rate"), digits=2),
    Column("preempted", "preemptions", "", "sequences the server preempted during the point when its KV blocks ran "
           "out, to be recomputed later (vllm:num_preemptions_total)",
           lambda r, _usd: (((r.metrics or {}).get(M.load) or {}).get("prefix_cache") or {}).get("preemptions"),
           digits=None),
    Column("kv", "KV cache", "", "our server's KV cache as it said it: the dtype it stores, paged or slots, the "
           "budget and its blocks (--kv-dtype, --kv-cache, --kv-cache-gib)", _text(lambda r: kv_text(kv_of(r))),
           text=True),
    metric_column("accept_rate", SPEC_AT.acceptance_rate, "acceptance", "share", digits=3),
    metric_column("accept_len", SPEC_AT.mean_acceptance_length, "acceptance length", digits=2),
    Column("forced", "lengths forced", "", "whether every answer ran to the length it asked for (ignore_eos)",
           _text(lambda r: ((r.metrics or {}).get(M.load) or {}).get(L.lengths_forced)), text=True),
    Column("run", "run id", "", "the record's id in the store", _text(lambda r: r.run_id), text=True),
)

BY_NAME = {c.name: c for c in LOAD_COLUMNS}
CHARTS = tuple(c for c in LOAD_COLUMNS if c.chart)


def load_row(rec) -> dict:
    return {c.name: c.value(rec) for c in LOAD_COLUMNS}


def load_rows(records) -> list[dict]:
    """One row per load record, every load column (records of other kinds are skipped)."""
    return [load_row(r) for r in records if r.kind == "load"]


def load_columns(table: list[dict]) -> list[str]:
    """The columns that hold a value in at least one row, in declared order."""
    return [c.name for c in LOAD_COLUMNS if any(r.get(c.name) is not None for r in table)]


SPEC_CATEGORY_LABELS = {"system": "system", "load": "load", "category": "category", "requests": "requests",
                        "acceptance_rate": "acceptance", "mean_acceptance_length": "acceptance length",
                        "drafted": "draft tokens", "policies": "policy"}


def spec_category_rows(records) -> list[dict]:
    """Acceptance per workload category under load, one row per load point and category (metrics.load
    .spec_by_category: each answer's own speculative stats, pooled with vLLM's definitions)."""
    out = []
    for r in records:
        by_cat = ((r.metrics or {}).get(M.load) or {}).get(L.spec_by_category) or {}
        for cat, b in by_cat.items():
            out.append({"system": _cfg(r).get("label") or _cfg(r).get("system"), "load": _profile(r),
                        "category": cat, "requests": b.get("requests"), "acceptance_rate": b.get("acceptance_rate"),
                        "mean_acceptance_length": b.get("mean_acceptance_length"), "drafted": b.get("drafted"),
                        "policies": ", ".join(b.get("policies") or [])})
    return out


def column_labels(names) -> dict[str, str]:
    """The load table's column names -> their labels, with the unit where the label does not already say it."""
    out = {}
    for n in names:
        c = BY_NAME[n]
        said = c.unit in c.label or any(u in c.label for u in ("/s", " ms", " s", "MB"))
        out[n] = c.label + (f" ({c.unit})" if c.unit and not said else "")
    return out


def load_definitions(names) -> list[tuple[str, str]]:
    out = []
    for n in names:
        c = BY_NAME.get(n)
        if c is not None:
            out.append((c.label, c.definition + (f" [{c.unit}]" if c.unit else "")))
    return out


def _axis_title(axis: str) -> str:
    return "concurrent requests" if axis == "concurrency" else "offered load, requests/s"


def _series(records, key: str):
    """{configuration: (loads, values)} for one metrics.load key (or goodput_tok_s), ascending load."""
    from engine.present.load_cost import axis_of, configurations, goodput_tok_s, load_level

    axis = axis_of(records)
    out = {}
    for name, recs in configurations(records).items():
        pts = []
        for r in recs:
            m = (r.metrics or {}).get(M.load) or {}
            x = load_level(r, axis)
            if x is None or not m.get(L.completed):
                continue
            pts.append((x, goodput_tok_s(r)[0] if key == "goodput_tok_s" else m.get(key)))
        pts.sort(key=lambda p: p[0])
        if pts:
            out[name] = ([p[0] for p in pts], [p[1] for p in pts])
    return axis, out


def _log_x(fig, axis: str, **kw) -> None:
    if axis == "concurrency":
        fig.update_xaxes(title_text=_axis_title(axis), type="log", dtick=0.30103, **kw)
    else:
        fig.update_xaxes(title_text=_axis_title(axis), **kw)


def throughput_figure(records):
    """Throughput against latency as load rises: output tok/s, TTFT p90 and ITL p90 against the offered
    load (concurrency or request rate), one line per configuration (plotly)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from engine.present.figures import PALETTE, _safe

    # latencies in ms, as the load table shows them; every y axis from zero, so a gap is never magnified
    fig = make_subplots(rows=1, cols=3, subplot_titles=("output tokens/s (higher is better)",
                                                        "TTFT p90, ms (lower is better)",
                                                        "ITL p90, ms (lower is better)"))
    axis = "concurrency"
    for col, (key, scale) in enumerate(((L.output_tok_s, 1.0), (L.ttft_s_p90, MS), (L.itl_s_p90, MS)), start=1):
        axis, series = _series(records, key)
        for i, (name, (x, y)) in enumerate(series.items()):
            y = [None if v is None else v * scale for v in y]
            fig.add_trace(go.Scatter(x=x, y=y, name=_safe(name), mode="lines+markers", legendgroup=str(i),
                                     line=dict(color=PALETTE[i % len(PALETTE)]), showlegend=col == 1), row=1, col=col)
    _log_x(fig, axis)
    fig.update_yaxes(rangemode="tozero")
    slo = next((c.get("slo") for r in records if isinstance((c := r.config or {}).get("slo"), dict)), None)
    for col, k in ((2, "ttft"), (3, "itl")):  # the SLO the points were judged against, where it was recorded
        if slo and isinstance(slo.get(k), (int, float)):
            fig.add_hline(y=slo[k] * MS, line_dash="dash", line_color="#868e96", row=1, col=col,
                          annotation_text=f"SLO {slo[k] * MS:g} ms", annotation_position="top left")
    fig.update_layout(height=440, margin=dict(l=50, r=10, t=90, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


MARKERS = {"none": "circle", "ngram": "diamond", "suffix": "square", "model": "triangle-up", "self": "star"}


def tradeoff_figure(records):
    """InferenceMAX's view: output tokens/s of the whole server against tokens/s each user sees (1 / median ITL), one
    line per configuration through its loads, each point labelled with its load; colour by precision, marker by
    draft. Up and to the right is better: the frontier is what the server can trade between the two."""
    import plotly.graph_objects as go

    from engine.present.figures import PALETTE, _safe
    from engine.present.load_cost import _facts, configurations

    axis, itl = _series(records, L.itl_s_p50)      # the loads and figures each configuration completed
    _, out = _series(records, L.output_tok_s)
    precisions: dict[str, str] = {}
    fig = go.Figure()
    for name, recs in configurations(records).items():
        f = _facts(recs)
        colour = precisions.setdefault(f["precision"], PALETTE[len(precisions) % len(PALETTE)])
        loads = itl.get(name, ([], []))[0]
        pts = [(x, 1 / i, o) for x, i, o in zip(loads, itl[name][1], out[name][1]) if i and o] if loads else []
        if not pts:
            continue
        fig.add_trace(go.Scatter(x=[p[1] for p in pts], y=[p[2] for p in pts], mode="lines+markers+text",
                                 name=_safe(name), text=[f"{p[0]:g}" for p in pts], textposition="top center",
                                 line=dict(color=colour), marker=dict(size=10, color=colour,
                                                                      symbol=MARKERS.get(f["draft"] or "none", "x")),
                                 hovertemplate="%{x:.1f} tok/s per user, %{y:.1f} tok/s in all<extra>%{fullData.name}"
                                               "</extra>"))
    fig.update_layout(title=f"Output tokens/s of the server against tokens/s per user (labels: {_axis_title(axis)}; "
                            "colour: precision, marker: draft; up and right is better)",
                      height=460, margin=dict(l=50, r=10, t=60, b=50), legend=dict(orientation="h", y=-0.25),
                      xaxis=dict(title="tokens/s per user (1 / median inter-token latency)", rangemode="tozero"),
                      yaxis=dict(title="output tokens/s, all users", rangemode="tozero"))
    return fig


def goodput_figure(records):
    """Goodput per configuration: output tokens/s of the requests that met every SLO, at each load."""
    import plotly.graph_objects as go

    from engine.present.figures import PALETTE, _safe

    axis, series = _series(records, "goodput_tok_s")
    fig = go.Figure()
    for i, (name, (x, y)) in enumerate(series.items()):
        fig.add_trace(go.Bar(x=[f"{v:g}" for v in x], y=y, name=_safe(name), marker_color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(title="Goodput: output tokens/s of the requests that met every SLO (higher is better)",
                      barmode="group", height=420, margin=dict(l=50, r=10, t=60, b=50),
                      xaxis=dict(title=_axis_title(axis), type="category"),
                      yaxis=dict(title="goodput, output tokens/s", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def slo_cost_figure(costs):
    """$/1M output tokens at the SLO per configuration (engine.present.load_cost.SLOCost); a
    configuration with no point meeting the SLO has no bar and says so."""
    import plotly.graph_objects as go

    from engine.present.figures import _safe
    from engine.present.load_cost import INFEASIBLE

    names = [_safe(c.configuration) for c in costs]
    vals = [c.usd_per_1m_out for c in costs]
    text = [f"${v:.4g} at {c.axis} {c.point.load:g}" if v is not None else INFEASIBLE for c, v in zip(costs, vals)]
    fig = go.Figure(go.Bar(x=[v if v is not None else 0 for v in vals], y=names, orientation="h", text=text,
                           textposition="auto", marker_color=["#4c6ef5" if v is not None else "#adb5bd" for v in vals],
                           hovertemplate="%{y}<br>%{text}<extra></extra>"))
    fig.update_layout(title="$ per 1M output tokens at the SLO (goodput at the highest load meeting it; "
                            "lower is better)",
                      height=max(260, 70 + 48 * len(costs)), margin=dict(l=10, r=10, t=60, b=40),
                      xaxis=dict(title="USD per 1M output tokens"), yaxis=dict(automargin=True))
    return fig


def crossover_figure(crossovers):
    """Candidate / baseline of the crossover metric against load, one line per pair; above 1 the
    candidate (spec on, the smaller precision) leads; the marked load is where it stops paying."""
    import plotly.graph_objects as go

    from engine.present.figures import PALETTE, _safe
    from engine.present.load_cost import METRICS

    fig = go.Figure()
    axis, metric = "concurrency", "output_tok_s"
    for i, x in enumerate(crossovers):
        axis, metric = x.axis, x.metric
        colour = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(x=x.loads, y=x.ratios, mode="lines+markers", line=dict(color=colour),
                                 name=_safe(f"{x.candidate} / {x.baseline}")))
        if x.stops_paying_at is not None:
            j = x.loads.index(x.stops_paying_at)
            fig.add_trace(go.Scatter(x=[x.stops_paying_at], y=[x.ratios[j]], mode="markers", showlegend=False,
                                     marker=dict(symbol="x", size=14, color=colour),
                                     hovertext=_safe(x.verdict), hoverinfo="text"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="#868e96", annotation_text="no lead",
                  annotation_position="bottom right")
    label = METRICS[metric][2]
    fig.update_layout(title=f"Crossover: candidate / baseline {label} (above 1: the candidate leads; "
                            "x: it stops paying)",
                      height=440, margin=dict(l=50, r=10, t=60, b=50), yaxis=dict(title=f"ratio of {label}"),
                      legend=dict(orientation="h", y=-0.25))
    _log_x(fig, axis)
    return fig
