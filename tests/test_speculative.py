"""Speculative decoding: lossless greedy on real models, lossless sampling shown statistically."""
import math

import pytest
import torch

from engine.infer import speculative
from engine.common.errors import UserError
from engine.infer.generate import generate
from engine.infer.batch import Request
from engine.infer.sampling import SamplingParams, probs_from_logits
from engine.infer.scheduler import BatchSettings, Scheduler
from engine.common.formulas import expected_length
from engine.infer.spec_stats import SpecStats
from engine.infer.speculative import generate_speculative, proposer_spec
from engine.infer.verify import verify
from tests.scheduling import run_to_end
from tests.tiny import tiny_model

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Write a Python function that reverses a linked list."]


@pytest.fixture(scope="module")
def plain_fp32(small_fp32):
    """The 0.5B's plain greedy tokens (40) for the first `batch` prompts, generated once per batch size for every
    test below that compares against them (4 s each on 2 cores)."""
    made = {}

    def tokens(batch: int) -> list:
        if batch not in made:
            made[batch] = generate(small_fp32, PROMPTS[:batch], 40).new_tokens
        return made[batch]
    return tokens


@pytest.mark.parametrize("kind,draft_fixture", [("ngram", None), ("self", "small_int4"), ("self", "small_int8")])
@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_speculative_identical_small_target(small_fp32, plain_fp32, request, kind, draft_fixture, batch):
    draft = request.getfixturevalue(draft_fixture) if draft_fixture else None
    out = generate_speculative(small_fp32, proposer_spec(kind, draft, small_fp32), PROMPTS[:batch], 40, gamma=4)
    assert out.new_tokens == plain_fp32(batch)
    st = out.spec
    assert st["drafted"] > 0 and 0 <= st["accepted"] <= st["drafted"]
    if kind == "self":  # the target's own weights at lower precision agree most of the time
        assert st["acceptance_rate"] > 0.5
    assert sum(len(t) for t in out.trace) == out.n_new


@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_speculative_identical_default_pair(big_int4, small_int4, batch):
    """The default pair: 1.5B target (int4) drafted by the 0.5B (int4), and by its own int4 copy adaptively."""
    ref = generate(big_int4, PROMPTS[:batch], 32)
    out = generate_speculative(big_int4, proposer_spec("model", small_int4, big_int4), PROMPTS[:batch], 32, gamma=3)
    assert out.new_tokens == ref.new_tokens
    assert out.spec["acceptance_rate"] > 0.3  # same family: most drafts should be right


def test_adaptive_gamma_changes_and_stays_lossless(small_fp32, plain_fp32, small_int4):
    out = generate_speculative(small_fp32, proposer_spec("self", small_int4, small_fp32), PROMPTS[:1], 40,
                               gamma=8, adaptive=True)
    assert out.new_tokens == plain_fp32(1)
    hist = out.spec["gamma_history"]
    assert max(hist) > 2 and len(set(hist)) > 1
    assert hist[0] == 2  # the heuristic's own start (min(2, gamma)): not overridden by the scheduler's policy


def test_trace_marks_origins(small_fp32, small_int4):
    out = generate_speculative(small_fp32, proposer_spec("self", small_int4, small_fp32), PROMPTS[:1], 24, gamma=4)
    kinds = set(out.trace[0])
    assert kinds <= {"target", "accepted", "bonus", "resample"}
    assert "accepted" in kinds and out.trace[0][0] == "target"
    s = out.spec
    assert s["mean_acceptance_length"] == pytest.approx(s["emitted"] / s["rounds"])
    assert 1.0 <= s["mean_acceptance_length"] <= 5.0


# ---------------------------------------------------------------- lossless sampling, statistically

def _target_two_token_dist(target, prompt, sp):
    """Exact distribution of the 2nd and 3rd sampled tokens under the target alone.

    The 1st token comes from prefill; the 2nd and 3rd come from the first speculative round.
    """
    m = target.model
    v = target.cfg.vocab_size

    def probs(ctx):
        with torch.inference_mode():
            return probs_from_logits(m(torch.tensor([ctx]), 0, m.new_cache(1, len(ctx)))[:, -1], sp)[0]

    joint = torch.zeros(v, v)
    p1 = probs(prompt)
    for a in range(v):
        p2 = probs(prompt + [a])
        for b in range(v):
            joint[b] += p1[a] * p2[b] * probs(prompt + [a, b])
    return joint


