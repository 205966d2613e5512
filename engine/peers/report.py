"""Peer benchmark records as a table, target checks and a chart (bench/peers.py and the dashboard)."""
from __future__ import annotations

from engine.common.fields import M
from engine.peers.peer import OURS, token_agreement


def _tok_s(rec) -> float | None:
    v = (rec.metrics or {}).get(M.decode_tok_s)
    return float(v) if isinstance(v, (int, float)) else None


def _is(rec, system: str, precision: str | None = None, draft: str | None = None) -> bool:
    c = rec.config or {}
    d = (c.get("draft") or {}).get("kind") or "none"
    return c.get("system") == system and (precision is None or c.get("precision") == precision) and (
        draft is None or d == draft)


def _best(recs) -> tuple[object | None, float | None]:
    scored = [(r, _tok_s(r)) for r in recs if _tok_s(r) is not None]
    if not scored:
        return None, None
    return max(scored, key=lambda x: x[1])


def reference(records):
    """The transformers fp32 record without a draft: the token-agreement reference."""
    for r in records:
        if _is(r, "transformers", "fp32", "none") and _tok_s(r) is not None:
            return r
    return None


def peer_rows(records) -> list[dict]:
    """One row per system: speed, TTFT, memory, ratio to the best peer, agreement with transformers fp32."""
    best_peer, best_v = _best([r for r in records if (r.config or {}).get("system") != OURS])
    ref = reference(records)
    out = []
    for r in records:
        m, c = r.metrics or {}, r.config or {}
        v = _tok_s(r)
        spec = m.get("spec") or {}
        agree = token_agreement(r, ref) if ref is not None else None
        out.append({
            "system": c.get("system"),
            "config": r.label,
            "tok_s": None if v is None else round(v, 2),
            "ttft_ms": None if m.get("ttft_s") is None else round(1000 * m["ttft_s"], 1),
            "peak_rss_MB": None if m.get("peak_rss_bytes") is None else round(m["peak_rss_bytes"] / 1e6),
            "load_peak_MB": None if m.get("load_peak_rss_bytes") is None else round(m["load_peak_rss_bytes"] / 1e6),
            "peak_gpu_MB": None if m.get("peak_gpu_allocated_bytes") is None else
            round(m["peak_gpu_allocated_bytes"] / 1e6),
            "vs_best_peer": None if v is None or not best_v else round(v / best_v, 2),
            "accept_rate": None if spec.get("acceptance_rate") is None else round(spec["acceptance_rate"], 2),
            "same_tokens_as_hf_fp32": None if agree is None else f"{agree}/{m.get('new_tokens')}",
            "status": "ok" if v is not None else (r.notes or "no result"),
        })
    if best_peer is not None:
        for row in out:
            row["best_peer"] = best_peer.label
    return out


def targets(records) -> list[dict]:
    """The single-stream targets as measured ratios: ours vs llama.cpp Q4_K_M and vs transformers fp32
    (docs/BENCHMARKS.md, "targets")."""
    ours = [r for r in records if _is(r, OURS)]
    plain, _ = _best([r for r in ours if _is(r, OURS, draft="none")])
    spec, _ = _best([r for r in ours if not _is(r, OURS, draft="none")])
    llama = next((r for r in records if _is(r, "llama.cpp", "Q4_K_M", "none") and _tok_s(r)), None)
    hf32 = reference(records)
    rows = []
    for name, mine, peer, goal in (("best non-speculative vs llama.cpp Q4_K_M", plain, llama, 1.0),
                                   ("best speculative vs llama.cpp Q4_K_M", spec, llama, 1.5),
                                   ("best speculative vs transformers fp32", spec, hf32, 8.0)):
        ratio = _tok_s(mine) / _tok_s(peer) if mine is not None and peer is not None else None
        rows.append({"target": name, "ours": mine.label if mine is not None else None,
                     "peer": peer.label if peer is not None else None,
                     "ratio": None if ratio is None else round(ratio, 2), "goal": goal,
                     "met": None if ratio is None else ratio >= goal})
    return rows


SYSTEM_COLORS = {OURS: "#1f77b4", "transformers": "#ff7f0e", "llama.cpp": "#2ca02c"}


def peer_figure(rows: list[dict], title: str = "Decode tokens/s, same prompt and tokens, greedy"):
    """Horizontal bars of tokens/s per system (unavailable peers listed with their reason)."""
    import plotly.graph_objects as go

    ok = sorted([r for r in rows if r["tok_s"] is not None], key=lambda r: r["tok_s"])
    fig = go.Figure()
    for system in dict.fromkeys(r["system"] for r in ok):
        sel = [r for r in ok if r["system"] == system]
        fig.add_bar(y=[r["config"] for r in sel], x=[r["tok_s"] for r in sel], orientation="h", name=system,
                    marker_color=SYSTEM_COLORS.get(system),
                    text=[f"{r['tok_s']:.1f} ({r['vs_best_peer']:.2f}x best peer)" if r["vs_best_peer"] else
                          f"{r['tok_s']:.1f}" for r in sel], textposition="outside")
    missing = [r for r in rows if r["tok_s"] is None]
    note = "<br>".join(f"not measured: {r['config']}: {r['status'][:110]}" for r in missing)
    fig.update_layout(title=title, xaxis_title="tokens/s (median of the repetitions)",
                      yaxis={"categoryorder": "array", "categoryarray": [r["config"] for r in ok]},
                      height=160 + 28 * len(ok) + 18 * len(missing), margin={"l": 20, "r": 40, "t": 60, "b": 40},
                      legend={"orientation": "h", "y": -0.12 if not missing else -0.25})
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=-0.12, showarrow=False, align="left",
                           font={"size": 10})
    return fig
