import time, torch
from engine import ops
from engine.ops import build
ext = build.load_cpu_extension()
torch.manual_seed(0)
ws = []
for i in range(40):
    q, s = ops.quantize_int8(torch.randn(8960, 1536)); ws.append(ops.prepare_int8(q, s))
out = []
for M in (1, 8):
    x = torch.randn(M, 1536)
    f = lambda p: ext.int8_gemm_q8(x, p.w, p.scale, None, 8960, 2)
    for p in ws[:5]: f(p)
    best = 1e9
    for _ in range(7):
        t = time.perf_counter()
        for p in ws: f(p)
        best = min(best, (time.perf_counter() - t) / len(ws))
    out.append(f"M={M} {best*1e3:.3f}")
print(" | ".join(out), flush=True)
