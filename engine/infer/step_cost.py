"""The step-cost model, and the draft length it says pays best.

A decode step of `batch` sequences, each verifying gamma drafts, costs
    T(batch, gamma) = target(batch * (1 + gamma)) + gamma * draft(batch) + [gamma > 0] prompt_rows * draft_row
where target(rows) is the target's forward over that many rows (sampling and verification included),
draft(batch) one batched draft pass, and the last term the draft's share of the prompts: a draft model
prefills every prompt too (prompt_rows: the prompt rows a step admits, on average; draft_row: the draft's
time per prompt row), which a policy at gamma 0 does not pay. A round of gamma drafts commits, per sequence,
    E(gamma) = 1 + sum over k = 1..gamma of prod over j < k of c_j
tokens, c_j the chance that draft position j is accepted once the positions before it were. A draft model that
drafted nothing for a while owes its cache the tokens it skipped (`owed_rows`, prompts included); drafting again
pays them once, so a gamma > 0 step also carries its share of that debt over the rounds left,
    catch_up(gamma) = owed_rows * draft_row * batch * E(gamma) / tokens_left
(tokens_left: the tokens the batch's sequences may still make). The policy picks the gamma (0 included) with
the most tokens per second, batch * E(gamma) / (T(batch, gamma) + catch_up(gamma)).

target() and draft() are tables: measured when the server starts (`profile`, on the real step path), then kept
current from every step's own timings (`StepCost.observe`). The c_j are counted as the server runs, decayed so
they follow the traffic (`Acceptance`). One home for the model: the server's policy and its record use it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from engine.common.vocab import check_spec_policy

EWMA = 0.2  # weight of a new timing in a table point
EWMA_PROMPTS = 0.05  # weight of a step's prompt rows in their average (prompts come in bursts)
PROBE_EVERY = 32  # steps at gamma 0 before one step drafts a token, so acceptance is still measured
PRIOR_RATE, PRIOR_WEIGHT = 0.6, 2.0  # acceptance before any round is counted: 1.2 of 2 pseudo-rounds
DECAY = 0.995  # per counted round: the last few hundred rounds carry the estimate


def _interpolate(table: dict[int, float], x: int) -> float:
    """Piecewise linear through the points; beyond the ends, the nearest segment's slope (never below 0)."""
    xs = sorted(table)
    if len(xs) == 1:
        return table[xs[0]] * x / xs[0]  # one point: proportional, the only shape it can say
    if x <= xs[0]:
        lo, hi = xs[0], xs[1]
    elif x >= xs[-1]:
        lo, hi = xs[-2], xs[-1]
    else:
        hi = next(v for v in xs if v >= x)
        lo = xs[xs.index(hi) - 1]
    slope = max(0.0, (table[hi] - table[lo]) / (hi - lo))
    return max(0.0, table[lo] + slope * (x - lo))


@dataclass
class StepCost:
    """Seconds of a step: the target's forward by rows, one draft pass by batch (empty: no draft)."""

    target_s: dict[int, float]
    draft_s: dict[int, float] = field(default_factory=dict)
    draft_row_s: float = 0.0  # the draft's prefill time per prompt row
    prompt_rows: float = 0.0  # prompt rows a step admits, on average

    def target(self, rows: int) -> float:
        return _interpolate(self.target_s, rows)

    def draft(self, batch: int) -> float:
        return _interpolate(self.draft_s, batch) if self.draft_s else 0.0

    def step_s(self, batch: int, gamma: int) -> float:
        return self.target(batch * (1 + gamma)) + gamma * self.draft(batch) \
            + (self.prompt_rows * self.draft_row_s if gamma else 0.0)

    def observe(self, rows: int, verify_s: float, batch: int = 0, passes: int = 0, draft_s: float = 0.0,
                prompt_rows: int = 0, draft_prefill_s: float = 0.0) -> None:
        """One step's timings: its rows' forward, (when it drafted) `passes` draft passes over `batch`, and
        (when the draft prefilled) its time on the step's `prompt_rows`."""
        if rows > 0 and verify_s > 0:
            _update(self.target_s, rows, verify_s)
        if batch > 0 and passes > 0 and draft_s > 0:
            _update(self.draft_s, batch, draft_s / passes)
        self.prompt_rows = (1 - EWMA_PROMPTS) * self.prompt_rows + EWMA_PROMPTS * prompt_rows
        if prompt_rows and draft_prefill_s > 0:
            self.draft_row_s = (1 - EWMA) * self.draft_row_s + EWMA * draft_prefill_s / prompt_rows \
                if self.draft_row_s else draft_prefill_s / prompt_rows

    def to_dict(self) -> dict:
        return {"target_ms": {str(k): round(v * 1e3, 4) for k, v in sorted(self.target_s.items())},
                "draft_pass_ms": {str(k): round(v * 1e3, 4) for k, v in sorted(self.draft_s.items())},
                "draft_row_ms": round(self.draft_row_s * 1e3, 4), "prompt_rows_per_step": round(self.prompt_rows, 3)}


