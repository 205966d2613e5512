import torch, time
from engine import ops
from engine.ops import build
ext = build.load_cpu_extension()
torch.manual_seed(0)
for N, K in ((130, 1536+7), (64, 100), (33, 37), (200, 1024), (70, 600)):
    w = torch.randn(N, K)
    q, s = ops.quantize_int8(w)
    p = ops.prepare_int8(q, s)
    assert torch.equal(p.dequantize(), ops.dequantize_int8(q, s))
    assert torch.equal(ext.int8_dequant(p.w, p.scale, N, K, 0, p.w.shape[0]), p.dequantize())
    wd = ops.dequantize_int8(q, s).double()
    for M in (1, 2, 5, 7, 8, 9, 13, 16, 20, 64):
        x = torch.randn(M, K); x[:, 0] *= 30
        ref = x.double() @ wd.T
        outs = {}
        for isa in (0, 1, 2):
            y = ext.int8_gemm(x, p.w, p.scale, None, N, isa)
            e = float((y.double() - ref).abs().max() / ref.abs().max())
            assert e < 1e-5, (N, K, M, isa, e)
            outs[isa] = ext.int8_gemm_q8(x, p.w, p.scale, None, N, isa)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2]), (N, K, M, (outs[0]-outs[2]).abs().max())
        e = float((outs[2].double() - ref).abs().max() / ref.abs().max())
        assert 1e-6 < e < 2e-2, e
print("ok")
# speed: M=1 and 8, 8960x1536 (down_proj in) and 1536x8960
for N, K in ((8960, 1536), (1536, 8960)):
    w = torch.randn(N, K); q, s = ops.quantize_int8(w); p = ops.prepare_int8(q, s)
    pk, sc, mn = ops.quantize_int4(w, 32); p4 = ops.prepare_int4(pk, sc, mn, K, 32)
    for M in (1, 8):
        x = torch.randn(M, K)
        for name, f in (("int8 fp32", lambda: ext.int8_gemm(x, p.w, p.scale, None, N, 2)),
                        ("int8 q8", lambda: ext.int8_gemm_q8(x, p.w, p.scale, None, N, 2)),
                        ("int8 q8 avx2", lambda: ext.int8_gemm_q8(x, p.w, p.scale, None, N, 1)),
                        ("int8 fp32 avx2", lambda: ext.int8_gemm(x, p.w, p.scale, None, N, 1)),
                        ("int4 q8", lambda: ext.int4_gemm_q8(x, p4.w, p4.sm, None, N, K, 32, 2))):
            for _ in range(3): f()
            ts = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(10): f()
                ts.append((time.perf_counter() - t) / 10)
            print(f"N={N} K={K} M={M} {name}: {min(ts)*1e3:.3f} ms")