def _spec_counts(target, proposer_fn, prompt, sp_kw, n, gamma=3):
    """Counts of the (2nd, 3rd) tokens over n samples: n requests of one prompt, seeds 0..n-1, ROWS of them
    batched in one scheduler (each request samples from its own generator, as the server's do), so n independent
    samples whose verification ran in batches of ROWS rows."""
    v = target.cfg.vocab_size
    counts = torch.zeros(v, v)
    drafted = 0
    for start in range(0, n, ROWS):
        rows = min(ROWS, n - start)
        settings = BatchSettings(max_seqs=rows, max_model_len=len(prompt) + 4 + gamma + 2,
                                 max_batched_tokens=rows * max(len(prompt), gamma + 1) + len(prompt),
                                 prefill_chunk=len(prompt), max_waiting=rows,
                                 policy="prefill-first")
        reqs = [Request(list(prompt), 4, SamplingParams(**sp_kw, seed=seed), stop_at_eos=False, request_id=str(seed))
                for seed in range(start, start + rows)]
        for seq in run_to_end(Scheduler(target, settings, proposer_fn(), gamma), reqs):
            drafted += seq.spec_stats.drafted
            b, c = seq.out[1:3]
            counts[b, c] += 1
    assert counts.sum() == n and drafted > n // 2, "the proposer must actually draft for this test to mean anything"
    return counts


def _tv(counts, joint):
    return 0.5 * (counts / counts.sum() - joint).abs().sum().item()


def _tv_bound(joint, n, false_fail=1e-3):
    """A bound on the total-variation distance of an n-sample empirical distribution from the truth.

    E[TV] <= 0.5 * sum sqrt(p (1-p) / n); TV is 1/n-Lipschitz in each sample (McDiarmid), so
    P(TV > E + t) <= exp(-2 n t^2). With t = sqrt(ln(1/false_fail) / (2n)) a correct sampler fails
    this test with probability below false_fail.
    """
    mean = 0.5 * torch.sqrt(joint * (1 - joint) / n).sum().item()
    return mean + math.sqrt(math.log(1 / false_fail) / (2 * n))


N_SAMPLES = 1200
# Requests per scheduler batch in _spec_counts (one run per sample took 28 s for the three checks below on a
# 2-core AVX2 host; batched, 5 s).
ROWS = 200


SP = dict(temperature=1.0, top_k=0, top_p=1.0)


def test_speculative_sampling_reproduces_target_distribution_with_good_and_bad_drafts(one_thread):
    target = tiny_model(seed=1, vocab=6)
    good = tiny_model(seed=1, vocab=6, temp=0.9)  # similar to the target
    bad = tiny_model(seed=7, vocab=6, temp=2.0)  # a deliberately poor, peaky draft
    prompt = [1, 2, 3]
    joint = _target_two_token_dist(target, prompt, SamplingParams(**SP))
    bound = _tv_bound(joint, N_SAMPLES)
    for draft in (good, bad):
        counts = _spec_counts(target, lambda d=draft: speculative.ProposerSpec("model", d), prompt, SP, N_SAMPLES)
        assert _tv(counts, joint) < bound, draft.name
    counts = _spec_counts(target, lambda: speculative.NgramProposer(), [1, 2, 3, 1, 2], SP, N_SAMPLES)
    assert _tv(counts, _target_two_token_dist(target, [1, 2, 3, 1, 2], SamplingParams(**SP))) < bound


def test_statistical_test_catches_a_wrong_verifier(monkeypatch, one_thread):
    """The same test must fail for a verifier that accepts every draft token (sampling from q)."""
    target = tiny_model(seed=1, vocab=6)
    bad = tiny_model(seed=7, vocab=6, temp=2.0)
    prompt = [1, 2, 3]
    joint = _target_two_token_dist(target, prompt, SamplingParams(**SP))

    def accept_all(p, q, d, sp, gen):
        g = d.shape[1]
        return torch.full((d.shape[0],), g), torch.multinomial(p[:, g], 1, generator=gen)[:, 0]

    from engine.infer import batch

    monkeypatch.setattr(batch, "verify", accept_all)  # the verifier the batch step calls
    counts = _spec_counts(target, lambda: speculative.ProposerSpec("model", bad), prompt, SP, N_SAMPLES)
    assert _tv(counts, joint) > _tv_bound(joint, N_SAMPLES)


def test_verify_rejection_resamples_from_residual():
    """One position, exact: P(out = x) must equal p(x) for p, q fixed."""
    p = torch.tensor([[[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]]])
    q = torch.tensor([[[0.1, 0.1, 0.8]]])
    gen = torch.Generator().manual_seed(0)
    n = 20000  # as n sequences of one step (one call each took 7.6 s on a 2-core AVX2 host)
    sp = SamplingParams(temperature=1.0, seed=0)
    d = torch.multinomial(q[0, 0], n, replacement=True, generator=gen)[:, None]
    acc, nxt = verify(p.expand(n, -1, -1), q.expand(n, -1, -1), d, sp, gen)
    counts = torch.bincount(torch.where(acc == 1, d[:, 0], nxt), minlength=3)
    assert (counts / n - p[0, 0]).abs().max() < 0.015


