"""AWQ's α search before (the search of 4d6430a, read from git) and after (this checkout's), on random weights of the
1.5B's layer-group shapes and 2,048 input rows: the round trip's values equal for three α, the chosen α and scales
equal, and the seconds of each search. Also the before-search's time per part for each shape, the head's included
(its product and round trip per α), which is what pointed at the round trip.

    .venv/bin/python docs/runs/2026-12-04/session19-awq-time/search_ab.py   (from the repository root)
"""
import subprocess
import sys
import time
import types

import torch

sys.path.insert(0, ".")
import engine.quant.awq as new  # noqa: E402
from engine.quant.gptq import dequantize_codes  # noqa: E402

old = types.ModuleType("old_awq")
exec(subprocess.run(["git", "show", "4d6430a:engine/quant/awq.py"], capture_output=True, text=True, check=True).stdout,
     old.__dict__)
torch.manual_seed(0)
print("torch threads", torch.get_num_threads())
for name, (N, K) in {"q/k/v": (2048, 1536), "gate/up": (17920, 1536), "down": (1536, 8960),
                     "head": (151936, 1536)}.items():
    w = torch.randn(N, K) * 0.02
    x = torch.randn(2048, K) * torch.randn(K).exp()
    H = (x * x).mean(0)
    t0 = time.perf_counter()
    ref = x @ w.T
    t1 = time.perf_counter()
    s = x.abs().mean(0).pow(0.35)
    s = (s / (s.max() * s.min()).sqrt()).clamp(min=1e-4)
    q, sc, mn = old.quantize_scaled(w, s, H, 32, ratios=(1.0,))
    a = dequantize_codes(q, sc, mn) / s[None, :]
    t2 = time.perf_counter()
    b = new._minmax_roundtrip(w, s, 32, torch.empty_like(w))
    t3 = time.perf_counter()
    print(f"{name} [{N}x{K}]: per alpha, product {t1 - t0:.2f} s, round trip before {t2 - t1:.2f} s, "
          f"after {t3 - t2:.2f} s; values equal: {torch.equal(a, b)}", flush=True)
    del ref, a, b
    if name == "head":  # the before-search takes about 400 s here: its parts above say enough
        continue
    t0 = time.perf_counter()
    so, ao = old.search_scale([w], x, x.abs().mean(0), H, 32)
    t1 = time.perf_counter()
    sn, an = new.search_scale([w], x, x.abs().mean(0), H, 32)
    t2 = time.perf_counter()
    print(f"  search: before {t1 - t0:.2f} s, after {t2 - t1:.2f} s ({(t1 - t0) / (t2 - t1):.2f}x); alpha {ao} / {an}, "
          f"scales equal: {torch.equal(so, sn)}", flush=True)
