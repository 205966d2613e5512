"""The dense bf16/fp32 CPU GEMV kernels (kernels/cpu/dense*, engine/ops/dense.py) against torch's F.linear,
and fp32 activations against bf16/fp16 weights (a checkpoint's head held as stored) against the fp32 linear.

Every kernel id the CPU can run (scalar, AVX2, AVX-512 shift/FMA, AVX512_BF16 VDPBF16PS, AMX TDPBF16PS) on
shapes that are not multiples of the SIMD chunk, the 4-row block or the AMX kernel's 16-row tiles, M from 1 to
17 and every M to 64 on one shape, with and without bias; the dispatch (threshold, dtypes, ISA cap, fallbacks),
the row limit measured per machine; and the 0.5B model at bf16 greedy-generating the same tokens with the kernel
on and off.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.ops import config, dense

# (N, K): N not a multiple of the 4-row block, K not a multiple of 16/32 (the AVX2/AVX-512 chunk).
SHAPES = [(1, 1), (3, 31), (37, 77), (130, 1000), (67, 1536 + 5), (256, 1536)]
MS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17]


@pytest.fixture(scope="module")
def ext():
    return ops.load_cpu_extension(raise_errors=True)


@pytest.fixture(autouse=True)
def _default_settings():
    with ops.using(ops.KernelConfig()):
        yield


def _kernels(ext, bf16: bool) -> list[int]:
    return [k for k in dense.DENSE_KERNELS if ext.dense_kernel_supported(k, bf16)]


def _bound(x, w, bias, bf16: bool):
    """float64 reference and the allowed error: fp32 accumulation (a K-term sum in any order) plus, for bf16
    output, one rounding to bf16 (half an ulp, 2^-9 relative; 2^-8 allows torch's own rounding too)."""
    xd, wd = x.double(), w.double()
    ref = xd @ wd.T + (0 if bias is None else bias.double())
    mag = xd.abs() @ wd.abs().T + (0 if bias is None else bias.double().abs())
    tol = 4 * x.shape[-1] * 2.0 ** -24 * mag + 1e-30
    if bf16:
        tol = tol + 2.0 ** -8 * ref.abs()
    return ref, tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("N,K", SHAPES)
def test_kernels_match_reference_and_torch(ext, dtype, N, K):
    bf16 = dtype is torch.bfloat16
    kernels = _kernels(ext, bf16)
    assert 0 in kernels and (2 in kernels or not ext.isa_supported(2))
    g = torch.Generator().manual_seed(N * 1000 + K)
    w = torch.randn(N, K, generator=g).to(dtype)
    for with_bias in (False, True):
        b = torch.randn(N, generator=g).to(dtype) if with_bias else None
        for M in MS:
            x = torch.randn(M, K, generator=g).to(dtype)
            ref, tol = _bound(x, w, b, bf16)
            yt = F.linear(x, w, b)
            assert ((yt.double() - ref).abs() <= tol).all(), "the bound does not even hold for torch"
            for k in kernels:
                y = ext.dense_gemm(x, w, b, k)
                assert y.dtype == dtype and y.shape == (M, N)
                err = (y.double() - ref).abs()
                assert (err <= tol).all(), (dense.DENSE_KERNELS[k], M, with_bias, float((err / tol).max()))
                if bf16:  # within one bf16 ulp of torch's own bf16 result
                    ulp = 2.0 ** (torch.floor(torch.log2(yt.double().abs().clamp(min=1e-30))) - 7)
                    assert ((y.double() - yt.double()).abs() <= ulp + tol).all(), (dense.DENSE_KERNELS[k], M)


@pytest.mark.parametrize("K", [1536 + 5, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_every_row_count_up_to_64(ext, dtype, K):
    """Each kernel at every M the dispatch may give it (1-64: every m-block tail and 4-row block), one call each;
    83 rows of W: the AMX kernel's 32-row blocks, a 16-row block and 3 rows left to VDPBF16PS; K with a tail (the
    scalar finish) and without (the vector finish)."""
    bf16 = dtype is torch.bfloat16
    g = torch.Generator().manual_seed(64)
    N = 83
    w = torch.randn(N, K, generator=g).to(dtype)
    x = torch.randn(64, K, generator=g).to(dtype)
    ref, tol = _bound(x, w, None, bf16)
    for k in _kernels(ext, bf16):
        for M in range(1, 65):
            err = (ext.dense_gemm(x[:M], w, None, k).double() - ref[:M]).abs()
            assert (err <= tol[:M]).all(), (dense.DENSE_KERNELS[k], M)


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("N,K", SHAPES)
def test_half_weights_with_fp32_x_are_the_fp32_linear_of_the_widened_weights(ext, wdtype, N, K):
    f16 = wdtype is torch.float16
    kernels = [k for k in dense.DENSE_KERNELS if ext.dense_kernel_supported(k, False, f16)]
    assert 0 in kernels and 3 not in kernels
    g = torch.Generator().manual_seed(N * 1000 + K + 7)
    w = torch.randn(N, K, generator=g).to(wdtype)
    wide = w.float()  # exact
    for b in (None, torch.randn(N, generator=g)):
        for M in (1, 3, 8, 9):
            x = torch.randn(M, K, generator=g)
            ref, tol = _bound(x, wide, b, False)
            for k in kernels:
                y = ext.dense_gemm(x, w, b, k)
                assert y.dtype == torch.float32 and ((y.double() - ref).abs() <= tol).all(), dense.DENSE_KERNELS[k]


def test_dense_linear_on_half_weights_takes_the_kernel_then_torch_by_chunks(ext, monkeypatch):
    w = torch.randn(dense.HALF_CHUNK + 70, 64).half()
    calls = []
    monkeypatch.setattr(ext, "dense_gemm", lambda *a: calls.append(a[3]) or torch.zeros(1))
    dense.dense_linear(torch.randn(1, 64), w)
    assert calls  # M = 1: the kernel
    x = torch.randn(17, 64)  # M past dense_m: torch on the widened rows, by chunks
    with ops.using(dense_m=16):
        y = dense.dense_linear(x, w)
    ref, tol = _bound(x, w.float(), None, False)
    assert len(calls) == 1 and y.shape == ref.shape and ((y.double() - ref).abs() <= tol).all()


def test_fp32_bias_on_bf16_weights_and_leading_dims(ext):
    """A bias may be fp32 on a bf16 model; x may have leading dims."""
    w = torch.randn(70, 96).bfloat16()
    b = torch.randn(70)
    x = torch.randn(2, 3, 96).bfloat16()
    for k in _kernels(ext, True):
        y = ext.dense_gemm(x, w, b, k)
        ref, tol = _bound(x.reshape(6, 96), w, b, True)
        assert y.shape == (2, 3, 70) and ((y.reshape(6, 70).double() - ref).abs() <= tol).all()


def test_rows_are_independent_of_m(ext):
    """A row's output does not depend on the other rows of the call (m-blocking is per row): K = 200 has a k
    tail; K = 256 none (a whole 4 x 4 block's sums and rounding then run vectorized); 18 rows run the next rows'
    prefetch; with no bias, an fp32 one and a bf16 one."""
    for K, M in ((200, 9), (256, 18)):
        w = torch.randn(45, K).bfloat16()
        x = torch.randn(M, K).bfloat16()
        for b in (None, torch.randn(45), torch.randn(45).bfloat16()):
            for k in _kernels(ext, True):
                alone = torch.cat([ext.dense_gemm(x[i:i + 1], w, b, k) for i in range(M)])
                assert torch.equal(ext.dense_gemm(x, w, b, k), alone), (dense.DENSE_KERNELS[k], K, b)


def test_unsupported_inputs_are_refused(ext):
    w = torch.randn(8, 32)
    with pytest.raises(RuntimeError, match="dtype"):
        ext.dense_gemm(torch.randn(1, 32).bfloat16(), w, None, 0)
    with pytest.raises(RuntimeError, match="dtype"):  # fp16 weights take fp32 x only
        ext.dense_gemm(torch.randn(1, 32).half(), w.half(), None, 0)
    with pytest.raises(RuntimeError, match="bfloat16, float16 or float32"):
        ext.dense_gemm(torch.randn(1, 32), w.double(), None, 0)
    with pytest.raises(RuntimeError, match="not supported"):
        ext.dense_gemm(torch.randn(1, 32), w.bfloat16(), None, 3)  # VDPBF16PS: bf16 x only
    with pytest.raises(RuntimeError, match="not supported"):
        ext.dense_gemm(torch.randn(1, 32), w, None, 3)  # VDPBF16PS: bf16 only
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.dense_gemm(torch.randn(1, 32), torch.randn(32, 8).t(), None, 0)
    with pytest.raises(RuntimeError, match="bias"):
        ext.dense_gemm(torch.randn(1, 32), w, torch.randn(7), 0)


def test_dispatch_threshold_dtypes_and_isa(ext, monkeypatch):
    best = (4 if ext.has_amx_bf16() else 3) if ext.has_avx512_bf16() else int(ext.best_isa())
    # the machine's row limit, measured now if this build has none yet (its timing calls are not the dispatch's)
    dense.dense_rows(ext, config.kernel_config(), best, "bf16")
    calls = []
    real = ext.dense_gemm
    monkeypatch.setattr(ext, "dense_gemm", lambda *a: calls.append(a[3]) or real(*a))
    w = torch.randn(40, 64).bfloat16()
    for lim in (16, 3):
        with ops.using(dense_m=lim):
            for M, used in ((1, True), (lim, True), (lim + 1, False)):
                calls.clear()
                x = torch.randn(M, 64).bfloat16()
                y = dense.dense_linear(x, w)
                assert bool(calls) is used, M
                if not used:
                    assert torch.equal(y, F.linear(x, w))
    calls.clear()
    dense.dense_linear(torch.randn(1, 64).bfloat16(), w)
    assert calls == [best]
    for isa in ("scalar", "avx2"):
        if ext.isa_supported(config.ISA_IDS[isa]):
            with ops.using(isa=isa):
                calls.clear()
                dense.dense_linear(torch.randn(1, 64).bfloat16(), w)
                dense.dense_linear(torch.randn(1, 64), w.float())
                assert calls == [config.ISA_IDS[isa]] * 2
    calls.clear()
    for off in (dict(dense_m=0), dict(enabled=False)):
        with ops.using(**off):
            dense.dense_linear(torch.randn(1, 64).bfloat16(), w)
    dense.dense_linear(torch.randn(1, 64).half(), w.half())                   # fp16: torch
    dense.dense_linear(torch.randn(2, 64).bfloat16()[:, ::2].repeat(1, 2), w)  # contiguous copy: kernel
    xt = torch.randn(64, 1).bfloat16().t()                                    # 1 row, stride 1: contiguous
    dense.dense_linear(xt, w)
    assert calls == [best, best]
    wg = w.float().requires_grad_()
    y = dense.dense_linear(torch.randn(1, 64), wg)                          # autograd: torch
    assert y.requires_grad and calls == [best, best]
    calls.clear()
    dense.dense_linear(torch.randn(1, 64), w)                       # fp32 x, bf16 w: the shift kernel, not VDPBF16PS
    assert calls == [int(ext.best_isa())]
    with pytest.raises(RuntimeError):                                          # bf16 x, fp32 w: torch's own error
        dense.dense_linear(torch.randn(1, 64).bfloat16(), w.float())


def test_the_row_limit_is_measured_once_per_machine_and_kept(ext, monkeypatch, tmp_path):
    """dense_m unset: the kernel takes the rows up to the M measured against torch's F.linear on this machine,
    stored beside the extension; the next process (a cleared in-process cache) reads it and measures nothing,
    the dispatch and the run record follow what is stored."""
    from engine.ops import build, dense_crossover as dc
    from engine.ops.info import backend_info

    monkeypatch.setitem(build._cpu_state, "build_dir", str(tmp_path))
    monkeypatch.setattr(dc, "_known", {})
    measured, real = [], dc.measure
    monkeypatch.setattr(dc, "measure", lambda *a: measured.append(a) or real(*a))
    cfg = ops.kernel_config()
    assert cfg.dense_m is None
    kernel = dense.dense_kernel(ext, cfg, True)
    lim = dense.dense_rows(ext, cfg, kernel, "bf16")
    assert dense.dense_rows(ext, cfg, kernel, "bf16") == lim and len(measured) == 1
    stored = json.loads((tmp_path / dc.FILE).read_text())
    (key, entry), = stored.items()
    assert entry["limit"] == lim == dc.limit_of(entry["rows"], entry["kernel_ms"], entry["torch_ms"])
    assert f"threads{torch.get_num_threads()}" in key and entry["rows"] == list(dc.ROWS[:len(entry["kernel_ms"])])
    assert entry["rows"][-1] == lim or entry["torch_ms"][-1] * (1 + dc.MARGIN) < entry["kernel_ms"][-1]

    entry["limit"] = 8
    (tmp_path / dc.FILE).write_text(json.dumps(stored))
    dc._known.clear()
    calls, real_gemm = [], ext.dense_gemm
    monkeypatch.setattr(ext, "dense_gemm", lambda *a: calls.append(a[0].shape[0]) or real_gemm(*a))
    w = torch.randn(40, 64).bfloat16()
    for M in (1, 8, 9):
        dense.dense_linear(torch.randn(M, 64).bfloat16(), w)
    assert calls == [1, 8] and len(measured) == 1
    assert f"bf16 {dense.DENSE_KERNELS[kernel]} M <= 8" in backend_info()["dense_kernel"]


def test_amx_kernel_and_torchs_own_amx_gemm_take_turns(ext):
    """The AMX kernel configures the tiles per call and releases them after: torch's bf16 GEMM (oneDNN, on the
    same tiles where the CPU has them) runs right after it, and it right after torch, with the same results."""
    if not ext.has_amx_bf16():
        pytest.skip("AMX-BF16 not supported by this CPU, or its tiles not granted to this process "
                    "(the kernel is not offered)")
    g = torch.Generator().manual_seed(5)
    w = torch.randn(512, 1024, generator=g).bfloat16()
    x = torch.randn(128, 1024, generator=g).bfloat16()
    ref, first = F.linear(x, w), ext.dense_gemm(x[:40], w, None, 4)
    for i in range(8):
        assert torch.equal(ext.dense_gemm(x[:40], w, None, 4), first)
        assert torch.equal(F.linear(x, w), ref)


def test_torch_takes_the_rows_only_where_measured_faster_by_the_margin():
    from engine.ops.dense_crossover import MARGIN, limit_of

    rows = (2, 4, 8, 16)
    assert limit_of(rows, [1.0] * 4, [1.0] * 4) == 16                       # level: the kernel
    assert limit_of(rows, [1.0] * 4, [1 / (1 + MARGIN) + 0.01] * 4) == 16   # faster, within the margin
    assert limit_of(rows, [1.0] * 4, [1.0, 1.0, 0.5, 2.0]) == 4            # the first clear loss ends it
    assert limit_of(rows, [1.0] * 4, [0.5] * 4) == 1                       # one row stays the kernel's


def test_adopt_keeps_parameters_and_ties():
    emb = nn.Embedding(50, 16)
    m = nn.Module()
    m.emb, m.head, m.proj = emb, nn.Linear(16, 50, bias=False), nn.Linear(16, 8)
    m.head.weight = emb.weight
    w_proj = m.proj.weight
    assert ops.adopt_dense_linears(m) == 2
    assert type(m.head) is ops.DenseLinear and m.head.weight is emb.weight and m.proj.weight is w_proj
    x = torch.randn(3, 16)
    assert torch.allclose(m.proj(x), F.linear(x, m.proj.weight, m.proj.bias), atol=1e-5)
    assert set(m.state_dict()) == {"emb.weight", "head.weight", "proj.weight", "proj.bias"}


def test_float_models_get_dense_linears_quantized_ones_do_not():
    """quantize_model on CPU: fp32/bf16 linears become DenseLinear; an int8 model's unquantized head stays nn.Linear."""
    from engine.quant import make_spec, quantize_model
    from tests.tiny import tiny_model

    for prec, kind in (("bf16", ops.DenseLinear), ("fp32", ops.DenseLinear), ("int8", nn.Linear)):
        m = quantize_model(tiny_model().model, make_spec(prec, quantize_head=False), "cpu")
        lins = [mod for mod in m.modules() if isinstance(mod, nn.Linear)]
        assert lins and all(type(mod) is kind for mod in lins), prec
        tok = torch.tensor([1, 2, 3])
        with torch.inference_mode():
            cache = m.new_cache(1, 8)
            m(tok[None], 0, cache)
            with ops.using(dense_m=0):
                off = m(tok[None, :1], 3, cache.clone())
            on = m(tok[None, :1], 3, cache)
        assert torch.allclose(on, off, rtol=0.05, atol=0.05), prec


@pytest.fixture(scope="module")
def small_bf16(pool):
    from engine.infer.loader import make_spec

    return pool.get("default-draft", make_spec("bf16"), "cpu")


def test_bf16_model_same_tokens_with_kernel_on_and_off(small_bf16):
    """The 0.5B at bf16 on the PyTorch path (the fused step off: it runs its own bf16 linears, test_fused_bf16):
    every linear is a DenseLinear on its own bf16 weight, and greedy decoding (M = 1, the kernel) picks the tokens
    torch's F.linear (dense_m = 0) ranks first, read back in one teacher-forced pass.

    Two bf16 GEMMs that sum in another order move a logit by up to about 1 after 24 layers (measured on an AMX host,
    where torch's bf16 runs on AMX tiles), so a near tie may go either way: at most one of the 64 tokens may be
    torch's second choice, and then within 0.25 of its first (measured: one, 0.19 below; elsewhere, none)."""
    from engine.infer.generate import generate

    m = small_bf16.model
    lins = [mod for mod in m.modules() if isinstance(mod, nn.Linear)]
    assert lins and all(type(mod) is ops.DenseLinear and mod.weight.dtype is torch.bfloat16 for mod in lins)
    if m.cfg.tie_embeddings:  # a tied head stays tied: no second copy
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    prompts = ["def quicksort(arr):", "Explain what a hash map is."]
    with ops.using(fused=False):
        on = generate(small_bf16, prompts, 32, chat=False, stop_at_eos=False).new_tokens
    gaps = []
    for prompt, new in zip(prompts, on):
        ids = small_bf16.tokenizer(prompt)["input_ids"]
        full = torch.tensor([ids + new])
        with ops.using(dense_m=0, fused=False), torch.no_grad():
            logits = m(full, 0, m.new_cache(1, full.shape[1]))[0, len(ids) - 1:-1].float()
        gaps += (logits.max(-1).values - logits[torch.arange(len(new)), torch.tensor(new)]).tolist()
    assert len(gaps) == 64 and sum(g > 0 for g in gaps) <= 1 and max(gaps) <= 0.25, gaps
