"""Prefill, then decode: greedy or sampled, with a per-token callback for streaming."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.infer.sampling import SamplingParams, pick, make_generator
from engine.infer.tokens import StreamDecoder, check_length, encode_prompts, eos_ids, left_pad, pad_id


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
    kv_bytes: int = 0  # bytes of the KV cache allocated for this generation (KVCache.nbytes)

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
    streams = [StreamDecoder(lm.tokenizer) for _ in range(b)]

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
                on_token(i, t, streams[i].push(t), "target")
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
                            trace=[["target"] * len(o) for o in out], kv_bytes=cache.nbytes())