def test_verify_deterministic_draft_resamples_without_the_draft_token():
    """n-gram drafts (q None: q one-hot on d), exact in distribution: P(out = x) = p(x)."""
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]])
    n = 40000
    gen = torch.Generator().manual_seed(1)
    sp = SamplingParams(temperature=1.0, seed=1)
    d = torch.full((n, 1), 2)
    acc, nxt = verify(p.expand(n, -1, -1), None, d, sp, gen)
    out = torch.where(acc == 1, d[:, 0], nxt)
    assert (torch.bincount(out, minlength=3) / n - p[0]).abs().max() < 0.01
    assert not bool((nxt[acc == 0] == 2).any())  # a rejected draft token is never resampled
    assert abs(float((acc == 1).double().mean()) - 0.2) < 0.01


def test_verify_is_the_ops_rule_with_uniforms_from_gen():
    """One verifier: verify() draws u [B, g+1] from gen and applies engine.ops.verify_drafts; a
    deterministic draft gives exactly what its one-hot q gives."""
    from engine import ops

    g = torch.Generator().manual_seed(3)
    b, k, v = 32, 4, 40
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 2, -1)
    d = torch.multinomial(q.reshape(-1, v), 1, generator=g).view(b, k)
    sp = SamplingParams(temperature=1.0, seed=5)
    got = verify(p, q, d, sp, torch.Generator().manual_seed(5))
    u = torch.rand((b, k + 1), generator=torch.Generator().manual_seed(5))
    want = ops.verify_drafts(p, q, d, u)
    assert all(torch.equal(a, w) for a, w in zip(got, want))
    one_hot = torch.nn.functional.one_hot(d, v).float()
    a0, n0 = verify(p, None, d, sp, torch.Generator().manual_seed(9))
    a1, n1 = verify(p, one_hot, d, sp, torch.Generator().manual_seed(9))
    assert torch.equal(a0, a1) and torch.equal(n0, n1)
    # greedy: the argmax-prefix rule, the draws untouched
    best = p.argmax(-1)
    d2 = best[:, :k].clone()
    d2[::2, 1] = (d2[::2, 1] + 1) % v  # every other sequence diverges at position 1
    acc, nxt = verify(p, None, d2, SamplingParams(), None)
    assert acc.tolist() == [1 if i % 2 == 0 else k for i in range(b)]
    assert torch.equal(nxt, best.gather(1, acc[:, None]).squeeze(1))


def test_expected_length_formula():
    assert expected_length(0.0, 4) == 1.0
    assert expected_length(1.0, 4) == 5.0
    assert expected_length(0.5, 2) == pytest.approx(1.75)
    s = SpecStats("model", 4, False, rounds=2, drafted=8, accepted=6, emitted=8, gamma_history=[4, 4])
    assert s.acceptance_rate == 0.75 and s.mean_acceptance_length == 4.0


# ---------------------------------------------------------------- bad input

def test_bad_gamma_and_sampling_refused(small_fp32):
    for g in (0, -1, 1000):
        with pytest.raises(UserError, match="gamma"):
            generate_speculative(small_fp32, proposer_spec("ngram"), "hi", 4, gamma=g)
    with pytest.raises(UserError, match="top_p"):
        generate_speculative(small_fp32, proposer_spec("ngram"), "hi", 4, sampling=SamplingParams(1.0, 0, 1.5))
    with pytest.raises(UserError, match="temperature"):
        generate(small_fp32, "hi", 4, SamplingParams(-1.0))


def test_draft_with_other_tokenizer_refused(small_fp32, small_int4):
    import copy

    other = copy.copy(small_int4)
    tok = copy.deepcopy(small_int4.tokenizer)
    tok.add_tokens(["<zzz_new_token>"])
    other.tokenizer = tok
    with pytest.raises(UserError, match="zzz_new_token"):
        proposer_spec("model", other, small_fp32)
    with pytest.raises(UserError, match="draft kind"):
        proposer_spec("medusa", small_int4, small_fp32)


def test_draft_precision_device_cannot_run_refused():
    from engine.infer.loader import load

    with pytest.raises(UserError, match="fp8"):
        load("default-draft", "fp8", "cpu")
