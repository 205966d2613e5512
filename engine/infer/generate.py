"""Generation of a static batch: prefill, then decode, greedy or sampled, streaming tokens.

The requests run through the same continuous-batching scheduler as the server (scheduler.py), with
the policy a benchmark wants: every prompt is prefilled before decoding starts, so the decode steps
time decoding alone. Speculative generation is the same with a proposer (speculative.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from engine.infer.batch import Request
from engine.infer.paged import windows_pay
from engine.infer.sampling import SamplingParams
from engine.infer.scheduler import BatchSettings, Scheduler, speculation_headroom
from engine.infer.spec_stats import SpecStats
from engine.infer.tokens import check_length, encode_prompts, eos_ids

PREFILL_CHUNK = 512  # rows per prefill segment in a static batch (the kernels' chunked-prefill limit)


@dataclass
class GenerationResult:
    prompt_tokens: list[list[int]]
    new_tokens: list[list[int]]
    texts: list[str]
    ttft_s: float  # start until every sequence has its first token (one sequence: its TTFT)
    step_s: list[float]  # wall time of each decode step after the first token
    prefill_s: float  # wall time of the prefill steps (every prompt, and a model draft's), first tokens included
    total_s: float
    finish: list[str]
    spec: dict | None = None  # speculative stats, see spec_stats.SpecStats
    trace: list[list[str]] = field(default_factory=list)  # per token: "target", "accepted", "bonus", "resample"
    kv_bytes: int = 0  # bytes of the KV caches allocated for this generation
    spec_stats: SpecStats | None = None
    settings: dict | None = None  # the scheduler settings it ran with

    @property
    def n_new(self) -> int:
        return sum(len(t) for t in self.new_tokens)


def run_static(lm, ids: list[list[int]], max_new_tokens: int, sp: SamplingParams, on_token=None,
               stop_at_eos: bool = True, proposer_spec=None, gamma: int = 0, adaptive: bool = False,
               stop: tuple[str, ...] = (), max_seqs: int | None = None, kv_cache: str | None = None
               ) -> GenerationResult:
    """Run a static batch of already-encoded prompts to completion and time it; `stop` ends a sequence at
    the first of these strings (its tokens up to there are kept in new_tokens). `max_seqs` below the
    number of prompts batches continuously: at most that many in flight, the next admitted as one ends
    (the step times then mix prefills into decode steps). The K/V sit in slots of every position, or
    (kv_cache None) for a model with sliding windows in a paged cache holding each sequence's window where
    that is smaller (prompts then go in one chunk a step: scheduler.py); the result's settings say which."""
    b, longest = len(ids), max(len(x) for x in ids)
    m = min(b, max_seqs or b)
    headroom = speculation_headroom(proposer_spec, gamma)
    widest = sum(sorted(len(x) for x in ids)[-m:])  # the m longest prompts read in one step
    positions = longest + max_new_tokens + headroom + 1
    settings = BatchSettings(max_seqs=m, max_model_len=positions,
                             max_batched_tokens=max(widest, m * (gamma + 1)) + PREFILL_CHUNK,
                             prefill_chunk=PREFILL_CHUNK, max_waiting=b, policy="prefill-first")
    if kv_cache is None:  # a sliding window's blocks go back behind it, where that holds less than a slot
        rows = settings.step_rows(gamma if proposer_spec else 0)
        kv_cache = "paged" if windows_pay(lm.model.cfg, positions, rows) else "slots"
    settings = replace(settings, kv_cache=kv_cache)
    sched = Scheduler(lm, settings, proposer_spec, gamma, adaptive, eos=eos_ids(lm) if stop_at_eos else set())
    index = {}

    def cb(seq, tok, piece, origin):
        on_token(index[id(seq.req)], tok, piece, origin)

    reqs = []
    for i, x in enumerate(ids):
        r = Request(list(x), max_new_tokens, sp, stop_at_eos, stop=tuple(stop), on_token=cb if on_token else None,
                    request_id=str(i))
        index[id(r)] = i
        reqs.append(sched.submit(r))
    seqs = [None] * b
    steps, draft_s, verify_s, prefill_s = [], 0.0, 0.0, 0.0
    t0 = time.perf_counter()
    ttft = None
    while sched.has_work():
        for s in sched.running:
            seqs[index[id(s.req)]] = s
        st, finished = sched.step()
        for s in list(sched.running) + finished:  # a sequence may finish in the step that admitted it
            seqs[index[id(s.req)]] = s
        if st is None:
            continue
        if st.decode_seqs:
            steps.append(st.wall_s)
            draft_s += st.draft_s
            verify_s += st.verify_s
        else:  # prefill-first: every prompt is read before the first decode step
            prefill_s += st.wall_s
        if ttft is None and all(s is not None and s.out for s in seqs):
            ttft = time.perf_counter() - t0
    total = time.perf_counter() - t0
    ttft = ttft if ttft is not None else total
    tok = lm.tokenizer
    res = GenerationResult(ids, [s.out for s in seqs], [tok.decode(s.out, skip_special_tokens=True) for s in seqs],
                           ttft, steps, prefill_s, total, [s.finish for s in seqs], trace=[s.trace for s in seqs],
                           kv_bytes=sched.batch.kv_bytes(), settings=settings.to_dict())
    if proposer_spec is not None:
        stats = SpecStats(proposer_spec.kind, gamma, adaptive, position_drafted=[0] * gamma,
                          position_accepted=[0] * gamma, accepted_hist=[0] * (gamma + 1), draft_s=draft_s,
                          verify_s=verify_s)
        for s in seqs:
            stats.add(s.spec_stats)
        res.spec, res.spec_stats = stats.to_dict(), stats
    return res


def prepare(lm, prompts, max_new_tokens: int, sampling: SamplingParams | None, chat: bool, prompt_ids,
            extra: int = 0) -> tuple[list[list[int]], SamplingParams]:
    sp = (sampling or SamplingParams()).validate()
    prompts = [prompts] if isinstance(prompts, str) else list(prompts or [])
    ids = prompt_ids if prompt_ids is not None else encode_prompts(lm.tokenizer, prompts, chat)
    check_length(lm.cfg, max(len(x) for x in ids), max_new_tokens, extra=extra)
    return [list(x) for x in ids], sp


@torch.inference_mode()
def generate(lm, prompts: list[str] | str, max_new_tokens: int = 64, sampling: SamplingParams | None = None,
             on_token=None, chat: bool = True, prompt_ids: list[list[int]] | None = None,
             stop_at_eos: bool = True) -> GenerationResult:
    """Plain autoregressive decoding. on_token(batch_index, token_id, text_piece, origin) streams tokens."""
    ids, sp = prepare(lm, prompts, max_new_tokens, sampling, chat, prompt_ids)
    return run_static(lm, ids, max_new_tokens, sp, on_token, stop_at_eos)
