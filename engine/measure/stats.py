"""Statistics over samples: percentiles (the one definition the lab uses)."""
from __future__ import annotations

import math


def percentile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
