"""What an act-order checkpoint's input gathers cost in the decode step of the 1.5B, and what the fused C++ step
saves over the PyTorch path that ran such a model before this session. Timing only: the 1.5B's AWQ g32 checkpoint
(head and embedding fp16, as AutoAWQ saves) loaded as int4-checkpoint-g32, then every int4 linear given a random
input order (q/k/v and gate/up are fused, so they share one, as GPTQ's act-order makes them): the logits are not the
model's, the work per step is an act-order checkpoint's. Three arms in one process, alternated, median of 5 runs of
32 single-stream decode steps each.

    .venv/bin/python bench/awq_checkpoint.py --model default --floats fp16 --out <folder>
    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-04/session19-act-order-fused/step_ab.py <folder>
"""
import statistics
import sys
import time

import torch

from engine import ops
from engine.ops import fused as fused_mod
from engine.infer.loader import load
from engine.quant.layers import Int4Linear

lm = load(sys.argv[1], "int4-checkpoint-g32", "cpu")
m = lm.model
int4 = [mod for mod in m.modules() if isinstance(mod, Int4Linear)]
g = torch.Generator().manual_seed(0)
perms = {id(mod): torch.randperm(mod.prepared.K, generator=g).to(torch.int32) for mod in int4}


def arm(name):
    for mod in int4:
        mod.in_perm = None if name == "fused, no input order" else perms[id(mod)]
    fused_mod._plans.pop(m, None)  # the plan is built again for the new orders
    return ops.using(fused=name != "PyTorch path, act-order")


def step_ms(n=32):
    cache = m.new_cache(1, 256)
    with torch.no_grad(), ops.count_steps() as c:
        m(torch.tensor([[1, 2, 3, 4]]), 0, cache)
        tok = torch.tensor([[5]])
        t = time.perf_counter()
        for i in range(n):
            m(tok, 4 + i, cache)
    return (time.perf_counter() - t) / n * 1e3, c.as_dict()


arms = ["fused, no input order", "fused, act-order", "PyTorch path, act-order"]
times = {a: [] for a in arms}
for rep in range(5):
    for name in (arms if rep % 2 == 0 else arms[::-1]):
        with arm(name):
            step_ms(4)  # warm (and the plan built)
            ms, counts = step_ms()
        times[name].append(ms)
        if rep == 0:
            print(f"{name}: {counts['fused_steps']} fused, {counts['reference_steps']} reference steps "
                  f"{counts['reference_reasons'] or ''}")
for name, t in times.items():
    print(f"{name}: decode step median {statistics.median(t):.1f} ms (runs: {', '.join(f'{x:.1f}' for x in t)})")
med = {a: statistics.median(t) for a, t in times.items()}
print(f"act-order fused against the PyTorch path: {med['PyTorch path, act-order'] / med['fused, act-order']:.2f}x "
      f"faster; the gathers cost {med['fused, act-order'] / med['fused, no input order'] - 1:+.1%} of a fused step")
