"""The step-cost model (engine/common/step_model.py), the draft length it picks, the speculation policy
(engine/infer/spec_policy.py), and the server's adaptive policy on the real 0.5B, lossless and measured on the
real step path."""
import time

import pytest

from engine.common.errors import UserError
from engine.common.setup import EngineSetup
from engine.infer.batch import Request
from engine.infer.proposers import NgramProposer, proposer_spec
from engine.infer.scheduler import BatchSettings, Scheduler
from engine.common.step_model import Acceptance, Debt, StepCost, best_gamma, could_pay, speedup, step_cost_from
from engine.infer.spec_policy import SpecPolicy
from engine.infer.tokens import encode_prompts

PROMPTS = ["Repeat exactly: alpha beta gamma delta epsilon zeta eta theta alpha beta gamma delta epsilon",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
           "Name a colour.", "x = [1, 2, 3]\ny = [a * 2 for a in x]\nprint(y)\n# prints"]
SETTINGS = BatchSettings(max_seqs=4, max_model_len=256, max_batched_tokens=4 * 5 + 16, prefill_chunk=16)


def test_the_cost_model_interpolates_and_extrapolates_its_points():
    c = StepCost({1: 0.010, 5: 0.014, 20: 0.040}, {1: 0.002, 4: 0.005})
    assert c.target(3) == pytest.approx(0.012) and c.target(40) == pytest.approx(0.040 + 20 * 0.026 / 15)
    assert c.draft(2) == pytest.approx(0.003) and StepCost({1: 0.01}).draft(4) == 0.0
    assert c.step_s(4, 4) == pytest.approx(c.target(20) + 4 * 0.005)
    c.observe(5, 0.024, batch=4, passes=2, draft_s=0.012)  # a new timing moves its point by a fifth
    assert c.target_s[5] == pytest.approx(0.8 * 0.014 + 0.2 * 0.024) and c.draft_s[4] == pytest.approx(0.0052)
    c.observe(64, 0.3, prompt_rows=64, draft_prefill_s=0.128)  # a draft model prefilling a chunk: 2 ms a row
    assert c.draft_row_s == pytest.approx(0.002) and c.prompt_rows == pytest.approx(0.05 * 64)
    assert c.step_s(4, 1) - c.step_s(4, 0) == pytest.approx(c.target(8) - c.target(4) + c.draft(4) + 3.2 * 0.002)


def test_acceptance_is_counted_per_position_once_the_positions_before_were_accepted():
    a = Acceptance(4)
    for _ in range(200):
        a.count(4, 2)  # positions 0 and 1 accepted, 2 rejected, 3 never reached
    assert a.rate(0) > 0.99 and a.rate(1) > 0.99 and a.rate(2) < 0.02
    assert a.rate(3) == pytest.approx(a.rate(2))  # no round reached it: it leans on the position before
    assert a.expected_tokens(0) == 1 and a.expected_tokens(2) == pytest.approx(3, abs=0.03)
    assert a.expected_tokens(4) < a.expected_tokens(2) + 0.02
    # from vLLM's counters: 100 rounds of 4 drafts, position 0 accepted in 80, 1 in 40, 2 in 10, 3 in 5
    b = Acceptance.from_counters(4, 100, [80, 40, 10, 5])
    assert b.reached == [100, 80, 40, 10] and b.accepted == [80, 40, 10, 5]
    assert b.rate(1) == pytest.approx((40 + 2 * b.rate(0)) / 82)  # 40 of the 80 rounds that reached it, the prior
    cost = StepCost({1: 0.02, 5: 0.03}, {1: 0.004}, 0.001, 2.0)
    assert step_cost_from(cost.to_dict()) == cost  # what /health reports reads back as the same model
    assert speedup(cost, b.expected_by_gamma(), 1, 4) == pytest.approx(
        b.expected_tokens(4) * 0.02 / (0.03 + 4 * 0.004 + 2 * 0.001))


def test_the_best_gamma_follows_the_costs_and_the_acceptance():
    flat = StepCost({1: 0.020, 40: 0.024}, {1: 0.0005, 8: 0.0006})  # memory-bound target, cheap draft
    high, low = Acceptance(4), Acceptance(4)
    for _ in range(300):
        high.count(4, 4)
        low.count(1, 0)
    e_high = high.expected_by_gamma()
    assert best_gamma(flat, e_high, 1) == 4
    assert best_gamma(flat, low.expected_by_gamma(), 1) == 0  # nothing accepted: a draft cannot pay
    compute = StepCost({1: 0.02, 8: 0.05, 40: 0.25}, {1: 0.0005, 8: 0.0006})  # rows cost at batch 8
    assert best_gamma(compute, e_high, 1) == 4 and best_gamma(compute, e_high, 8) < 4
    slow = StepCost({1: 0.020, 40: 0.024}, {1: 0.050, 8: 0.060})  # a draft pass dearer than a target step
    assert best_gamma(slow, e_high, 1) == 0
    # with only prompts in the step (nothing decoding) the choice says whether the draft prefills them: as at
    # batch 1, so a draft that cannot pay skips the prompts (it cost a whole prompt's draft prefill per request)
    policy = SpecPolicy("adaptive", 4, slow)
    policy.acceptance = high
    assert policy.choose(0) == 0 and SpecPolicy("adaptive", 4, flat).choose(0) == 4
    # prompts that arrive together decode together: four of them are priced at batch 4, where drafting loses
    # (session 23's 1.5B at concurrency 4 prefilled the draft for every level's first prompts: 0.91x)
    together = SpecPolicy("adaptive", 4, compute)
    together.acceptance = high
    assert together.choose(0, running=1) == 4
    assert together.choose(0, running=8) == best_gamma(compute, e_high, 8) < 4


