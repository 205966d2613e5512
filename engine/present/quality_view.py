"""Quality against fp32 for people: llama.cpp's printout and a compact table, overall and per category.

Reads the dicts engine.measure.quality.evaluate returns (and the llama.cpp peer's, which has the
same keys); never runs a model. Probabilities are shown in % as llama.cpp prints them.
"""
from __future__ import annotations

from engine.common.fields import QC, Q
from engine.common.record_setup import calibration_suffix, setup_from_record
from engine.common.vocab import canonical_model_name
from engine.present.accuracy_view import OURS, PEER_ENGINE
from engine.present.columns import num as _num
from engine.present.compare import pareto_frontier

SCOPES = ("overall", "chat", "code")


def _pm(v, err, digits: int = 6, scale: float = 1.0, unit: str = "") -> str:
    v, err = _num(v), _num(err)
    if v is None:
        return "–"
    s = f"{v * scale:.{digits}f}"
    return s + (f" ± {err * scale:.{digits}f}" if err is not None else "") + unit


def _one(v, digits: int = 6, scale: float = 1.0, unit: str = "") -> str:
    v = _num(v)
    return "–" if v is None else f"{v * scale:.{digits}f}{unit}"


def scopes(q: dict) -> dict[str, dict]:
    """{'overall': q, 'chat': ..., 'code': ...}: the statistics of each scope present."""
    out = {"overall": q}
    out.update({c: s for c, s in (q.get(Q.by_category) or {}).items() if s and s.get(Q.tokens)})
    return out


# llama.cpp's labels (tools/perplexity), each with how to show it from a statistics dict
LLAMA_LINES = (
    ("Mean PPL(Q)", lambda s: _pm(s.get(Q.perplexity), s.get(Q.perplexity_err))),
    ("Mean PPL(base)", lambda s: _pm(s.get(Q.ref_perplexity), s.get(Q.ref_perplexity_err))),
    ("Mean ln(PPL(Q)/PPL(base))", lambda s: _pm(s.get(Q.ln_ppl_ratio), s.get(Q.ln_ppl_ratio_err))),
    ("Mean PPL(Q)/PPL(base)", lambda s: _pm(s.get(Q.ppl_ratio), s.get(Q.ppl_ratio_err))),
    ("Mean    KLD", lambda s: _pm(s.get(Q.kld_mean), s.get(Q.kld_mean_err))),
    ("Maximum KLD", lambda s: _one(s.get(Q.kld_max))),
    ("99.9%   KLD", lambda s: _one(s.get(Q.kld_p999))),
    ("99.0%   KLD", lambda s: _one(s.get(Q.kld_p99))),
    ("95.0%   KLD", lambda s: _one(s.get(Q.kld_p95))),
    ("90.0%   KLD", lambda s: _one(s.get(Q.kld_p90))),
    ("Median  KLD", lambda s: _one(s.get(Q.kld_median))),
    ("Mean    Δp", lambda s: _pm(s.get(Q.delta_p_mean), s.get(Q.delta_p_err), 3, 100, " %")),
    ("RMS Δp", lambda s: _pm(s.get(Q.delta_p_rms), s.get(Q.delta_p_rms_err), 3, 100, " %")),
    ("Same top p", lambda s: _pm(s.get(Q.top1_agreement), s.get(Q.top1_err), 3, 100, " %")),
)


def heading(label: str, q: dict) -> str:
    """'label: 8,192 tokens (chat 4,096 in 16 documents, code 4,096 in 22)'."""
    parts = [f"{c} {s[Q.tokens]:,} in {s.get(QC.documents, '?')} document{'' if s.get(QC.documents) == 1 else 's'}"
             for c, s in scopes(q).items() if c != "overall"]
    return f"{label}: {q.get(Q.tokens, 0):,} tokens" + (f" ({', '.join(parts)})" if parts else "")


def llama_style(label: str, q: dict) -> str:
    """llama.cpp's `--kl-divergence` summary, one column per scope (overall, then each category)."""
    sc = scopes(q)
    cells = [[name] + [fmt(s) for s in sc.values()] for name, fmt in LLAMA_LINES]
    head = [""] + list(sc)
    widths = [max(len(r[i]) for r in cells + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])  # noqa: E731
                               for i, c in enumerate(r)).rstrip()
    return "\n".join([f"====== {heading(label, q)} ======", line(head)] + [line(r) for r in cells])


