"""The fused CPU forward pass (engine/ops/fused.py, kernels/cpu/fused_cpu.cpp) on the real models.

Against the PyTorch path (the reference): logits close and the same argmax at M = 1, a ragged batch
of 3 sequences at different positions, gamma + 1 = 5 verification rows of one sequence, and a
70-row prefill (split into calls of 64); on every ISA (AVX-512, AVX2, scalar). The fused path is
exactly row-independent: a row's logits are bit-identical whatever else shares the step. Cases it
does not take fall back to the reference path, and backend_info() (record.kernels) says which ran.
"""
from __future__ import annotations

import pytest
import torch

from engine import ops
from engine.infer.model import Rows, rope_tables
from engine.quant import make_spec

pytestmark = pytest.mark.usefixtures("_default_kernel_settings")


@pytest.fixture()
def _default_kernel_settings():
    with ops.using(ops.KernelConfig()):
        ops.reset_fused_stats()
        yield


IDS = torch.randint(0, 20000, (200,), generator=torch.Generator().manual_seed(7))
# Mean KL between the reference and fused paths with int8 activations: their rounding noise, which
# accumulates through the KV cache (up to ~0.09 measured, AVX2 or AVX-512), is far below a defect's (> 1).
INT8_NOISE_KL = 0.15




def _steps(model, prompt: int = 70):
    """The scenario's forward passes: prefill (70 rows: two fused calls), a second prompt, M = 1, a
    ragged batch of 3 (positions prompt+1, 20, 0), 5 verification rows. Returns their logits."""
    cache = model.new_cache(3, 128)
    f = model.forward_rows
    out = [f(IDS[:prompt], Rows.of([(0, 0, prompt)], "cpu"), cache,
             logits_at=torch.tensor([prompt - 1, 0] + ([63, 64] if prompt > 64 else []))),
           f(IDS[100:120], Rows.of([(1, 0, 20)], "cpu"), cache),
           f(IDS[prompt:prompt + 1], Rows.of([(0, prompt, 1)], "cpu"), cache),
           f(IDS[130:133], Rows.of([(0, prompt + 1, 1), (1, 20, 1), (2, 0, 1)], "cpu"), cache),
           f(IDS[140:145], Rows.of([(0, prompt + 2, 5)], "cpu"), cache)]
    return out


def _check_close(ref, got, what):
    for i, (a, b) in enumerate(zip(ref, got)):
        assert a.shape == b.shape, (what, i)
        err = float((a - b).abs().max())
        # fp32 rounding differences only (measured ~5e-5 on logits of magnitude ~15); a wrong
        # rotation, position or cache slot moves logits by whole units
        assert err < 1e-3 * float(a.abs().max()), f"{what} pass {i}: max |diff| {err:.3g}"
        assert torch.equal(a.argmax(-1), b.argmax(-1)), f"{what} pass {i}: argmax differs"


def _paths(lm, prompt=70, **settings):
    with ops.using(fused=False, **settings):
        ref = _steps(lm.model, prompt)
    ops.reset_fused_stats()
    with ops.using(fused=True, **settings):
        got = _steps(lm.model, prompt)
        info = ops.backend_info()
    assert info["fused_steps"] == 5 and info["reference_steps"] == 0, info   # the 70-row prefill: two calls, one step
    return ref, got


def test_fused_matches_reference(small_int4):
    ref, got = _paths(small_int4, act_int8=False)
    _check_close(ref, got, "0.5B int4")


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_fused_matches_reference_on_lower_isas(small_int4, isa):
    ext = ops.load_cpu_extension(raise_errors=True)
    if not ext.isa_supported(ops.config.ISA_IDS[isa]):
        pytest.skip(f"{isa} not supported here")
    ref, got = _paths(small_int4, 12, act_int8=False, isa=isa)  # a short prompt: the scalar path is slow
    _check_close(ref, got, f"0.5B int4 isa={isa}")


def test_fused_int8_weights_match_reference(small_int8):
    ref, got = _paths(small_int8, 12, act_int8=False)
    _check_close(ref, got, "0.5B int8")
    # int8 activations (the default) reach int8 weights too, in both paths: the same distribution, other bits
    ref8, got8 = _paths(small_int8, 12, act_int8=True)
    for i, (a, b, c) in enumerate(zip(ref8, got8, got)):
        assert _kl(a, b) < INT8_NOISE_KL and _kl(c, b) < INT8_NOISE_KL, f"pass {i}"
        assert not torch.equal(b, c), f"pass {i}: int8 activations did not change the fused int8 step"


def _kl(p_logits, q_logits):
    lp, lq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


