"""Statistics over samples: percentiles, medians and bootstrap intervals (the one home for all three).

The intervals the lab reports (docs/BENCHMARKS.md, "How the numbers are made"):

- Speed (decode tok/s, TTFT, per-token latency, the speedup of speculation): the statistic is the
  median over every sample (each prompt of the workload, in each repetition); its 95% interval is a
  percentile bootstrap over *repetitions*: draw R whole repetitions with replacement (each one a pass
  over every prompt), pool their samples, take the median; the 2.5th and 97.5th percentiles of
  BOOT such medians are the interval. Every draw holds the same prompts, so the interval measures
  how much the answer moves from one pass to the next: machine noise, which is what the noise
  guard judges. The speedup draws the same repetitions for the speculative and the plain target
  (they ran interleaved, prompt by prompt), so the pairing is kept.
- Acceptance (rate and mean acceptance length, token- and request-weighted): greedy decoding accepts
  the same drafts in every repetition, so repetitions say nothing about it. Its interval is a
  percentile bootstrap over *prompts*: draw the prompts with replacement (within each category, so
  a mix keeps its composition) and recompute the statistic. It measures how much acceptance depends
  on which prompts were picked.

With R repetitions there are few distinct draws (R = 3: 10), so below MIN_INTERVAL_REPS repetitions
the lab does not call it a 95% interval: it reports the range of the repetitions' own statistics, of
kind "range" (repetition_spread). A range needs R >= 2 and a prompt interval needs 2 prompts.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Sequence

MIN_INTERVAL_REPS = 5  # fewer repetitions: a range, not a 95% interval
BOOT = 2000  # bootstrap draws: the interval ends move by well under 1% of the median between seeds
LEVEL = 0.95
SEED = 0  # fixed: the same samples always give the same interval


def percentile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def finite(xs) -> list[float]:
    """The finite numbers of xs (None, NaN and bools dropped)."""
    return [float(x) for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]


def median(xs) -> float | None:
    return percentile(finite(xs), 50)


def mean(xs) -> float | None:
    v = finite(xs)
    return sum(v) / len(v) if v else None


def bootstrap(groups: Sequence, stat: Callable[[list], float | None], strata: Sequence | None = None,
              n_boot: int = BOOT, level: float = LEVEL, seed: int = SEED) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of stat(groups) (the statistic of a list of groups).

    Each draw takes len(groups) groups with replacement; with `strata` (one key per group) it draws
    within each stratum as many as that stratum holds. None when no stratum holds 2 groups (nothing
    could vary), or when the statistic is undefined in most draws.
    """
    groups = list(groups)
    keys = list(strata) if strata is not None else [0] * len(groups)
    by: dict = {}
    for g, k in zip(groups, keys):
        by.setdefault(k, []).append(g)
    if not by or max(len(m) for m in by.values()) < 2:
        return None
    rng = random.Random(seed)
    vals = []
    for _ in range(n_boot):
        draw = []
        for members in by.values():
            draw += rng.choices(members, k=len(members))
        v = stat(draw)
        if v is not None and math.isfinite(v):
            vals.append(v)
    if len(vals) < n_boot / 2:
        return None
    tail = (1 - level) / 2 * 100
    return percentile(vals, tail), percentile(vals, 100 - tail)


def repetition_spread(reps: Sequence, stat: Callable[[list], float | None]) -> tuple[str, tuple[float, float] | None]:
    """(kind, (lo, hi)) of stat over repetitions: "interval", a bootstrap 95% interval, from
    MIN_INTERVAL_REPS repetitions on; below that "range": the lowest and highest of each repetition's
    own stat and the stat of them all (a pooled median need not lie between the passes' own)."""
    reps = list(reps)
    if len(reps) >= MIN_INTERVAL_REPS:
        return "interval", bootstrap(reps, stat)
    own = finite([stat([r]) for r in reps])
    if len(own) < 2:
        return "range", None
    own += finite([stat(reps)])
    return "range", (min(own), max(own))


def half_width(value: float | None, lo: float | None, hi: float | None) -> float | None:
    """The larger distance from the value to either end of its interval (what ± shows)."""
    if value is None or lo is None or hi is None:
        return None
    return max(hi - value, value - lo, 0.0)


def relative_half_width(value, lo, hi) -> float | None:
    """half_width / |value| (the noise guard compares it with 10%)."""
    h = half_width(value, lo, hi)
    return None if h is None or not value else h / abs(value)
