"""Sampling parameters and the distribution a token is drawn from: logit bias and penalties, then
temperature, top-k, top-p."""
from __future__ import annotations

import time

import torch

from engine.common.errors import UserError
from engine.common.sampling import SamplingParams  # noqa: F401  (re-exported: the parameters live in common)


def penalize(logits: torch.Tensor, sp: SamplingParams, tokens: list[int], n_prompt: int,
             drafts: list[int] = ()) -> torch.Tensor:
    """Logit rows [R, V] adjusted by sp's logit_bias and penalties; row j as if drafts[:j] had been
    committed after `tokens` (tokens[:n_prompt] the prompt, the rest the output so far).

    vLLM's definitions, in vLLM's order, on float32 logits (its sampler: logit bias, then repetition,
    frequency, presence penalties):
    1. logit_bias: bias[t] is added to logit[t];
    2. repetition_penalty r (CTRL, as HF and vLLM): for every token t in the prompt or the output,
       logit[t] / r if logit[t] > 0, else logit[t] * r;
    3. frequency_penalty f: logit[t] -= f * (times t occurs in the output);
    4. presence_penalty p: logit[t] -= p if t occurs in the output at all.
    Temperature, top-k and top-p then apply to these logits, and greedy is their argmax. With all of
    them off the same tensor comes back untouched (today's path, bit for bit).
    """
    if not sp.penalized:
        return logits
    x = logits.float().clone()
    rows, v = x.shape
    dev = x.device
    if sp.logit_bias:
        ids = torch.tensor([t for t, _ in sp.logit_bias], dtype=torch.long, device=dev)
        x[:, ids] += torch.tensor([b for _, b in sp.logit_bias], dtype=x.dtype, device=dev)
    if sp.repetition_penalty == 1 and not sp.frequency_penalty and not sp.presence_penalty:
        return x
    counts = torch.zeros(rows, v, device=dev)  # row j: occurrences in the output, drafts[:j] included
    out = tokens[n_prompt:]
    if out:
        counts += torch.bincount(torch.tensor(out, dtype=torch.long, device=dev), minlength=v)[:v]
    for j, t in enumerate(drafts[:rows - 1]):
        counts[j + 1:, t] += 1
    if sp.repetition_penalty != 1:
        seen = counts > 0
        if n_prompt:
            seen[:, torch.tensor(tokens[:n_prompt], dtype=torch.long, device=dev)] = True
        r = sp.repetition_penalty
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if sp.frequency_penalty:
        x -= sp.frequency_penalty * counts
    if sp.presence_penalty:
        x -= sp.presence_penalty * (counts > 0).float()
    return x


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
