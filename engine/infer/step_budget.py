"""The token budget of a serving step, chosen from what steps cost on this machine (issue 41, item 1).

A decode step of every slot costs T_dec; the same step carrying r prompt rows costs T(r). Every decoding
sequence waits for the step, so the step's prompt rows set the inter-token tail: a step with a whole 64-row
int4 chunk took 5.9x a decode step at concurrency 8 (docs/BENCHMARKS.md). The server measures T_dec and T(r)
for a few r on its own step path when it starts (`profile`), and takes the most prompt rows with
    T(r) <= factor * T_dec
(StepCost.rows_within, linear between the measured points: the profile is the step-cost model's table of the
target's seconds by rows, engine/common/step_model.py), so a step with a chunk costs at most `factor` decode steps
(Sarathi-Serve's stall-free batching; vLLM's max_num_batched_tokens, chosen rather than guessed). The step's
budget is then a decode round of every slot (each verifying its drafts) plus those rows, and the prefill chunk
at most those rows: chunks keep fixed boundaries (0, c, 2c, ...), so a request's numbers do not depend on the
load, at every precision. The rows are timed without drafts (a draft model's
prefill of a chunk, paid in steps that draft, is not in them), so with speculation the factor holds against
the larger verification step.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

from engine.common.step_model import StepCost

CANDIDATES = (4, 8, 16, 32, 64)  # prompt rows timed beside the decode step (and 2 x prefill_chunk, when larger)


@dataclass(frozen=True)
class StepBudget:
    """What the profile measured and what it chose; recorded with the server's settings."""

    factor: float
    decode_seqs: int                      # sequences in the decode step it timed
    decode_s: float                       # that step alone
    with_rows_s: dict = field(default_factory=dict)  # prompt rows -> the same step carrying them
    prompt_rows: int = 0                  # the most rows within factor x decode_s
    max_batched_tokens: int = 0           # the budget: a decode round of every slot plus the chunk
    prefill_chunk: int = 0                # the chunk: the server's, or prompt_rows when fewer
    profile_s: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["with_rows_s"] = {str(k): v for k, v in self.with_rows_s.items()}
        return d


def profile(sched, factor: float, steps: int = 3) -> StepBudget:
    """Time, on the scheduler's own step path, a decode step of max_seqs - 1 sequences carrying each candidate
    number of prompt rows (one slot prefills) against the same step alone right before it, `steps` pairs each after
    a warm-up (pairs, so the machine's drift cancels), from the fewest rows up to the first past the factor; choose
    the rows. Leaves the scheduler empty, as built (`Scheduler.forget`)."""
    from dataclasses import replace

    from engine.infer.batch import Request

    t0 = time.perf_counter()
    st = sched.settings
    n_dec = st.max_seqs - 1
    per_seq = 1 + sched.batch.gamma_max  # a decode round verifies up to gamma drafts per sequence
    decode_rows = st.max_seqs * per_seq
    room = st.max_model_len - sched.headroom
    cands = sorted({r for r in (*CANDIDATES, 2 * st.prefill_chunk) if r * (steps + 1) + 1 <= room - 1})
    if not cands:
        return StepBudget(factor, n_dec, 0.0, {}, st.prefill_chunk, st.max_batched_tokens, st.prefill_chunk)
    policy = sched.policy
    if policy is not None:
        policy.force = 0  # decode rows alone: the budget bounds the prompt's share of a step
    saved = sched.settings

    def budget(rows: int) -> None:  # the next step: n_dec decode rows (no drafts) and `rows` prompt rows, one chunk
        sched.settings = replace(saved, max_batched_tokens=n_dec + rows, prefill_chunk=max(rows, 1))

    n_steps = len(cands) * 2 * (steps + 1) + 24
    vocab = sched.batch.vocab

    def tokens(n: int, seed: int) -> list[int]:  # made-up prompts, distinct so no prefix is shared, within any vocab
        return [3 + (seed + 7 * i) % max(vocab - 3, 1) for i in range(n)]

    decoders = [Request(tokens(8, 11 + 29 * b), min(room - 8, n_steps), stop_at_eos=False) for b in range(n_dec)]
    alone: list[float] = []
    ratios: dict[int, list[float]] = {}
    try:
        budget(max(cands))
        for r in decoders:
            sched.submit(r)
        for _ in range(16):  # their prompts' prefill
            if all((s := sched.sequence(r)) is not None and s.decoding for r in decoders):
                break
            sched.step()
        for rows in cands:
            long = Request(tokens(rows * (steps + 1) + 1, 5 + 17 * rows), 1, stop_at_eos=False)
            sched.submit(long)
            for i in range(steps + 1):
                budget(0)
                d, _ = sched.step()
                budget(rows)
                w, _ = sched.step()
                if i and d is not None and w is not None and d.decode_seqs == w.decode_seqs == n_dec \
                        and not d.prefill_rows and w.prefill_rows == rows:
                    alone.append(d.wall_s)
                    ratios.setdefault(rows, []).append(w.wall_s / d.wall_s)
            sched.cancel(long)
            if ratios.get(rows) and statistics.median(ratios[rows]) > factor:
                break  # past the factor: larger chunks cost more still, and are not timed
        for r in decoders:
            sched.cancel(r)
        budget(max(cands))
        while sched.has_work():
            sched.step()
    finally:
        sched.settings = saved
        if policy is not None:
            policy.force = None
            policy.forget_counts()
    sched.forget()
    decode_s = statistics.median(alone) if alone else 0.0
    with_rows = {r: decode_s * statistics.median(v) for r, v in ratios.items()}
    chosen = as_cost(n_dec, decode_s, with_rows).rows_within(n_dec, factor, max(cands)) \
        if decode_s > 0 and with_rows else st.prefill_chunk
    chunk = min(chosen, st.prefill_chunk)
    return StepBudget(factor, n_dec, decode_s, with_rows, chosen, decode_rows + chunk, chunk,
                      time.perf_counter() - t0)


def as_cost(n_dec: int, decode_s: float, with_rows: dict[int, float]) -> StepCost:
    """The profile as the step-cost model's target table: seconds by rows (n_dec decode rows, plus r prompt rows)."""
    return StepCost({n_dec: decode_s, **{n_dec + r: t for r, t in with_rows.items()}})
