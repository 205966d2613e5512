"""Sampling parameters: temperature, top-k, top-p, a seed, and the penalties and logit bias of the
OpenAI API (vLLM's definitions; engine/infer/sampling.py applies them). Pure (no torch), so a run's
config is too."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from engine.common.errors import UserError

MAX_REPETITION_PENALTY = 10.0  # above this a seen token's logit is all but erased; vLLM only asks for > 0
MAX_LOGIT_BIAS = 100.0  # OpenAI's range is [-100, 100]


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 mean no truncation; penalties 0, repetition
    penalty 1 and an empty logit_bias ((token id, bias) pairs) mean off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

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
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _finite(v) or not -2 <= v <= 2:
                raise UserError(f"{name} {v} is out of range", "use a value in [-2, 2]; 0 turns it off")
        r = self.repetition_penalty
        if not _finite(r) or not 0 < r <= MAX_REPETITION_PENALTY:
            raise UserError(f"repetition_penalty {r} is out of range",
                            f"use a value in (0, {MAX_REPETITION_PENALTY:g}]; 1 turns it off")
        for pair in self.logit_bias:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], int) and pair[0] >= 0
                    and _finite(pair[1]) and -MAX_LOGIT_BIAS <= pair[1] <= MAX_LOGIT_BIAS):
                raise UserError(f"logit_bias entry {pair!r} is invalid",
                                f"use (token id >= 0, bias in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]) pairs")
        if len({t for t, _ in self.logit_bias}) != len(self.logit_bias):
            raise UserError("logit_bias names a token id twice", "give each token id one bias")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the logits are adjusted before sampling (engine.infer.sampling.penalize)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias)

    def to_dict(self) -> dict:
        """The four sampling fields, plus the penalties only when on (records made before them stay alike)."""
        d = asdict(self)
        for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
            if d[name] == off:
                del d[name]
        if self.logit_bias:
            d["logit_bias"] = {str(t): b for t, b in self.logit_bias}  # OpenAI's shape: token id strings
        else:
            del d["logit_bias"]
        return d


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
