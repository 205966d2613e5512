"""The server's draft length per step: `fixed`, `off`, or `adaptive` (the best by the step-cost model of
engine/common/step_model.py, whose tables `profile` measures on the scheduler's own step path before it serves
and every step keeps current).
"""
from __future__ import annotations

import statistics

from engine.common.step_model import Acceptance, Debt, StepCost, best_gamma, could_pay
from engine.common.vocab import check_spec_policy

PROBE_EVERY = 32  # steps at gamma 0 before one step drafts a token, so acceptance is still measured


class SpecPolicy:
    """The draft length of each step: `fixed` always gamma_max, `off` 0 (a setup says no draft instead),
    `adaptive` the best by the step-cost model."""

    def __init__(self, name: str, gamma_max: int, cost: StepCost | None = None):
        check_spec_policy(name)
        self.name, self.gamma_max, self.cost = name, gamma_max, cost
        self.acceptance = Acceptance(gamma_max)
        self.steps = {g: 0 for g in range(gamma_max + 1)}  # decode steps by the gamma chosen (/metrics)
        self.asked_rounds = 0  # sequence rounds that asked for drafts, a lookup's that found none included
        self.force: int | None = None  # the profile sets each gamma in turn
        self.chosen = gamma_max
        self._since_draft = 0

    def choose(self, batch: int, owed_rows: int = 0, tokens_left: int = 0, running: int = 0) -> int | None:
        """This step's draft length for every sequence; None under `fixed`: each sequence keeps its own (gamma,
        or what the benchmarks' +2/-1 heuristic made it), counted as gamma_max. `batch`: the sequences decoding;
        `running`: all running ones, prefilling included; `owed_rows`: tokens the draft's cache lacks over the
        running sequences; `tokens_left`: the tokens they may still make."""
        if self.force is not None:
            g = self.force
        elif self.name == "fixed":
            self.chosen = self.gamma_max
            return None
        elif self.name == "off":
            g = 0
        elif self.cost is None:
            g = self.gamma_max
        else:
            # With nothing decoding, g only says whether the draft prefills the prompts: it should where the
            # sequences will draft once they decode, together (all the running ones, 1 at least), and not pay a
            # prefill it would then skip (four prompts at once decode at batch 4, not 1).
            debt, b = Debt(owed_rows, tokens_left), batch or max(running, 1)
            g = best_gamma(self.cost, self.acceptance.expected_by_gamma(), b, debt, self.acceptance.rows_by_gamma())
            if g == 0 and self._since_draft >= PROBE_EVERY and could_pay(self.cost, b, debt):
                g = 1
        self.chosen = g
        return g

    def forget_counts(self) -> None:
        """Counters at zero after a profile's steps: /metrics says what serving chose, not the profile."""
        self.steps, self.asked_rounds = {g: 0 for g in self.steps}, 0

    def observe(self, st) -> None:
        """A step's StepStats: its rounds' acceptance, and (adaptive) its timings into the cost model."""
        if st.decode_seqs:
            self.steps[self.chosen] += 1
            self._since_draft = 0 if self.chosen else self._since_draft + 1
        self.asked_rounds += len(st.rounds)
        for asked, drafted, accepted in st.rounds:
            self.acceptance.count(drafted, accepted, asked)
        if self.cost is not None and self.force is None:
            # a draft pass is timed when it is one round's work: no prompt chunk, no catch-up on skipped tokens
            clean = not st.prefill_rows and st.draft_feed_rows <= st.decode_seqs * (self.gamma_max + 1)
            self.cost.observe(st.decode_rows + st.prefill_rows, st.verify_s, st.decode_seqs,
                              st.draft_passes if clean else 0, st.draft_s, st.prefill_rows, st.draft_prefill_s)

    def facts(self) -> dict:
        out = {"policy": self.name, "steps_by_gamma": {str(g): n for g, n in self.steps.items()},
               "asked_rounds": self.asked_rounds}
        if self.cost is not None:
            out["step_cost"] = self.cost.to_dict()
        return out


def profile(sched, steps: int = 2, prompt_len: int = 8) -> StepCost:
    """Measure the target's forward and the draft's pass on the scheduler's own step path, before it serves:
    `steps` decode steps (after one warm-up) at each gamma 0..gamma_max, for one sequence and for every slot.
    Leaves the scheduler empty, as built (`Scheduler.forget`)."""
    from engine.infer.batch import Request

    policy = sched.policy
    cost = StepCost({}, {})
    room = sched.settings.max_model_len - prompt_len - sched.headroom
    per_request = (policy.gamma_max + 1) * (steps + 1) * (policy.gamma_max + 1)
    batches = sorted({1, sched.settings.max_seqs})
    sched.batch.pad_drafts = True
    for batch in batches:
        reqs = [Request([(7 + 13 * i + 31 * b) % 1000 + 10 for i in range(prompt_len)], min(room, per_request),
                        stop_at_eos=False) for b in range(batch)]
        for r in reqs:
            sched.submit(r)
        policy.force = 1  # the prompts' prefill (one chunk each, a few steps), the draft's included
        for _ in range(prompt_len + 2):
            if all((s := sched.sequence(r)) is not None and s.decoding for r in reqs):
                break
            st, _ = sched.step()
            if st is not None and st.prefill_rows and st.draft_prefill_s > 0:
                cost.draft_row_s = max(cost.draft_row_s, st.draft_prefill_s / st.prefill_rows)
        timings: dict[int, list] = {}
        for g in range(policy.gamma_max + 1):
            policy.force = g
            for i in range(steps + 1):
                st, _ = sched.step()
                if i and st is not None and st.decode_seqs == batch and not st.prefill_rows:
                    timings.setdefault(g, []).append(st)
        for g, sts in timings.items():
            rows = statistics.median(s.decode_rows for s in sts)
            cost.target_s[int(rows)] = statistics.median(s.verify_s for s in sts)
            if g and any(s.draft_passes for s in sts):
                cost.draft_s.setdefault(batch, statistics.median(s.draft_s / s.draft_passes for s in sts
                                                                 if s.draft_passes))
        for r in reqs:
            sched.cancel(r)
        while sched.has_work():
            sched.step()
    policy.force, sched.batch.pad_drafts = None, False
    policy.forget_counts()
    policy.acceptance = Acceptance(policy.gamma_max)  # made-up prompts say nothing about the traffic's acceptance
    sched.forget()
    return cost
