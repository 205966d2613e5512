"""int8 linears read from DRAM (40 different 8960x1536 weights, 550 MB, cycled), M = 1 and 8, 2 threads: this
commit's kernels (int8 activations; fp32 activations) or, run from a 9c1689a tree, the old layout's fp32 kernel."""
import time

import torch

from engine import ops
from engine.ops import build

ext = build.load_cpu_extension()
new = hasattr(ext, "int8_gemm_q8")
torch.manual_seed(0)
ws = []
for i in range(40):
    q, s = ops.quantize_int8(torch.randn(8960, 1536))
    ws.append(ops.prepare_int8(q, s))
arms = [("fp32 act", lambda x, p: ext.int8_gemm(x, p.w, p.scale, None, 8960, 2))]
if new:
    arms.append(("int8 act", lambda x, p: ext.int8_gemm_q8(x, p.w, p.scale, None, 8960, 2)))
for M in (1, 8):
    x = torch.randn(M, 1536)
    for name, f in arms:
        for p in ws[:5]:
            f(x, p)
        best = 1e9
        for _ in range(5):
            t = time.perf_counter()
            for p in ws:
                f(x, p)
            best = min(best, (time.perf_counter() - t) / len(ws))
        print(f"{'9c1689a' if not new else 'this commit'} M={M} {name}: {best * 1e3:.3f} ms per 13.8 MB "
              f"({13.76 / best / 1e3:.1f} GB/s)", flush=True)
