"""Decode step times of bench's static batch in one process, the caches in the order given (the first run of a
process is the one whose decode steps reach positions no step reached before). The Gemma 3 shape of
bench/kv_window.py (int4, fused step), window 4,096, 2 sequences of 16,000-token prompts, 64 new tokens.

    PYTHONPATH=. .venv/bin/python <this file> paged,slots,paged,slots
"""
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, ".")
sys.path.insert(0, str(Path("bench").resolve()))
from kv_window import GEMMA3  # noqa: E402

from engine import ops  # noqa: E402
from engine.common.paths import cache_dir  # noqa: E402
from engine.infer.generate import run_static  # noqa: E402
from engine.infer.loader import load  # noqa: E402
from engine.infer.sampling import SamplingParams  # noqa: E402
from tests import families  # noqa: E402

folder = families.build("gemma3", cache_dir() / "bench" / "kv-window-gemma3-4096", **GEMMA3, sliding_window=4096)
lm = load(str(folder), "int4")
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, families.VOCAB, (16000,), generator=g).tolist() for _ in range(2)]
for kv in sys.argv[1].split(","):
    r = run_static(lm, prompts, 64, SamplingParams(), stop_at_eos=False, kv_cache=None if kv == "paged" else kv)
    s = np.array(r.step_s) * 1e3
    print(f"{r.settings['kv_cache']}: decode step median {np.median(s):.2f} ms (first 10 {np.median(s[:10]):.2f}, "
          f"last 10 {np.median(s[-10:]):.2f}), prefill {r.prefill_s:.1f} s", flush=True)
print(ops.fused_info())
