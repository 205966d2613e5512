"""Sampling parameters and the distribution a token is drawn from: temperature, top-k, top-p."""
from __future__ import annotations

import time

import torch

from engine.common.errors import UserError
from engine.common.sampling import SamplingParams  # noqa: F401  (re-exported: the parameters live in common)


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