@pytest.mark.parametrize("isa", [None, "avx2"])
def test_fused_int8_activations_match_reference_in_distribution(small_int4, isa):
    """With int8 activations the two paths cannot agree to rounding: a 1e-6 change of an input
    moves a rounding boundary (measured: a logit by ~1). They must agree in distribution: the KL
    between them is the size of the int8-activation noise itself, not of a defect (> 1). The noise
    accumulates through each path's own KV cache: on an AMD EPYC with AVX2 only, the slot decoded
    three times (pass 3) reads 0.087 (one row 0.225), against 0.004-0.03 at the first passes."""
    ref, got = _paths(small_int4, 12, act_int8=True, isa=isa)
    for i, (a, b) in enumerate(zip(ref, got)):
        assert _kl(a, b) < INT8_NOISE_KL, f"pass {i}: KL(reference || fused) = {_kl(a, b):.3g}"


@pytest.mark.parametrize("act_int8", [False, True])
def test_fused_rows_are_independent(small_int4, act_int8):
    """A row's logits are bit-identical alone, in a ragged batch, and as verification rows."""
    m = small_int4.model
    with ops.using(fused=True, act_int8=act_int8):
        base = m.new_cache(3, 64)
        m.forward_rows(IDS[:30], Rows.of([(0, 0, 30)], "cpu"), base)
        m.forward_rows(IDS[30:42], Rows.of([(1, 0, 12)], "cpu"), base)
        toks = torch.stack([IDS[50], IDS[51], IDS[52]])
        segs = [(0, 30, 1), (1, 12, 1), (2, 0, 1)]
        batch = m.forward_rows(toks, Rows.of(segs, "cpu"), base.clone())
        for i, seg in enumerate(segs):
            alone = m.forward_rows(toks[i:i + 1], Rows.of([seg], "cpu"), base.clone())
            assert torch.equal(alone[0], batch[i]), f"row {i} differs alone vs in the batch"
        # verification: 5 rows of slot 0 in one pass == 5 single steps in sequence
        c1, c2 = base.clone(), base.clone()
        ver = m.forward_rows(IDS[60:65], Rows.of([(0, 30, 5)], "cpu"), c1)
        for j in range(5):
            one = m.forward_rows(IDS[60 + j:61 + j], Rows.of([(0, 30 + j, 1)], "cpu"), c2)
            assert torch.equal(one[0], ver[j]), f"verification row {j} differs from its single step"
        assert torch.equal(c1.k[:, 0, :, :35], c2.k[:, 0, :, :35])
    assert ops.fused_info()["reference_steps"] == 0


def test_fused_greedy_tokens_equal_reference(small_int4):
    from engine.infer.generate import generate

    prompt = "def fibonacci(n):"
    with ops.using(fused=False, act_int8=False):
        ref = generate(small_int4, [prompt], 24, stop_at_eos=False)
    with ops.using(fused=True, act_int8=False):
        got = generate(small_int4, [prompt], 24, stop_at_eos=False)
    assert ops.fused_info()["fused_steps"] > 20
    assert got.new_tokens == ref.new_tokens


def test_separate_projections_run_fused_with_the_same_numbers(small_int4):
    """A model converted with fuse=False (separate q/k/v and gate/up: the A/B of SCL_FUSE=0) takes
    the fused step too, with bit-identical logits: the same rows of the same weights, tile for tile."""
    from engine.infer.loader import load

    with ops.using(fuse=False):
        sep = load("default-draft", make_spec("int4"), "cpu")
    assert sep.model.model.layers[0].self_attn.qkv_proj is None
    for act in (False, True):
        with ops.using(act_int8=act):
            outs = []
            for lm in (sep, small_int4):
                cache = lm.model.new_cache(1, 32)
                outs.append(lm.model.forward_rows(IDS[:9], Rows.of([(0, 0, 9)], "cpu"), cache))
                outs.append(lm.model.forward_rows(IDS[9:10], Rows.of([(0, 9, 1)], "cpu"), cache))
        assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3]), act
    assert ops.fused_info()["reference_steps"] == 0


def test_a_model_mixed_layer_by_layer_runs_fused_with_the_references_numbers(pool):
    """The 0.5B's own GGUF (int4-gguf): ffn_down is Q4_K (int4 here) in 12 layers and Q6_K (int8) in the
    other 12, q/k/v/o and gate/up int8 (Q5_0, Q8_0), the head int8: the step prepares each phase's input
    for its consumers' formats, layer by layer (a mixed model used to fall back to the PyTorch path)."""
    from engine.quant.layers import Int4Linear

    lm = pool.get("default-draft", make_spec("int4-gguf"), "cpu")
    down = [type(b.mlp.down_proj) is Int4Linear for b in lm.model.model.layers]
    assert 0 < sum(down) < len(down), down
    for act in (False, True):
        ref, got = _paths(lm, 12, act_int8=act)
        if act:
            assert all(_kl(a, b) < INT8_NOISE_KL for a, b in zip(ref, got))
        else:
            _check_close(ref, got, "0.5B int4-gguf")


