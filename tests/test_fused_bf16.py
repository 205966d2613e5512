"""A bf16 model in the fused C++ step (kernels/cpu/fused_bf16.h, engine/ops/fused.py).

What the step computes for a bf16 model is written down once (fused_bf16.h): each linear's input rounded to bf16,
exact products with the bf16 weights, fp32 sums and everything between the linears in fp32, K and V stored in
bf16. ``_definition`` is that arithmetic in PyTorch: the fp32 model holding the bf16 model's values, a hook that
rounds every linear's input, a cache that rounds what it stores. The step must equal it to fp32 summation order,
on every ISA the machine has; and it must stay close to the model's own bf16 PyTorch path (which rounds after
every op, so it sits further from exact arithmetic than the step does).
The scenario is test_fused_families' (a 100-row prefill in two calls, a second sequence, a ragged step, 32 decode
steps past the sliding window), its decode steps teacher-forced: bf16 rounding makes near ties, and a path that
picked another token would then be compared on another text.
"""
from __future__ import annotations

import pytest
import torch

from engine import ops
from engine.infer.model import KVCache, Rows
from tests import families as F
from tests.test_fused_families import CASES, GREEDY, IDS, SHAPE, _rel

pytestmark = pytest.mark.usefixtures("_default_kernel_settings")

# no embedding scale among them: Gemma rounds its scaled embedding to bf16, which the fp32 definition cannot mirror
DEFINITION_CASES = ("mistral", "qwen3-windowed", "llama-biases", "phi3-hd96")
DEFINITION_REL = 1e-2     # set from the measured largest (see the test's docstring)
BF16_PATHS_REL = 0.1