def test_a_draft_that_skipped_tokens_drafts_again_only_if_the_rounds_left_repay_its_catch_up():
    cost = StepCost({1: 0.020, 8: 0.022, 40: 0.030}, {1: 0.004, 8: 0.005}, draft_row_s=0.001)
    mid = Acceptance(4)
    for _ in range(300):
        mid.count(2, 1)  # one of two drafts accepted: E(1) = 2, E(2) about 2
    e = mid.expected_by_gamma()
    assert best_gamma(cost, e, 8) == 1  # no debt: 29 ms for two tokens a sequence beat 22 ms for one
    e1 = mid.expected_tokens(1)
    # 8 sequences owe 8 x 200 prompt rows (1.6 s of catch-up): with 1,000 tokens left that is 26 ms a round
    # on top of 29, so plain decoding wins; with 20,000 left, 1.3 ms, and drafting still pays.
    assert Debt(1600, 1000).per_step_s(cost, 8, e1) == pytest.approx(1.6 * 8 * e1 / 1000)
    assert best_gamma(cost, e, 8, Debt(1600, 1000)) == 0 and not could_pay(cost, 8, Debt(1600, 1000))
    assert best_gamma(cost, e, 8, Debt(1600, 20000)) == 1 and could_pay(cost, 8, Debt(1600, 20000))


def test_a_lookup_that_proposes_fewer_than_asked_is_priced_by_the_rows_it_proposes():
    """A lookup (n-gram, suffix) often finds fewer than gamma tokens: a round asking for 4 that proposes 1 verifies
    2 rows, not 5. The model counts q_j, the chance position j is proposed, beside c_j (session 22's 0.5B n-gram
    crossover missed by pricing every round at 1 + gamma rows)."""
    look, model = Acceptance(4), Acceptance(4)
    for i in range(400):
        look.count(1 if i % 4 else 0, 1 if i % 4 else 0, asked=4)  # one token proposed in 3 of 4 rounds, all kept
        model.count(4, 1)  # a draft model proposes all 4; one kept
    assert look.proposal_rates()[0] == pytest.approx(0.75, abs=0.01) and look.proposal_rates()[1] < 0.02
    assert model.proposal_rates() == [1.0] * 4 and model.rows_by_gamma() == [1, 2, 3, 4, 5]
    assert look.rows_by_gamma()[4] == pytest.approx(1.75, abs=0.02)
    assert look.expected_by_gamma()[4] == pytest.approx(1.75, abs=0.02)  # each proposed token kept
    assert look.rates()[0] == pytest.approx(1.0, abs=0.01)
    # compute-bound rows at batch 8: 5 rows a sequence cost 2.5x a plain step, 1.75 rows about 1.2x
    cost = StepCost({1: 0.010, 8: 0.020, 14: 0.024, 40: 0.050})
    e, rows = look.expected_by_gamma(), look.rows_by_gamma()
    assert speedup(cost, e, 8, 4) < 1 < speedup(cost, e, 8, 4, rows)  # fixed g = 4 pays: its rounds verify 1.75 rows
    assert speedup(cost, e, 8, 4, rows) == pytest.approx(e[4] * 0.020 / cost.target(8 * rows[4]))
    # asking for more than the lookup finds costs (almost) nothing once priced by its rows: the policy may ask for 4
    assert best_gamma(cost, e, 8) == 1 and best_gamma(cost, e, 8, rows=rows) == 4


def test_a_policy_is_refused_by_name_and_off_means_no_draft():
    with pytest.raises(UserError, match="unknown speculation policy 'sometimes'") as e:
        EngineSetup(draft="ngram", spec_policy="sometimes").validate()
    assert "adaptive" in e.value.fix
    off = EngineSetup(draft="ngram", spec_policy="off").validate()
    assert not off.speculative and off.label == "default@fp32"
    adaptive = EngineSetup(draft="ngram", gamma=4, spec_policy="adaptive").validate()
    assert adaptive.label == "default@fp32 + ngram g<=4 cost-adaptive"
    assert adaptive.to_record()["draft"]["policy"] == "adaptive"
    with pytest.raises(UserError, match="both pick gamma"):
        EngineSetup(draft="ngram", spec_policy="adaptive", adaptive_gamma=True).validate()

    assert SpecPolicy("off", 4).choose(3) == 0 and SpecPolicy("fixed", 4).choose(3) is None  # fixed: each its own
    with pytest.raises(UserError, match="unknown speculation policy 'greedy'"):
        SpecPolicy("greedy", 4)


