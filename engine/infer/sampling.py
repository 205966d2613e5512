"""Sampling parameters and the distribution a token is drawn from: temperature, top-k, top-p."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

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


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The distribution we sample from: temperature, then top-k, then top-p. Greedy is one-hot."""
    logits = logits.float()
    if sp.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sp.temperature
    if sp.top_k and sp.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (cum - sorted_p) >= sp.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [B, V] -> [B]."""
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def pick(logits: torch.Tensor, sp: SamplingParams, gen) -> torch.Tensor:
    if sp.greedy:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, sp), gen)


def make_generator(sp: SamplingParams, device) -> torch.Generator | None:
    if sp.greedy:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(sp.seed if sp.seed is not None else int(time.time_ns() % (2**31)))
    return g
