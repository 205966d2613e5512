"""Plotly figures (no Streamlit): bars, the Pareto view, memory, KV cache, acceptance."""
from __future__ import annotations

import html
from typing import Mapping, Sequence

from engine.present.compare import chart_series, frontier_line, pareto_frontier
from engine.present.columns import num as _num
from engine.present.spec_view import expected_length_curve


PALETTE = ["#4c6ef5", "#12b886", "#fab005", "#fa5252", "#7950f2", "#15aabf", "#82c91e", "#e64980"]


def _safe(s) -> str:
    """Labels pass through html.escape: plotly renders a few HTML tags in text, entities as characters."""
    return html.escape(str(s))


def _short(v) -> str:
    """Bar labels: 3 significant digits, thousands without exponents (2,520 not 2.52e+03)."""
    if v is None:
        return ""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def error_bars(rows: Sequence[Mapping], column: str) -> dict | None:
    """Plotly error_y from the rows' `<column>_lo`/`_hi` (the 95% interval); None when no row has one."""
    up, down, any_ = [], [], False
    for r in rows:
        v, lo, hi = _num(r.get(column)), _num(r.get(f"{column}_lo")), _num(r.get(f"{column}_hi"))
        ok = v is not None and lo is not None and hi is not None
        any_ = any_ or ok
        up.append(max(hi - v, 0.0) if ok else 0.0)
        down.append(max(v - lo, 0.0) if ok else 0.0)
    if not any_:
        return None
    return dict(type="data", symmetric=False, array=up, arrayminus=down, color="#495057", thickness=1.5, width=6)


def bar_figure(rows: Sequence[Mapping], column: str, title: str, unit: str, better: str = "lower"):
    """One bar per row; the 95% interval as error bars, and ⚠ on the bars the noise guard flagged."""
    import plotly.graph_objects as go

    labels, values = chart_series(rows, column)
    labels = [_safe(x) for x in labels]
    err = error_bars(rows, column)
    flags = ["⚠ " if r.get("noisy") is True else "" for r in rows]
    fig = go.Figure(go.Bar(
        x=labels, y=values, marker_color=[PALETTE[i % len(PALETTE)] for i in range(len(labels))],
        text=[f + _short(v) if v is not None else "" for f, v in zip(flags, values)], textposition="auto",
        error_y=err,
        hovertemplate="%{x}<br>%{y:.4g} " + _safe(unit) + "<extra></extra>"))
    note = ", bars: 95% interval" if err else ""
    if any(flags):
        note += ", ⚠ noisy run"
    fig.update_layout(title=dict(text=f"{_safe(title)}<br><span style='font-size:11px'>({_safe(unit)}, "
                                      f"{'lower' if better == 'lower' else 'higher'} is better{note})</span>"),
                      margin=dict(l=40, r=10, t=64, b=90), height=350, showlegend=False,
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
                      xaxis=dict(title="$ per 1M output tokens, one stream at the measured batch size"),
                      yaxis=dict(title=_safe(ytitle)),
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


def bytes_quality_figure(points: Sequence[Mapping]):
    """Weight MB against median KLD (log), one marker symbol per method, the frontier joined; None without points."""
    import plotly.graph_objects as go

    if not points:
        return None
    symbols = ["circle", "diamond", "square", "triangle-up", "cross", "x", "pentagon", "hexagon", "star-square"]
    fig = go.Figure()
    for i, method in enumerate(dict.fromkeys(p["method"] for p in points)):
        pts = [p for p in points if p["method"] == method]
        fig.add_trace(go.Scatter(
            x=[p["weight_MB"] for p in pts], y=[p["kld_median"] for p in pts], text=[_safe(p["config"]) for p in pts],
            mode="markers", name=_safe(method), marker=dict(size=12, symbol=symbols[i % len(symbols)]),
            hovertemplate="%{text}<br>%{x:,.1f} MB<br>median KLD %{y:.3g}<extra></extra>"))
    front = [p for p in points if p.get("frontier")]
    fig.add_trace(go.Scatter(
        x=[p["weight_MB"] for p in front], y=[p["kld_median"] for p in front], mode="lines", name="frontier",
        line=dict(shape="hv", color="#e8590c", dash="dot"), hoverinfo="skip"))
    fig.update_layout(title="Quality against weight bytes, by method (lower-left is better)", height=380,
                      margin=dict(l=50, r=10, t=50, b=50), xaxis=dict(title="weights, MB"),
                      yaxis=dict(title="median KL(fp32 || config), nats/token", type="log"),
                      legend=dict(orientation="h", y=-0.2))
    return fig
