"""The step-cost model, and the draft length it says pays best.

A decode step of `batch` sequences, each verifying gamma drafts, costs
    T(batch, gamma) = target(batch * (1 + gamma)) + gamma * draft(batch) + [gamma > 0] prompt_rows * draft_row
where target(rows) is the target's forward over that many rows (sampling and verification included),
draft(batch) one batched draft pass, and the last term the draft's share of the prompts: a draft model
prefills every prompt too (prompt_rows: the prompt rows a step admits, on average; draft_row: the draft's
time per prompt row), which a policy at gamma 0 does not pay. A round asking for gamma drafts commits, per
sequence,
    E(gamma) = 1 + sum over k = 1..gamma of prod over j < k of q_j c_j
tokens, q_j the chance that the proposer proposes position j once it proposed the ones before (1 for a draft
model; a lookup, n-gram or suffix, often finds fewer than gamma), c_j the chance that position j is accepted
once it was proposed and the positions before it were accepted. The target then verifies, per sequence,
    rows(gamma) = 1 + sum over k = 1..gamma of prod over j < k of q_j
rows, not 1 + gamma, so T(batch, gamma) reads target(batch * rows(gamma)). A draft model that
drafted nothing for a while owes its cache the tokens it skipped (`owed_rows`, prompts included); drafting again
pays them once, so a gamma > 0 step also carries its share of that debt over the rounds left,
    catch_up(gamma) = owed_rows * draft_row * batch * E(gamma) / tokens_left
(tokens_left: the tokens the batch's sequences may still make). The policy picks the gamma (0 included) with
the most tokens per second, batch * E(gamma) / (T(batch, gamma) + catch_up(gamma)).

One model, two sources of T: the server's StepCost holds tables, measured when it starts (engine/infer/
spec_policy.py `profile`, on the real step path) and kept current from every step's own timings (`observe`); the
planner's RooflineSteps (engine/planner/roofline.py) prices the same T(batch, gamma) from a GPU's roofline. The
c_j are counted as the server runs, decayed so they follow the traffic (`Acceptance`); the planner's are one
acceptance rate. Both choose gamma with best_gamma below. The server's step token budget reads the same table:
the most prompt rows a step may add within a factor of a decode step (`StepCost.rows_within`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

EWMA = 0.2  # weight of a new timing in a table point
EWMA_PROMPTS = 0.05  # weight of a step's prompt rows in their average (prompts come in bursts)
PRIOR_RATE, PRIOR_WEIGHT = 0.6, 2.0  # acceptance before any round is counted: 1.2 of 2 pseudo-rounds
DECAY = 0.995  # per counted round: the last few hundred rounds carry the estimate


def interpolate(table: dict[int, float], x: float) -> float:
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

    def target(self, rows: float) -> float:
        return interpolate(self.target_s, rows)

    def draft(self, batch: int) -> float:
        return interpolate(self.draft_s, batch) if self.draft_s else 0.0

    def step_s(self, batch: int, gamma: int, rows: float | None = None) -> float:
        """T(batch, gamma); rows: the rows verified per sequence (default 1 + gamma: every draft proposed)."""
        return self.target(batch * (1 + gamma if rows is None else rows)) + gamma * self.draft(batch) \
            + (self.prompt_rows * self.draft_row_s if gamma else 0.0)

    def rows_within(self, base_rows: int, factor: float, most: int) -> int:
        """The most rows r (1..most) a step of `base_rows` may add so that target(base_rows + r) <= factor x
        target(base_rows): the step's token budget (engine/infer/step_budget.py). More rows never cost less, so a
        noisy point below an earlier one is lifted to it; at least 1, so prompts always advance."""
        table, top = {}, 0.0
        for r in sorted(x for x in self.target_s if x >= base_rows):
            top = table[r] = max(top, self.target_s[r])
        if base_rows not in table:
            return most
        limit = factor * table[base_rows]
        lo, hi = 1, most
        if interpolate(table, base_rows + hi) <= limit:
            return hi
        while lo < hi:  # non-decreasing in rows: bisect on the interpolation
            mid = (lo + hi + 1) // 2
            if interpolate(table, base_rows + mid) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

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


def _chained(hits: list[float], tries: list[float], first_prior: float) -> list[float]:
    """Per-position rates hits/tries, each with PRIOR_WEIGHT pseudo-tries at the rate before it."""
    out, prior = [], first_prior
    for a, n in zip(hits, tries):
        prior = (a + prior * PRIOR_WEIGHT) / (n + PRIOR_WEIGHT)
        out.append(prior)
    return out


@dataclass
class Acceptance:
    """q_j and c_j for each draft position (module docstring), from rounds counted as they finish (decayed),
    with priors."""

    gamma_max: int
    reached: list[float] = field(default_factory=list)  # rounds that drafted position j with 0..j-1 accepted
    accepted: list[float] = field(default_factory=list)  # of those, rounds that accepted j
    asked: list[float] = field(default_factory=list)  # rounds that asked for position j and proposed 0..j-1
    proposed: list[float] = field(default_factory=list)  # of those, rounds that proposed j

    def __post_init__(self):
        for name in ("reached", "accepted", "asked", "proposed"):
            setattr(self, name, getattr(self, name) or [0.0] * self.gamma_max)

    def count(self, drafted: int, accepted: int, asked: int | None = None) -> None:
        """One round: `asked` drafts requested (default: `drafted`, as a draft model always proposes them all),
        `drafted` proposed, `accepted` of them kept."""
        for j in range(min(drafted if asked is None else asked, drafted + 1, self.gamma_max)):
            self.asked[j] = DECAY * self.asked[j] + 1
            self.proposed[j] = DECAY * self.proposed[j] + (j < drafted)
        for j in range(min(drafted, accepted + 1, self.gamma_max)):
            self.reached[j] = DECAY * self.reached[j] + 1
            self.accepted[j] = DECAY * self.accepted[j] + (j < accepted)

    def rates(self) -> list[float]:
        """c_j for every position; with few rounds reaching j, c_j leans on c_(j-1) (acceptance runs in
        streaks), c_0 on 0.6."""
        return _chained(self.accepted, self.reached, PRIOR_RATE)

    def proposal_rates(self) -> list[float]:
        """q_j for every position; with few rounds asking for j, q_j leans on q_(j-1), q_0 on 1 (a draft model's)."""
        return _chained(self.proposed, self.asked, 1.0)

    def rows_by_gamma(self) -> list[float]:
        """rows(g) for g = 0..gamma_max: rows the target verifies per sequence when a round asks for g drafts."""
        out, reach = [1.0], 1.0
        for q in self.proposal_rates():
            reach *= q
            out.append(out[-1] + reach)
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
        """E(g) for g = 0..gamma_max: tokens a round asking for g drafts commits per sequence, the target's own
        token included."""
        out, reach = [1.0], 1.0
        for q, c in zip(self.proposal_rates(), self.rates()):
            reach *= q * c
            out.append(out[-1] + reach)
        return out

    def expected_tokens(self, gamma: int) -> float:
        return self.expected_by_gamma()[gamma]


@dataclass(frozen=True)
class Debt:
    """What a draft model owes its cache: rows it skipped while drafting nothing, over the tokens left."""

    owed_rows: int = 0
    tokens_left: int = 0

    def per_step_s(self, cost: "Steps", batch: int, expected: float) -> float:
        """The catch-up's share of one round committing `expected` tokens per sequence."""
        if not self.owed_rows:
            return 0.0
        return self.owed_rows * cost.draft_row_s * batch * expected / max(self.tokens_left, 1)


class Steps(Protocol):
    """What prices a step: StepCost (measured tables) or the planner's RooflineSteps (a GPU's roofline)."""

    draft_row_s: float

    def step_s(self, batch: int, gamma: int, rows: float | None = None) -> float: ...


def best_gamma(cost: Steps, expected: Sequence[float], batch: int, debt: Debt = Debt(),
               rows: Sequence[float] | None = None) -> int:
    """The gamma in 0..len(expected)-1 with the most tokens per second (the smaller one on a tie); expected[g]:
    E(g), the tokens a round asking for g drafts commits per sequence (Acceptance.expected_by_gamma); rows[g]:
    the rows it verifies per sequence (Acceptance.rows_by_gamma; None: 1 + g)."""
    rate = [batch * e / max(cost.step_s(batch, g, rows[g] if rows else None)
                            + (debt.per_step_s(cost, batch, e) if g else 0.0), 1e-9)
            for g, e in enumerate(expected)]
    return max(range(len(expected)), key=lambda g: (rate[g], -g))


def speedup(cost: Steps, expected: Sequence[float], batch: int, gamma: int,
            rows: Sequence[float] | None = None) -> float:
    """Tokens per second drafting `gamma` a round over drafting nothing, at this batch: E(g) T(b, 0) / T(b, g)."""
    return expected[gamma] * cost.step_s(batch, 0) / max(cost.step_s(batch, gamma, rows[gamma] if rows else None),
                                                         1e-9)


def could_pay(cost: Steps, batch: int, debt: Debt = Debt()) -> bool:
    """Whether one draft token could pay at this batch if it were always accepted (its catch-up included):
    when not, no acceptance measured by a probe would change the answer, so the policy does not probe."""
    return 2 / (cost.step_s(batch, 1) + debt.per_step_s(cost, batch, 2.0)) > 1 / max(cost.step_s(batch, 0), 1e-9)
