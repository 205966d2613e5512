"""Our VDPBF16PS dense kernel (ext.dense_gemm, kernel 3) against torch's bf16 F.linear (oneDNN) on the 0.5B's and
the 1.5B's shapes at M = 8, 32, 64 rows, weights warm (a prefill chunk's regime): median of 30 calls each,
alternated. Run from the checkout whose kernels it measures."""
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from engine.ops.build import load_cpu_extension  # noqa: E402

ext = load_cpu_extension(raise_errors=True)
torch.manual_seed(0)
print("| shape | M | ours ms | ours GFLOP/s | torch ms | torch / ours |\n| --- | ---: | ---: | ---: | ---: | ---: |")
for name, N, K in [("gate/up 0.5B", 9728, 896), ("qkv 0.5B", 1152, 896), ("down 0.5B", 896, 4864),
                   ("gate/up 1.5B", 17920, 1536)]:
    w = torch.randn(N, K).bfloat16()
    for M in (8, 32, 64):
        x = torch.randn(M, K).bfloat16()
        f = {"ours": lambda: ext.dense_gemm(x, w, None, 3), "torch": lambda: torch.nn.functional.linear(x, w)}
        t = {k: [] for k in f}
        for _ in range(3):
            for fn in f.values():
                fn()
        for _ in range(30):
            for k, fn in f.items():
                t0 = time.perf_counter()
                fn()
                t[k].append(time.perf_counter() - t0)
        a, b = statistics.median(t["ours"]), statistics.median(t["torch"])
        print(f"| {name} | {M} | {a * 1e3:.3f} | {2 * M * N * K / a / 1e9:.0f} | {b * 1e3:.3f} | {b / a:.2f} |",
              flush=True)
