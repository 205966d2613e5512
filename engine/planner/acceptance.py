"""Acceptance in closed form: tokens per target step from the per-token acceptance rate, its
inverse, its variance, the speedup it buys, and the name of a target/draft pair.

A leaf: the planner's speculation (plans) and calibration (lab measurements) both read it, and it
reads neither.
"""
from __future__ import annotations

from engine.common.formulas import expected_length
from engine.planner.errors import PlanError


def expected_tokens_per_step(a: float, gamma: float) -> float:
    """E = (1 - a^(g+1)) / (1 - a): tokens per target step with per-token acceptance a (i.i.d.),
    counting the bonus/resampled token (Leviathan et al. 2023, eq. 1). a=1 gives g+1."""
    # The planner's own check first: its PlanError names the field (NaN fails it too).
    if not 0 <= a <= 1:
        raise PlanError("acceptance_rate", f"{a} is outside [0, 1]")
    return expected_length(a, gamma)


def acceptance_from_mean_length(mean_len: float, gamma: float) -> float:
    """Invert E(a, g) for a (bisection; E is increasing in a)."""
    if mean_len <= 1:
        return 0.0
    if mean_len >= gamma + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, gamma) < mean_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def tokens_per_step_variance(a: float, gamma: int) -> float:
    """Variance of tokens emitted per step: P(X=k) = a^(k-1)(1-a) for k <= g, P(X=g+1) = a^g."""
    g = int(round(gamma))
    ps = [(a ** (k - 1)) * (1 - a) for k in range(1, g + 1)] + [a ** g]
    mean = sum(k * p for k, p in zip(range(1, g + 2), ps))
    return sum((k - mean) ** 2 * p for k, p in zip(range(1, g + 2), ps))


def spec_speedup(a: float, gamma: int, draft_cost_ratio: float, verify_cost_ratio: float = 1.0) -> float:
    """Speedup over plain decoding: E / (verify/plain + gamma * draft/plain) (Leviathan et al. eq. 3
    with c = draft_cost_ratio; verify_cost_ratio > 1 once the verify pass is compute-bound)."""
    return expected_tokens_per_step(a, gamma) / (verify_cost_ratio + gamma * draft_cost_ratio)


def relation(model: str, draft_kind: str, draft_model: str | None = None) -> str:
    """A target/draft pair in words: 'llama-3.1-8b + model llama-3.2-1b', 'qwen2.5-7b + ngram'.
    Acceptance measured on one pair transfers only to the same pair."""
    return f"{model} + {draft_kind}" + (f" {draft_model}" if draft_model and draft_kind == "model" else "")
