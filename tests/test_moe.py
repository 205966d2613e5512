"""Mixture of experts (Mixtral, Qwen3-MoE) on tiny random-init models built by transformers:
int8/int4 experts with a float router, the experts each step touches against the planner's formula,
and speculative decoding on an MoE target, greedy and sampled, lossless."""
import random

import pytest
import torch

from engine.common.fields import M
from engine.infer import moe
from engine.infer.generate import generate
from engine.infer.loader import load, make_spec
from engine.infer.sampling import SamplingParams
from engine.infer.speculative import ProposerSpec, generate_speculative, proposer_spec
from engine.measure.quality import compare, eval_ids, logprobs
from engine.planner.counts import expected_experts_touched
from engine.quant import Int4Linear, Int8Linear
from tests import families
from tests.test_speculative import N_SAMPLES, SP, _spec_counts, _target_two_token_dist, _tv, _tv_bound

FAMILIES = ("mixtral", "qwen3-moe")
E, K = 8, 2  # experts, experts per token: E(1 - (1 - k/E)^T) is 2 at T=1 and 6.10 at T=5, far from both ends
GAMMA = 4


def experts_override(family: str, experts: int = E) -> dict:
    return {"num_local_experts" if family == "mixtral" else "num_experts": experts, "num_experts_per_tok": K}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One tiny folder per family (2 sparse layers, 8 experts of width 128 or 64: int4 groups of 64 fit)."""
    made = {}

    def get(family: str, name: str = "target", **overrides):
        key = (family, name)
        if key not in made:
            made[key] = families.build(family, tmp_path_factory.mktemp(f"{family}-{name}"),
                                       **{"num_hidden_layers": 2, **experts_override(family), **overrides})
        return made[key]
    return get


@pytest.fixture(scope="module")
def models(folder):
    cache = {}

    def get(family: str, precision: str = "fp32", name: str = "target", **overrides):
        key = (family, precision, name)
        if key not in cache:
            cache[key] = load(str(folder(family, name, **overrides)), make_spec(precision), "cpu")
        return cache[key]
    return get


def sparse_blocks(lm):
    return [blk.mlp for blk in lm.model.model.layers if isinstance(blk.mlp, moe.SparseMoE)]


# ---------------------------------------------------------------- int8 / int4 experts, float router

@pytest.mark.parametrize("family", FAMILIES)
def test_experts_quantized_router_float_within_the_kl_bounds(models, family):
    """Every expert's linears are our int8/int4 layers (gate/up fused per expert, as the dense MLP's), the
    router stays an fp32 nn.Linear; each MoE layer's error is the format's, and the model stays within the
    KL bounds tests/test_quant.py holds the real Qwen model to (int8 < 0.01, int4 < 0.25 nats/token).

    On a random-init model the end-to-end KL alone is a weak check: its outputs are near uniform (entropy
    ~5.9 of ln 384 = 5.95 nats), so even experts swapped between slots stay inside 0.25. The per-layer check
    is the one that can fail: the same input through the fp32 and the quantized MoE layer, routed alike by
    the float router, differs by the format's rounding (measured: int8 1.0%, int4 15-16% of the output;
    int8 activations included), while experts in the wrong slots differ by 1.2-1.4, about sqrt(2), the
    distance of two unrelated outputs (and their end-to-end KL, 2-4e-4, is int4's). Top-1 agreement is not
    asserted: on near-uniform outputs it is decided by near-ties, not by quantization quality."""
    ref = models(family)
    ids = eval_ids(ref.tokenizer, 256)
    ref_lp = logprobs(ref, ids)
    inputs = []
    hooks = [m.register_forward_hook(lambda mod, args, out: inputs.append(args[0])) for m in sparse_blocks(ref)]
    with torch.inference_mode():
        ref.model(torch.tensor([ids[:64]]), 0, ref.model.new_cache(1, 64))
    for h in hooks:
        h.remove()
    kls = {}
    for precision, layer_type, layer_bound, kl_bound in (("int8", Int8Linear, 0.03, 0.01),
                                                           ("int4", Int4Linear, 0.25, 0.25)):
        lm = models(family, precision)
        for fp, q, x in zip(sparse_blocks(ref), sparse_blocks(lm), inputs):
            assert type(q.gate) is torch.nn.Linear and q.gate.weight.dtype == torch.float32
            assert torch.equal(q.gate.weight, fp.gate.weight)  # the router is not rounded
            for ex in q.experts:
                assert ex.gate_proj is None and isinstance(ex.gate_up_proj, layer_type)
                assert isinstance(ex.down_proj, layer_type)
            with torch.inference_mode():
                want, got = fp(x), q(x)
            rel = float((got - want).norm() / want.norm())
            assert 0 < rel < layer_bound, (precision, rel)
        q = compare(ref_lp, logprobs(lm, ids), ids)
        assert 0 < q["kld_mean"] < kl_bound, (precision, q["kld_mean"])
        kls[precision] = q["kld_mean"]
        # the experts hold the format's bytes: int4 about 1/7 of fp32 (4 bits plus a scale and min per 64)
        assert lm.weights["mlp"] < (0.27 if precision == "int8" else 0.16) * ref.weights["mlp"]
    assert kls["int8"] < kls["int4"]


def test_the_fused_step_declines_moe_by_name(models):
    """An int4 MoE model runs the PyTorch path, and the run's kernel counters say why."""
    from engine import ops

    lm = models("mixtral", "int4")
    with ops.count_steps() as c, torch.inference_mode():
        lm.model(torch.tensor([[5, 6, 7]]), 0, lm.model.new_cache(1, 8))
    assert c.fused == 0 and any("moe" in r for r in c.reasons), c.as_dict()


# ---------------------------------------------------------------- experts touched against the formula

class RandomDrafts:
    """Drafts uniformly random tokens, so a verification pass's rows are unrelated tokens (duck-typed proposer)."""

    kind, has_probs = "ngram", False

    def __init__(self, vocab: int, seed: int):
        self.vocab, self.rng = vocab, random.Random(seed)

    def build(self, slots, capacity):
        return self

    def propose(self, seqs, gs):
        return [[self.rng.randrange(3, self.vocab) for _ in range(g)] for g in gs], None

    def prefill(self, chunks):
        pass

    def rollback(self, seq):
        pass

    def free(self, slot):
        pass

    def kv_bytes(self):
        return 0


def token_routed(family, tmp_path_factory):
    """The family's tiny model with its embeddings scaled by 10, saved as a folder: each row's routing is then
    a function of its own token (see the test below)."""
    path = tmp_path_factory.mktemp(f"{family}-token-routed")
    m = families.hf_model(family, 0, num_hidden_layers=2, **experts_override(family))
    with torch.no_grad():
        m.model.embed_tokens.weight.mul_(10)
    m.save_pretrained(path)
    families.tokenizer().save_pretrained(path)
    return path


def measure_touches(lm, gens: int = 8, tokens: int = 32):
    with moe.count_expert_touches() as t:
        for seed in range(gens):
            generate_speculative(lm, RandomDrafts(lm.cfg.vocab_size, seed), ["def fibonacci(n):"], tokens, GAMMA,
                                 sampling=SamplingParams(1.0, 0, 1.0, seed), chat=False)
    return t


def expected(t, kind):
    rows = t.by_kind[kind]
    return sum(n * expected_experts_touched(E, K, r) for r, (n, _) in rows.items()) / t.layer_passes(kind)


@pytest.mark.parametrize("family", FAMILIES)
def test_experts_touched_match_the_planners_formula(models, tmp_path_factory, family):
    """Decode passes (T = 1 row) touch exactly k experts per layer; verification passes (T = gamma + 1 rows)
    touch E(1 - (1 - k/E)^T) when the rows route independently, and fewer when they do not.

    T = gamma + 1, rows of unrelated tokens (random drafts), on two models:
    - token-routed (embeddings x10): each row's routing depends on its own token only, the formula's
      assumption. Tolerance 5%: the formula is the largest expectation any routing frequencies give
      independent rows (it is concave in each expert's frequency), so a measurement exceeds it only by noise;
      one layer pass's count has sd 0.87 (E = 8, k = 2, T = 5), so ~500 layer passes give a standard error of
      0.6%, 3 of them 2%; unequal expert popularity from a random router (measured frequencies 0.25 +- 11-21%)
      lowers the expectation by 0.4-1.3% (its second-order term, 1/2 T (T-1) (1 - k/E)^(T-2) sum (p_e - k/E)^2),
      under 3% for any spread up to 30%.
    - as initialised (std 0.02): the attention output, averaged over the context every row of the pass shares,
      is as large as a row's own token embedding, so the rows route alike and touch fewer experts: measured
      0.95 of the formula. Asserted: no more than the formula (+ 3% noise), and above 0.8 of it (well above k).
    Measured on the token-routed models: 1.00 (Mixtral) and 0.99 (Qwen3-MoE) of the formula."""
    tuned = load(str(token_routed(family, tmp_path_factory)), "fp32", "cpu")
    plain = models(family)
    for lm, gens, low, high in ((tuned, 8, 0.95, 1.05), (plain, 4, 0.8, 1.03)):
        t = measure_touches(lm, gens)
        assert set(t.by_kind.get("decode", {})) <= {1} and t.mean("decode") in (None, K)  # a decode row: k exactly
        assert set(t.by_kind["verify"]) <= set(range(2, GAMMA + 2)) and t.layer_passes("verify") >= 50 * gens
        ratio = t.mean("verify") / expected(t, "verify")
        assert low < ratio < high, (lm.name, t.mean("verify"), expected(t, "verify"))
    # plain decode: T = 1, one pass per new token after the first and per sparse layer
    with moe.count_expert_touches() as t:
        out = generate(plain, ["def fibonacci(n):"], 16, chat=False, stop_at_eos=False)
    assert t.by_kind["decode"] == {1: [(out.n_new - 1) * 2, (out.n_new - 1) * 2 * K]}
    assert expected(t, "decode") == K and set(t.by_kind) == {"prefill", "decode"}


def test_draft_passes_are_not_counted(models):
    """A self-draft of an MoE target is an MoE model too: only the target's passes count."""
    target, draft = models("qwen3-moe"), models("qwen3-moe", "int4")
    with moe.count_expert_touches() as t:
        out = generate_speculative(target, proposer_spec("self", draft, target), ["x = [1, 2, 3]"], 12, GAMMA,
                                   chat=False, stop_at_eos=False)
    # 2 sparse layers: one prefill pass, one verification pass per round (and a last one-row step without drafts)
    assert t.layer_passes("prefill") == 2 and t.layer_passes("verify") == 2 * out.spec["rounds"]
    assert t.layer_passes("decode") <= 2
    with pytest.raises(ValueError, match="step kind"):
        with moe.step_kind("draft"):
            pass


# ---------------------------------------------------------------- speculation on an MoE target

PROMPTS = ["def fibonacci(n):", "The quick brown fox"]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_speculative_identical_on_moe_targets(models, family):
    """Greedy speculative output equals plain greedy output token for token, for a batch of two, with a
    self-draft (int4), n-gram and a smaller model of the family (1 layer, another seed) as drafts; and on
    an int8 target with int4 experts drafting."""
    target = models(family)
    small = models(family, "fp32", "small", num_hidden_layers=1, seed=1)
    ref = generate(target, PROMPTS, 32, chat=False, stop_at_eos=False)
    for kind, draft in (("self", models(family, "int4")), ("ngram", None), ("model", small)):
        out = generate_speculative(target, proposer_spec(kind, draft, target), PROMPTS, 32, GAMMA, chat=False,
                                   stop_at_eos=False)
        assert out.new_tokens == ref.new_tokens, kind
        assert out.spec["drafted"] > 0, kind
    target8 = models(family, "int8")
    ref8 = generate(target8, PROMPTS, 24, chat=False, stop_at_eos=False)
    out8 = generate_speculative(target8, proposer_spec("self", models(family, "int4"), target8), PROMPTS, 24, GAMMA,
                                chat=False, stop_at_eos=False)
    assert out8.new_tokens == ref8.new_tokens


def peaky(family: str, path, seed: int = 0, layers: int = 2):
    """A vocabulary-6 MoE whose head is scaled by 15, so its next-token distributions are far from uniform (the
    two-token joint has entropy ~2.1-2.5 nats of ln 36 = 3.6): sampling from the wrong one shows."""
    m = families.hf_model(family, seed, vocab_size=6, num_hidden_layers=layers, **experts_override(family, 4))
    with torch.no_grad():
        m.lm_head.weight.mul_(15)
    m.save_pretrained(path)
    families.tokenizer().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("family, kind", [("mixtral", "model"), ("qwen3-moe", "self")])
def test_speculative_sampling_lossless_on_moe_targets(tmp_path, family, kind):
    """tests/test_speculative.py's statistical test on an MoE target: the 2nd and 3rd sampled tokens (the
    first speculative round) are distributed as the target alone samples them (its exact joint). The verification
    pass routes its gamma + 1 rows together; the exact joint routes one position at a time. One draft kind per
    family, each an MoE model itself (a smaller one of the family; the target's int4 self-draft): what is MoE here
    is the target's verification, which every kind exercises alike; each kind's own acceptance rule is tested on
    dense targets (test_speculative.py) and greedy on these targets (above). 1,200 samples per kind, 200 requests
    a batch, cost 2-6 s on a 2-core AVX2 host."""
    path = peaky(family, tmp_path / "target")
    target = load(path, "fp32", "cpu")
    draft = (load(path, "int4", "cpu") if kind == "self"
             else load(peaky(family, tmp_path / "small", seed=1, layers=1), "fp32", "cpu"))
    joint = _target_two_token_dist(target, [1, 2, 3], SamplingParams(**SP))
    counts = _spec_counts(target, lambda: ProposerSpec(kind, draft), [1, 2, 3], SP, N_SAMPLES)
    assert _tv(counts, joint) < _tv_bound(joint, N_SAMPLES), kind


# ---------------------------------------------------------------- the run record

def test_run_record_counts_experts_per_verification_step(folder):
    """A measured speculative run on an MoE target records the experts each verification pass touched, beside
    a plain decode pass's (its paired baseline) and the planner's expectation for both; a dense target's
    record has none of it."""
    from engine.measure.pool import ModelPool
    from engine.measure.records import RunRecord
    from engine.measure.runs import RunConfig, execute

    path = str(folder("mixtral"))
    rec = execute(RunConfig.of(model=path, precision="int8", draft="self", draft_precision="int4", gamma=GAMMA,
                               max_new_tokens=16, reps=1, prompt="def fibonacci(n):", chat=False, baseline=True,
                               warmup=False), ModelPool())
    m = RunRecord.from_json(rec.to_json()).metrics
    assert m[M.experts_touched_decode] == K
    assert K < m[M.experts_touched_verify] <= E
    by = m[M.experts_touched]["by_kind"]
    assert by["decode"]["expected"] == K and K < by["verify"]["expected"] <= expected_experts_touched(E, K, GAMMA + 1)
    assert m[M.experts_touched]["experts"] == E and m[M.experts_touched]["experts_per_token"] == K
    n, total = map(sum, zip(*by["verify"]["by_rows"].values()))
    assert n == by["verify"]["layer_passes"] and total / n == pytest.approx(m[M.experts_touched_verify])
    assert any("moe" in r for r in rec.kernels["reference_reasons"])  # the PyTorch path ran, and says why

    dense = str(families.build("llama", folder("mixtral").parent / "llama"))
    rec = execute(RunConfig.of(model=dense, precision="fp32", draft="ngram", max_new_tokens=4, reps=1,
                               prompt="def f(x):", chat=False, warmup=False), ModelPool())
    assert not {M.experts_touched, M.experts_touched_decode, M.experts_touched_verify} & set(rec.metrics)
