"""Prefill, then decode: greedy or sampled, with a per-token callback for streaming."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch

from .errors import UserError


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


def encode_prompts(tokenizer, prompts: list[str], chat: bool) -> list[list[int]]:
    if not prompts or any(not isinstance(p, str) or not p.strip() for p in prompts):
        raise UserError("a prompt is empty", "give at least one non-empty prompt")
    out = []
    for p in prompts:
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(p)["input_ids"]
        out.append(list(ids))
    return out


def check_length(cfg, prompt_len: int, max_new_tokens: int, extra: int = 0) -> None:
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens is {max_new_tokens}", "ask for at least 1 new token")
    total = prompt_len + max_new_tokens + extra
    if total > cfg.max_position:
        raise UserError(
            f"prompt ({prompt_len} tokens) plus {max_new_tokens} new tokens is {total}, beyond the model's "
            f"context of {cfg.max_position}",
            f"shorten the prompt or ask for at most {max(cfg.max_position - prompt_len - extra, 0)} new tokens",
        )


def left_pad(batch: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(x) for x in batch)
    pad = torch.tensor([longest - len(x) for x in batch], dtype=torch.long, device=device)
    toks = torch.tensor([[pad_id] * (longest - len(x)) + x for x in batch], dtype=torch.long, device=device)
    return toks, pad


def eos_ids(lm) -> set[int]:
    tok_eos = getattr(lm.tokenizer, "eos_token_id", None)
    return set(lm.cfg.eos_token_ids) | ({tok_eos} if tok_eos is not None else set())


def pad_id(tokenizer) -> int:
    p = getattr(tokenizer, "pad_token_id", None)
    return p if p is not None else 0


@dataclass
class GenerationResult:
    prompt_tokens: list[list[int]]
    new_tokens: list[list[int]]
    texts: list[str]
    ttft_s: float
    step_s: list[float]  # wall time of each decode step after the first token
    prefill_s: float
    total_s: float
    finish: list[str]
    spec: dict | None = None  # speculative stats, see speculative.SpecStats
    trace: list[list[str]] = field(default_factory=list)  # per token: "target", "accepted", "bonus", "resample"

    @property
    def n_new(self) -> int:
        return sum(len(t) for t in self.new_tokens)


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def generate(lm, prompts: list[str] | str, max_new_tokens: int = 64, sampling: SamplingParams | None = None,
             on_token=None, chat: bool = True, prompt_ids: list[list[int]] | None = None,
             stop_at_eos: bool = True) -> GenerationResult:
    """Plain autoregressive decoding. on_token(batch_index, token_id, text_piece, origin) streams tokens."""
    sp = (sampling or SamplingParams()).validate()
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    ids = prompt_ids if prompt_ids is not None else encode_prompts(lm.tokenizer, prompts, chat)
    model, dev, cfg = lm.model, lm.device, lm.cfg
    longest = max(len(x) for x in ids)
    check_length(cfg, longest, max_new_tokens)
    eos = eos_ids(lm) if stop_at_eos else set()
    toks, pad = left_pad(ids, pad_id(lm.tokenizer), dev)
    b = len(ids)
    cache = model.new_cache(b, longest + max_new_tokens)
    gen = make_generator(sp, dev)
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    finish = ["length"] * b
    steps: list[float] = []

    t0 = time.perf_counter()
    logits = model(toks, 0, cache, pad, last_only=True)[:, -1]
    nxt = pick(logits, sp, gen)
    _sync(dev)
    ttft = time.perf_counter() - t0
    prefill_s = ttft
    slot = longest
    while True:
        for i, t in enumerate(nxt.tolist()):
            if done[i]:
                continue
            out[i].append(t)
            if on_token:
                on_token(i, t, lm.tokenizer.decode([t]), "target")
            if t in eos:
                done[i], finish[i] = True, "eos"
            elif len(out[i]) >= max_new_tokens:
                done[i] = True
        if all(done):
            break
        ts = time.perf_counter()
        logits = model(nxt[:, None], slot, cache, pad)[:, -1]
        nxt = pick(logits, sp, gen)
        _sync(dev)
        steps.append(time.perf_counter() - ts)
        slot += 1
    total = time.perf_counter() - t0
    texts = [lm.tokenizer.decode(o, skip_special_tokens=True) for o in out]
    return GenerationResult(ids, out, texts, ttft, steps, prefill_s, total, finish,
                            trace=[["target"] * len(o) for o in out])
