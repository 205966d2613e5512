"""Speculation for the playground: acceptance by draft position, theory vs measured acceptance length."""
from __future__ import annotations

from typing import Mapping

from engine.common.formulas import expected_length
from engine.common.fields import M, S
from engine.present.columns import num as _num


def acceptance_rows(spec: Mapping | None) -> list[dict]:
    """Per draft position (1-based): share accepted, and how often that position was proposed."""
    if not spec:
        return []
    rates = spec.get(S.position_rate) or []
    drafted = spec.get(S.position_drafted) or []
    return [{"position": i + 1, "acceptance": _num(r), "proposed": (drafted[i] if i < len(drafted) else None)}
            for i, r in enumerate(rates)]


def expected_length_curve(a: float | None, max_gamma: int = 16) -> list[dict]:
    if _num(a) is None:
        return []
    return [{"gamma": g, "expected_length": expected_length(a, g)} for g in range(1, max_gamma + 1)]


def spec_summary(rec) -> dict | None:
    """Measured vs theoretical acceptance length and the speedup over the same target, for the playground."""
    m = rec.metrics or {}
    s = m.get(M.spec)
    if not s:
        return None
    a = _num(s.get(S.acceptance_rate))
    g = _num(s.get(S.mean_gamma)) or _num(s.get(S.gamma))
    return {
        S.acceptance_rate: a,
        S.mean_acceptance_length: _num(s.get(S.mean_acceptance_length)),
        "theoretical_length": expected_length(a, g) if g is not None else None,
        S.mean_gamma: g,
        "tok_s": _num(m.get(M.decode_tok_s)),
        S.baseline_tok_s: _num(s.get(S.baseline_tok_s)),
        S.speedup: _num(s.get(S.speedup)),
        S.rounds: s.get(S.rounds),
        S.draft_s: _num(s.get(S.draft_s)),
        S.verify_s: _num(s.get(S.verify_s)),
    }
