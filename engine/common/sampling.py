"""Sampling parameters: temperature, top-k, top-p and a seed. Pure (no torch), so a run's config is too."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from engine.common.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 mean no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def validate(self) -> "SamplingParams":
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or math.isnan(t) or t < 0 or t > 100:
            raise UserError(f"temperature {t} is out of range", "use 0 (greedy) or a value in (0, 100]")
        if not isinstance(k, int) or k < 0:
            raise UserError(f"top_k {k} is out of range", "use 0 (off) or a positive integer")
        if not isinstance(p, (int, float)) or math.isnan(p) or not (0 < p <= 1):
            raise UserError(f"top_p {p} is out of range", "use a value in (0, 1]; 1 turns it off")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise UserError(f"seed {self.seed} is invalid", "use a non-negative integer")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)
