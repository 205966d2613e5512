"""Is GPTQ's calibration repeatable? The permuted 1.5B's first 4 decoder blocks (head left out) calibrated by
engine.infer.calibrate.calibrate (GPTQ v3, g32) on the first 2,048 calibration tokens, three times in this process:
2 torch threads, 1 thread, 2 threads again. Per linear: the share of int4 codes that differ from the first run's,
and the relative output errors (the mixed selection's input) side by side.

    .venv/bin/python docs/runs/2026-12-07/session38-avx512/experiments/gptq_repeat.py
"""
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from dataclasses import replace  # noqa: E402

from engine.infer import calibrate  # noqa: E402
from engine.infer.loader import build_model, load_tokenizer  # noqa: E402
from engine.quant import make_spec  # noqa: E402

P = Path.home() / ".cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0"
LAYERS = 4
model = build_model(P, dtype=torch.float32, device="cpu")
model.model.layers = model.model.layers[:LAYERS]
tok = load_tokenizer(P)
docs = calibrate.calibration_docs(tok, 2048)
spec = replace(make_spec("int4-gptq-g32"), quantize_head=False)
runs = []
for threads in (2, 1, 2):
    torch.set_num_threads(threads)
    m = copy.deepcopy(model)
    t0 = time.perf_counter()
    codes, errors, _ = calibrate.calibrate(m, spec, docs)
    runs.append((threads, codes, errors))
    print(f"threads {threads}: {time.perf_counter() - t0:.0f} s", flush=True)
_, c0, e0 = runs[0]
for threads, c, e in runs[1:]:
    print(f"\nagainst the first run (2 threads), run with {threads} thread(s):")
    for name in c0:
        q0, q1 = c0[name][0], c[name][0]
        diff = (q0 != q1).float().mean().item()  # packed words: a word differs when any of its 8 codes does
        print(f"  {name:40s} packed words differing {100 * diff:6.2f}%  rel. error {e0[name]:.6f} -> {e[name]:.6f}")