def step_cost_from(facts: dict) -> StepCost:
    """The model a server reported (StepCost.to_dict, in /health's spec facts) as a StepCost again."""
    return StepCost({int(k): v / 1e3 for k, v in facts["target_ms"].items()},
                    {int(k): v / 1e3 for k, v in facts["draft_pass_ms"].items()},
                    facts.get("draft_row_ms", 0.0) / 1e3, facts.get("prompt_rows_per_step", 0.0))


def _update(table: dict[int, float], x: int, y: float) -> None:
    table[x] = y if x not in table else (1 - EWMA) * table[x] + EWMA * y


@dataclass
class Acceptance:
    """c_j for each draft position, from rounds counted as they finish (decayed), with a prior."""

    gamma_max: int
    reached: list[float] = field(default_factory=list)  # rounds that drafted position j with 0..j-1 accepted
    accepted: list[float] = field(default_factory=list)  # of those, rounds that accepted j

    def __post_init__(self):
        self.reached = self.reached or [0.0] * self.gamma_max
        self.accepted = self.accepted or [0.0] * self.gamma_max

    def count(self, drafted: int, accepted: int) -> None:
        for j in range(min(drafted, accepted + 1, self.gamma_max)):
            self.reached[j] = DECAY * self.reached[j] + 1
            self.accepted[j] = DECAY * self.accepted[j] + (j < accepted)

    def rates(self) -> list[float]:
        """c_j for every position; with few rounds reaching j, c_j leans on c_(j-1) (acceptance runs in
        streaks), c_0 on 0.6."""
        out, prior = [], PRIOR_RATE
        for a, n in zip(self.accepted, self.reached):
            prior = (a + prior * PRIOR_WEIGHT) / (n + PRIOR_WEIGHT)
            out.append(prior)
        return out

    @classmethod
    def from_counters(cls, gamma_max: int, drafts: float, accepted_per_pos: list[float]) -> "Acceptance":
        """From vLLM's counters over rounds that each drafted gamma_max tokens: draft position j was reached in
        the rounds that accepted position j - 1 (position 0 in every round)."""
        acc = [float(x) for x in accepted_per_pos[:gamma_max]] + [0.0] * max(0, gamma_max - len(accepted_per_pos))
        return cls(gamma_max, [float(drafts)] + acc[:-1], acc)

    def rate(self, j: int) -> float:
        return self.rates()[j]

    def expected_by_gamma(self) -> list[float]:
        """E(g) for g = 0..gamma_max: tokens a round commits per sequence, the target's own token included."""
        out, reach = [1.0], 1.0
        for c in self.rates():
            reach *= c
            out.append(out[-1] + reach)
        return out

    def expected_tokens(self, gamma: int) -> float:
        return self.expected_by_gamma()[gamma]