@pytest.fixture()
def _default_kernel_settings():
    with ops.using(ops.KernelConfig(fused_bf16=True)):   # on an AMX host too (its default is the PyTorch path)
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(case, precision) -> the loaded model, precision "bf16" or "fp32" (then holding the bf16 values)."""
    from engine.infer.loader import load

    root, cache = tmp_path_factory.mktemp("fused-bf16"), {}

    def get(case: str, precision: str):
        if (case, precision) not in cache:
            family, over, _, _ = CASES[case]
            over = {k: v for k, v in {**SHAPE, **over}.items() if v is not None}
            folder = root / case
            if not folder.exists():
                F.build(family, folder, **over)
            model = load(str(folder), precision).model
            if precision == "fp32":
                with torch.no_grad():
                    for p in model.parameters():
                        p.copy_(p.bfloat16().float())
            cache[case, precision] = model
        return cache[case, precision]

    return get


def _scenario(model):
    """Every pass's logits: prefill 100 rows (two C++ calls), a second sequence, a ragged step of 1 + 3 + 5 rows,
    then GREEDY single-row decode steps of sequence 0 on fixed tokens."""
    cache, f = model.new_cache(3, 160), model.forward_rows
    outs = [f(IDS[:100], Rows.of([(0, 0, 100)], "cpu"), cache, logits_at=torch.tensor([99, 0, 63, 64])),
            f(IDS[100:130], Rows.of([(1, 0, 30)], "cpu"), cache),
            f(IDS[130:139], Rows.of([(0, 100, 1), (1, 30, 3), (2, 0, 5)], "cpu"), cache)]
    for k in range(GREEDY):
        outs.append(f(IDS[139 + k:140 + k], Rows.of([(0, 101 + k, 1)], "cpu"), cache))
    return outs


def _round_input(_mod, args):
    return (args[0].bfloat16().float(), *args[1:])


def _definition(model32, monkeypatch):
    """The scenario on the fp32 model holding bf16 values, rounded where the fused bf16 step rounds."""
    write = KVCache.write
    monkeypatch.setattr(KVCache, "write", lambda self, layer, rows, k, v: write(
        self, layer, rows, k.bfloat16().float(), v.bfloat16().float()))
    hooks = [m.register_forward_pre_hook(_round_input) for m in model32.modules()
             if isinstance(m, torch.nn.Linear)]
    try:
        with ops.using(fused=False):
            return _scenario(model32)
    finally:
        for h in hooks:
            h.remove()
        monkeypatch.setattr(KVCache, "write", write)


def _fused(model, **settings):
    with ops.using(fused=True, **settings), ops.count_steps() as counts:
        out = _scenario(model)
    assert counts.reference == 0 and counts.fused == 3 + GREEDY, counts.as_dict()
    return out


@pytest.mark.parametrize("case", DEFINITION_CASES)
def test_bf16_step_equals_its_definition(models, case, monkeypatch):
    """Every pass's logits within DEFINITION_REL (relative to the largest logit) of the definition, greedy tokens
    identical. Both round the same fp32 values to bf16, but those values differ in their last fp32 bits (sums in
    another order), so now and then an input lands on the other side of a bf16 rounding boundary."""
    ref = _definition(models(case, "fp32"), monkeypatch)
    got = _fused(models(case, "bf16"))
    rels = torch.tensor([_rel(b, a) for a, b in zip(ref, got)])
    print(f"{case}: relative difference median {rels.median():.3g}, largest {rels.max():.3g}")
    assert rels.max() < DEFINITION_REL, rels


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_lower_isas(models, isa, monkeypatch):
    """The shift/FMA kernel (AVX2) and the portable one give the same arithmetic as VDPBF16PS."""
    ext = ops.load_cpu_extension(raise_errors=True)
    if not ext.isa_supported(ops.config.ISA_IDS[isa]):
        pytest.skip(f"{isa} not supported here")
    ref = _definition(models("llama-biases", "fp32"), monkeypatch)
    got = _fused(models("llama-biases", "bf16"), isa=isa)
    rels = torch.tensor([_rel(b, a) for a, b in zip(ref, got)])
    print(f"{isa}: relative difference median {rels.median():.3g}, largest {rels.max():.3g}")
    assert rels.max() < DEFINITION_REL, rels


def test_bf16_step_is_closer_to_exact_arithmetic_than_the_pytorch_bf16_path(models):
    """Against the fp32 model holding the same bf16 values (no rounding at all), the step's logits (one rounding
    per linear) sit closer than the PyTorch bf16 path's (a rounding after every op), pass by pass on the
    median, and the two bf16 paths stay within bf16's noise of each other (Gemma 2: soft-caps, sandwich norms,
    the scaled embedding)."""
    model = models("gemma2", "bf16")
    with ops.using(fused=False):
        exact = _scenario(models("gemma2", "fp32"))
        torch_bf16 = _scenario(model)
    fused = _fused(model)
    d_fused = torch.tensor([_rel(b, a) for a, b in zip(exact, fused)])
    d_torch = torch.tensor([_rel(b, a) for a, b in zip(exact, torch_bf16)])
    between = max(_rel(b, a) for a, b in zip(torch_bf16, fused))
    print(f"median distance to exact: fused {d_fused.median():.3g}, PyTorch bf16 {d_torch.median():.3g}; "
          f"largest between them {between:.3g}")
    assert d_fused.median() < d_torch.median()
    assert between < BF16_PATHS_REL


def test_a_rows_logits_do_not_depend_on_its_neighbours(models):
    """bf16 rows through the dense kernels are row-independent: sequence 0's decode row alone and beside two
    other sequences (one decoding, one prefilling 5 rows) gives bit-identical logits."""
    model = models("qwen3-windowed", "bf16")
    cache = model.new_cache(3, 160)
    f = model.forward_rows
    with ops.using(fused=True), ops.count_steps() as counts:
        f(IDS[:60], Rows.of([(0, 0, 60)], "cpu"), cache)
        f(IDS[60:90], Rows.of([(1, 0, 30)], "cpu"), cache)
        alone = f(IDS[90:91], Rows.of([(0, 60, 1)], "cpu"), cache.clone())
        batch = f(IDS[90:97], Rows.of([(0, 60, 1), (1, 30, 1), (2, 0, 5)], "cpu"), cache)
    assert counts.reference == 0
    assert torch.equal(alone[0], batch[0])


def test_the_window_is_what_the_bf16_step_reads(models):
    """NaN written into a bf16 cache before the window never reaches the logits (test_fused_families' check)."""
    model = models("mistral", "bf16")
    cache = model.new_cache(1, 160)
    with ops.using(fused=True), ops.count_steps() as counts:
        model.forward_rows(IDS[:100], Rows.of([(0, 0, 100)], "cpu"), cache)
        step = (IDS[100:101], Rows.of([(0, 100, 1)], "cpu"))
        before = model.forward_rows(*step, cache.clone())
        stale = cache.clone()
        stale.k[:, :, :, :100 - F.WINDOW + 1] = float("nan")
        stale.v[:, :, :, :100 - F.WINDOW + 1] = float("nan")
        after = model.forward_rows(*step, stale)
    assert stale.k.dtype == torch.bfloat16 and counts.reference == 0
    assert torch.equal(before, after)


class _Ext:
    """The extension as bf16_in_step reads it: whether the CPU has AMX-BF16."""

    def __init__(self, amx: bool):
        self.amx = amx

    def has_amx_bf16(self):
        return self.amx


@pytest.mark.parametrize("amx,cfg,want", [
    (False, ops.KernelConfig(), True),
    (True, ops.KernelConfig(), False),                      # the AMX kernel on the PyTorch path
    (True, ops.KernelConfig(isa="avx2"), True),             # under an AVX2 cap there is no AMX kernel to keep
    (True, ops.KernelConfig(fused_bf16=True), True),
    (False, ops.KernelConfig(fused_bf16=False), False)])
def test_where_a_bf16_model_runs_the_step(amx, cfg, want, monkeypatch):
    from engine.ops import build, fused

    monkeypatch.setattr(build, "cpu_isa", lambda ext, c: ops.config.ISA_IDS[c.isa or "avx512"])
    assert fused.bf16_in_step(_Ext(amx), cfg) is want


def test_a_bf16_model_off_the_step_says_why(models):
    model = models("mistral", "bf16")
    with ops.using(fused_bf16=False), ops.count_steps() as counts:
        model.forward_rows(IDS[:3], Rows.of([(0, 0, 3)], "cpu"), model.new_cache(1, 8))
    assert counts.fused == 0 and dict(counts.reasons) == {"bf16 model: KernelConfig.fused_bf16=False": 1}


def test_a_quantized_model_holding_bf16_embeddings_is_not_a_bf16_model(models):
    """A user's int4 checkpoint may hold its embedding (and a tied head) in bf16 as stored: it computes in fp32, so it
    is not a bf16 model (its held head keeps fp32 semantics; a host where bf16 stays off the step keeps its step)."""
    from engine.ops import fused
    from engine.quant.layers import HalfEmbedding

    assert fused._is_bf16_model(models("mistral", "bf16"))
    model = models("mistral", "int4")
    emb = model.model.embed_tokens
    model.model.embed_tokens = HalfEmbedding(torch.nn.Parameter(emb.weight.detach().bfloat16(), requires_grad=False))
    try:
        assert not fused._is_bf16_model(model)
        with ops.using(fused_bf16=False), ops.count_steps() as counts:
            model.forward_rows(IDS[:3], Rows.of([(0, 0, 3)], "cpu"), model.new_cache(1, 8))
        assert counts.fused == 1 and counts.reference == 0, counts.as_dict()
    finally:
        model.model.embed_tokens = emb