def _generate(lm, ids, spec, gamma, policy, n=24, settings=SETTINGS):
    sched = Scheduler(lm, settings, spec, gamma, spec_policy=policy)
    sched.prepare()
    seqs = {}
    for i, x in enumerate(ids):
        r = Request(list(x), n, stop_at_eos=False)
        r.on_token = lambda s, *a, i=i: seqs.setdefault(i, s)
        sched.submit(r)
    while sched.has_work():
        sched.step()
    return [list(seqs[i].out) for i in range(len(ids))], sched


class SlowNgram(NgramProposer):
    """n-gram drafts that take 200 ms a pass: no draft length pays unless a target step takes longer than that
    (g drafts commit at most g + 1 tokens for g x 200 ms more), and the 0.5B's takes 20-80 ms on two cores."""

    def propose(self, seqs, gs):
        time.sleep(0.2 * max(gs))
        return super().propose(seqs, gs)


class SlowSpec:
    kind = "ngram"

    def build(self, slots, capacity):
        return SlowNgram()


def test_the_adaptive_policy_is_lossless_and_measures_its_costs_first(small_int4):
    lm = small_int4
    ids = encode_prompts(lm.tokenizer, PROMPTS, chat=True)
    plain, _ = _generate(lm, ids, None, 0, "fixed")
    adaptive, sched = _generate(lm, ids, proposer_spec("ngram"), 4, "adaptive")
    assert adaptive == plain
    cost = sched.policy.cost
    assert {1, 2, 3, 4, 5} <= set(cost.target_s) and {4, 8, 12, 16, 20} & set(cost.target_s)  # batch 1 and 4
    assert sum(sched.policy.steps.values()) > 0 and sched.blocks is None and not sched.preemptions
    assert sum(n for g, n in sched.policy.steps.items() if g) > 0  # copy-heavy prompts: drafting paid
    acc = sched.policy.acceptance  # the lookup found fewer tokens than asked in some rounds, and it was counted
    assert sum(acc.asked) > sum(acc.proposed) > 0 and min(acc.proposal_rates()) < 1


def test_the_policy_picks_gamma_0_when_the_draft_cannot_pay(small_int4):
    lm = small_int4
    ids = encode_prompts(lm.tokenizer, PROMPTS[:2], chat=True)
    one = BatchSettings(max_seqs=1, max_model_len=256, max_batched_tokens=5 + 64, prefill_chunk=64)
    plain, _ = _generate(lm, ids, None, 0, "fixed", settings=one)
    got, sched = _generate(lm, ids, SlowSpec(), 2, "adaptive", settings=one)  # gamma 2: the profile sleeps less
    assert got == plain
    steps, cost = sched.policy.steps, sched.policy.cost
    assert cost.draft(1) > 0.19, cost.to_dict()  # the profile saw the slow draft
    # and its model says: never pays
    assert best_gamma(cost, sched.policy.acceptance.expected_by_gamma(), 1) == 0, cost.to_dict()
    assert steps[0] > 0 and sum(n for g, n in steps.items() if g) <= steps[0] // 32 + 1, steps  # probes only
    fixed, sched = _generate(lm, ids[:1], SlowSpec(), 2, "fixed", n=8, settings=one)
    assert fixed[0] == plain[0][:8] and set(g for g, n in sched.policy.steps.items() if n) == {2}


def test_a_draft_model_that_skipped_the_prompts_catches_up_losslessly(small_int4):
    """While a policy drafts nothing the draft model skips the prompts' chunks; when drafting resumes it
    catches up. The target drafting for itself then accepts every token: its draft cache is right."""
    lm = small_int4
    ids = encode_prompts(lm.tokenizer, PROMPTS[:2], chat=True)
    plain, _ = _generate(lm, ids, None, 0, "fixed")
    sched = Scheduler(lm, SETTINGS, proposer_spec("model", lm, lm), 3)
    sched.policy.force = 0
    seqs = {}
    for i, x in enumerate(ids):
        r = Request(list(x), 24, stop_at_eos=False)
        r.on_token = lambda s, *a, i=i: seqs.setdefault(i, s)
        sched.submit(r)
    for _ in range(8):
        sched.step()
    assert all(s.out for s in seqs.values()) and sched.batch.proposer.fed[:2] == [0, 0]  # nothing fed yet
    sched.policy.force = 3
    while sched.has_work():
        sched.step()
    assert [list(seqs[i].out) for i in range(len(ids))] == plain
    st = [seqs[i].spec_stats for i in range(len(ids))]
    assert sum(s.drafted for s in st) > 0 and sum(s.accepted for s in st) == sum(s.drafted for s in st)