class SpecPolicy:
    """The draft length of each step: `fixed` always gamma_max, `off` 0 (a setup says no draft instead),
    `adaptive` the best by the step-cost model."""

    def __init__(self, name: str, gamma_max: int, cost: StepCost | None = None):
        check_spec_policy(name)
        self.name, self.gamma_max, self.cost = name, gamma_max, cost
        self.acceptance = Acceptance(gamma_max)
        self.steps = {g: 0 for g in range(gamma_max + 1)}  # decode steps by the gamma chosen (/metrics)
        self.force: int | None = None  # the profile sets each gamma in turn
        self.chosen = gamma_max
        self._since_draft = 0

    def choose(self, batch: int, owed_rows: int = 0, tokens_left: int = 0) -> int | None:
        """This step's draft length for every sequence; None under `fixed`: each sequence keeps its own (gamma,
        or what the benchmarks' +2/-1 heuristic made it), counted as gamma_max. `owed_rows`: tokens the draft's
        cache lacks over the running sequences; `tokens_left`: the tokens they may still make."""
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
            # sequences will draft once they decode (batch 1 at least), and not pay a prefill it would skip.
            debt, b = Debt(owed_rows, tokens_left), max(batch, 1)
            g = best_gamma(self.cost, self.acceptance, b, self.gamma_max, debt)
            if g == 0 and self._since_draft >= PROBE_EVERY and could_pay(self.cost, b, debt):
                g = 1
        self.chosen = g
        return g

    def observe(self, st) -> None:
        """A step's StepStats: its rounds' acceptance, and (adaptive) its timings into the cost model."""
        if st.decode_seqs:
            self.steps[self.chosen] += 1
            self._since_draft = 0 if self.chosen else self._since_draft + 1
        for drafted, accepted in st.rounds:
            self.acceptance.count(drafted, accepted)
        if self.cost is not None and self.force is None:
            # a draft pass is timed when it is one round's work: no prompt chunk, no catch-up on skipped tokens
            clean = not st.prefill_rows and st.draft_feed_rows <= st.decode_seqs * (self.gamma_max + 1)
            self.cost.observe(st.decode_rows + st.prefill_rows, st.verify_s, st.decode_seqs,
                              st.draft_passes if clean else 0, st.draft_s, st.prefill_rows, st.draft_prefill_s)

    def facts(self) -> dict:
        out = {"policy": self.name, "steps_by_gamma": {str(g): n for g, n in self.steps.items()}}
        if self.cost is not None:
            out["step_cost"] = self.cost.to_dict()
        return out


@dataclass(frozen=True)
class Debt:
    """What a draft model owes its cache: rows it skipped while drafting nothing, over the tokens left."""

    owed_rows: int = 0
    tokens_left: int = 0

    def per_step_s(self, cost: StepCost, batch: int, expected: float) -> float:
        """The catch-up's share of one round committing `expected` tokens per sequence."""
        if not self.owed_rows:
            return 0.0
        return self.owed_rows * cost.draft_row_s * batch * expected / max(self.tokens_left, 1)


def best_gamma(cost: StepCost, acceptance: Acceptance, batch: int, gamma_max: int, debt: Debt = Debt()) -> int:
    """The gamma in 0..gamma_max with the most tokens per second (the smaller one on a tie)."""
    e = acceptance.expected_by_gamma()
    rate = [batch * e[g] / max(cost.step_s(batch, g) + (debt.per_step_s(cost, batch, e[g]) if g else 0.0), 1e-9)
            for g in range(gamma_max + 1)]
    return max(range(gamma_max + 1), key=lambda g: (rate[g], -g))


def speedup(cost: StepCost, acceptance: Acceptance, batch: int, gamma: int) -> float:
    """Tokens per second drafting `gamma` a round over drafting nothing, at this batch: E(g) T(b, 0) / T(b, g)."""
    return acceptance.expected_tokens(gamma) * cost.step_s(batch, 0) / max(cost.step_s(batch, gamma), 1e-9)


def could_pay(cost: StepCost, batch: int, debt: Debt = Debt()) -> bool:
    """Whether one draft token could pay at this batch if it were always accepted (its catch-up included):
    when not, no acceptance measured by a probe would change the answer, so the policy does not probe."""
    return 2 / (cost.step_s(batch, 1) + debt.per_step_s(cost, batch, 2.0)) > 1 / max(cost.step_s(batch, 0), 1e-9)


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
    policy.steps = {g: 0 for g in policy.steps}
    policy.acceptance = Acceptance(policy.gamma_max)  # made-up prompts say nothing about the traffic's acceptance
    sched.forget()
    return cost
