"""Dollars from measured throughput: the one formula the dashboard and reports share."""
from __future__ import annotations

import math

from .errors import UserError

HOURS_PER_MONTH = 730.0


def check_price(usd_per_hour: float) -> float:
    if not isinstance(usd_per_hour, (int, float)) or math.isnan(usd_per_hour) or usd_per_hour <= 0:
        raise UserError(f"price {usd_per_hour!r} $/hour is not a positive number", "enter a price above 0")
    return float(usd_per_hour)


def usd_per_million_tokens(tokens_per_s: float | None, usd_per_hour: float) -> float | None:
    """$ per 1M tokens for a machine at usd_per_hour producing tokens_per_s (None if unknown)."""
    check_price(usd_per_hour)
    if not tokens_per_s or tokens_per_s <= 0:
        return None
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6
