"""formats.quantize_int4 at 8017ac5 (padding masks on every tensor) against this tree's (masks only for a ragged
last group), on the 1.5B's gate/up shape, alternated in one process; codes compared first.
    .venv/bin/python docs/runs/2026-12-06/session29-load-time/formats_ab.py"""
import importlib.util
import subprocess
import sys
import tempfile
import time

import torch

ROOT = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip()
sys.path.insert(0, ROOT)
from engine.ops import formats  # noqa: E402

old_src = subprocess.run(["git", "show", "8017ac5:engine/ops/formats.py"], capture_output=True, text=True).stdout
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(old_src)
spec = importlib.util.spec_from_file_location("formats_8017ac5", f.name)
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old
spec.loader.exec_module(old)
w = torch.randn(8960, 1536, generator=torch.Generator().manual_seed(0)) * 0.05
assert all(torch.equal(a, b) for a, b in zip(old.quantize_int4(w, 32), formats.quantize_int4(w, 32)))
for _ in range(3):
    t0 = time.perf_counter()
    old.quantize_int4(w, 32)
    t1 = time.perf_counter()
    formats.quantize_int4(w, 32)
    t2 = time.perf_counter()
    print(f"8960 x 1536, group 32: 8017ac5 {t1 - t0:.3f} s, now {t2 - t1:.3f} s ({(t1 - t0) / (t2 - t1):.2f}x)")