def table_rows(results: list[tuple[str, dict]]) -> list[dict]:
    """One row per configuration and scope: mean KLD ± err, percentiles, max, same top-1, RMS Δp, PPL ratio."""
    rows = []
    for label, q in results:
        for scope, s in scopes(q).items():
            rows.append({
                "config": label, "scope": scope, "tokens": s.get(Q.tokens),
                "mean KLD": _pm(s.get(Q.kld_mean), s.get(Q.kld_mean_err), 5),
                "median": _one(s.get(Q.kld_median), 5), "p90": _one(s.get(Q.kld_p90), 4),
                "p95": _one(s.get(Q.kld_p95), 4), "p99": _one(s.get(Q.kld_p99), 4),
                "p99.9": _one(s.get(Q.kld_p999), 3), "max": _one(s.get(Q.kld_max), 3),
                "same top-1": _pm(s.get(Q.top1_agreement), s.get(Q.top1_err), 2, 100, " %"),
                "RMS Δp": _pm(s.get(Q.delta_p_rms), s.get(Q.delta_p_rms_err), 2, 100, " %"),
                "PPL ratio": _pm(s.get(Q.ppl_ratio), s.get(Q.ppl_ratio_err), 4),
            })
    return rows


def unavailable_line(q: dict) -> str | None:
    """Why a peer has no numbers ('unavailable: …' or 'failed: …'), or None when it has them."""
    for k in ("unavailable", "failed"):
        if q.get(k):
            return f"{q.get('label', 'peer')}: {k}: {q[k]}"
    return None


def _kind(rec) -> tuple[str, str, str]:
    """(model, method, label) of a quality record: our int4 by how its grid was chosen (rtn, gptq, awq,
    gptq-mixed, gguf, checkpoint), our other precisions by name, a peer by its engine and type."""
    c = rec.config or {}
    if c.get("system") not in OURS:
        engine = PEER_ENGINE.get(str(c.get("system")), str(c.get("system")))
        return canonical_model_name(c.get("model") or ""), engine, f"{engine} {c.get('precision')}"
    s = setup_from_record(c)
    method = f"int4 {s.method}" if s.precision == "int4" else s.precision
    return canonical_model_name(s.model), method, s.precision_label + calibration_suffix(c)


def bytes_points(records, model: str) -> tuple[list[dict], list[str]]:
    """The quality-against-bytes points of `model` from stored quality records (newest first, as the store lists
    them): one per configuration, its newest record, all scored on one eval text (the text most configurations
    share; KLDs on different texts are not comparable). Each point: config, method, weight_MB, the KLD statistics,
    same top-1 and whether it is on the frontier (no other point has fewer bytes and a lower median KLD).
    Also says which configurations were left out, and why."""
    want = canonical_model_name(model)
    newest: dict[tuple, tuple] = {}
    for r in records:
        q = (r.metrics or {}).get("quality")
        if r.kind != "quality" or not q or q.get(Q.kld_median) is None:
            continue
        name, method, label = _kind(r)
        if name == want:
            newest.setdefault((label, q.get(Q.eval_fingerprint)), (method, q, (r.metrics or {}).get("weight_bytes")))
    by_text: dict = {}
    for (label, text), v in newest.items():
        by_text.setdefault(text, {})[label] = v
    if not by_text:
        return [], []
    text = max(by_text, key=lambda t: len(by_text[t]))  # dicts keep the store's order: a tie goes to the newest
    left_out = sorted(f"{label}: scored on another eval text" for t, rows in by_text.items() if t != text
                      for label in rows if label not in by_text[text])
    points = []
    for label, (method, q, wb) in by_text[text].items():
        if not wb:
            left_out.append(f"{label}: its record has no weight bytes")
            continue
        points.append({"config": label, "method": method, "weight_MB": wb / 1e6, "tokens": q.get(Q.tokens),
                       "kld_median": q[Q.kld_median], "kld_mean": q.get(Q.kld_mean), "kld_p99": q.get(Q.kld_p99),
                       "top1_agreement": q.get(Q.top1_agreement)})
    for p, front in zip(points, pareto_frontier(points, "weight_MB", "kld_median")):
        p["frontier"] = front
    return sorted(points, key=lambda p: p["weight_MB"]), left_out
