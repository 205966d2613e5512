"""Paired statistics of two configurations' pass/fail outcomes on the same problems.

Quantization changes few answers, so two pass@1 figures with overlapping intervals say little; what
counts is which problems flipped. McNemar's exact test looks only at the discordant pairs: under
"no difference" each flip is equally likely to go either way, so the smaller count is Binomial(n, 1/2)
with n = flips. Two-sided p = min(1, 2 P[X <= min(b, c)]). The interval of one pass@1 is Wilson's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.common.errors import UserError

ALPHA = 0.05
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Paired:
    """A against B on their common problems: `lost` passed in A and failed in B, `gained` the reverse."""

    problems: int
    both_pass: int
    both_fail: int
    lost: int  # A passed, B failed
    gained: int  # A failed, B passed
    p_value: float

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA

    @property
    def verdict(self) -> str:
        if not self.lost and not self.gained:
            return "identical outcomes"
        return f"{'significant' if self.significant else 'not significant'} (McNemar exact p = {self.p_value:.3g})"


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs (1.0 when there are none)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got {b}, {c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def compare(a: dict[str, bool], b: dict[str, bool]) -> Paired:
    """Pair two {problem id: passed} maps on the problems both ran; refuses when they share none."""
    common = [k for k in a if k in b]
    if not common:
        raise UserError("the two accuracy runs share no problem", "compare runs of the same subset (e.g. both quick20)")
    lost = sum(1 for k in common if a[k] and not b[k])
    gained = sum(1 for k in common if b[k] and not a[k])
    both = sum(1 for k in common if a[k] and b[k])
    return Paired(len(common), both, len(common) - both - lost - gained, lost, gained, mcnemar_exact(lost, gained))


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95% by default); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)
