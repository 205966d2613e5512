import torch, time, sys
from engine import ops
from engine.ops import build
ext = build.load_cpu_extension()
print(build._cpu_state.get("build_dir"))
for N, K in ((8960, 1536), (1536, 8960)):
    w = torch.randn(N, K); q, s = ops.quantize_int8(w); p = ops.prepare_int8(q, s)
    for M in (1, 8):
        x = torch.randn(M, K)
        for name, isa in (("int8 fp32", 2), ("int8 fp32 avx2", 1)):
            f = lambda: ext.int8_gemm(x, p.w, p.scale, None, N, isa)
            for _ in range(3): f()
            ts = []
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(10): f()
                ts.append((time.perf_counter() - t) / 10)
            print(f"N={N} K={K} M={M} {name}: {min(ts)*1e3:.3f} ms")