def test_fallbacks_are_recorded(small_int4):
    from tests.tiny import make_tiny

    m = small_int4.model
    with ops.using(fused=False):
        m.forward_rows(IDS[:3], Rows.of([(0, 0, 3)], "cpu"), m.new_cache(1, 8))
    info = ops.backend_info()
    assert info["reference_steps"] == 1 and info["fused_steps"] == 0
    assert "fused step off" in info["reference_reasons"]
    tiny = make_tiny("tiny", make_spec("int4"), "cpu").model   # head_dim 8: not a shape the C++ side has
    tiny.forward_rows(torch.tensor([1, 2]), Rows.of([(0, 0, 2)], "cpu"), tiny.new_cache(1, 8))
    reasons = ops.backend_info()["reference_reasons"]
    assert any("head_dim 8" in r for r in reasons), reasons
    assert ops.backend_info()["last_step"].startswith("reference: ")
    m.forward_rows(IDS[:3], Rows.of([(0, 0, 3)], "cpu"), m.new_cache(1, 8))
    assert ops.backend_info()["last_step"] == "fused" and ops.backend_info()["fused"].startswith("on")
    # the C++ call's row workspace holds 64 rows: more is refused there, and split by engine.ops
    ext = ops.load_cpu_extension(raise_errors=True)
    plan = ops.fused._plans[m][1]
    cache = m.new_cache(1, 80)
    with pytest.raises(RuntimeError, match="1..64 rows"):
        ext.fused_step(plan, torch.zeros(65, m.cfg.hidden_size), [0, 0, 65, 0], cache.k, cache.v,
                       torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.float16),
                       torch.empty(0, dtype=torch.float16), [0], 2, True, False, 1)
    assert ops.fused.split_rows([(0, 0, 100, 5), (3, 100, 40, 0)], 64) == [
        (0, 64, [(0, 0, 64, 5)]), (64, 64, [(0, 0, 36, 69), (3, 36, 28, 0)]), (128, 12, [(3, 0, 12, 28)])]


def test_rope_frequencies_are_the_models():
    from engine.infer.model import ModelConfig

    cfg = ModelConfig(vocab_size=8, hidden_size=64, intermediate_size=64, num_layers=1, num_heads=1, num_kv_heads=1,
                      head_dim=64, rope_theta=1e6)
    (cos, _), = rope_tables(cfg, Rows.of([(0, 1, 1)], "cpu")).values()
    assert torch.equal(cos[0, 0, :32], torch.cos(ops.rope.rope_inv_freq(64, 1e6)))


@pytest.mark.slow
def test_fused_matches_reference_1p5b(big_int4):
    """The 1.5B's shape through the scenario's five passes (prefill, a second prompt, a decode step, a ragged
    batch, verification rows; argmax equal on each): the 64-row split is the 0.5B's test's, so a short prompt."""
    ref, got = _paths(big_int4, 12, act_int8=False)
    _check_close(ref, got, "1.5B int4")


def test_cuda_graph_step_logic_on_cpu(small_int4):
    """The graph-capturable GPU decode step (engine/ops/cuda_graph.py), run eagerly in its torch
    form on CPU, equals forward_rows: the same RoPE, K/V writes, per-sequence attention lengths and
    residual/norm order that its CUDA kernels implement (those are checked on a GPU by
    bench/gpu_kernels.sh)."""
    from engine.ops.cuda_graph import decode_step

    m = small_int4.model
    with ops.using(fused=False, act_int8=False):
        base = m.new_cache(3, 64)
        m.forward_rows(IDS[:30], Rows.of([(0, 0, 30)], "cpu"), base)
        m.forward_rows(IDS[30:42], Rows.of([(1, 0, 12)], "cpu"), base)
        toks = torch.stack([IDS[50], IDS[51], IDS[52]])
        c1, c2 = base.clone(), base.clone()
        ref = m.forward_rows(toks, Rows.of([(2, 0, 1), (0, 30, 1), (1, 12, 1)], "cpu"), c1)
        got = decode_step(m, toks, torch.tensor([2, 0, 1]), torch.tensor([0, 30, 12]), c2, use_kernels=False)
    _check_close([ref], [got], "graph step (torch form)")
    torch.testing.assert_close(c2.k, c1.k, rtol=0, atol=1e-4)
    torch.testing.assert_close(c2.v, c1.v, rtol=0, atol=1e-4)
