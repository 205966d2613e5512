"""A user's AWQ checkpoint of the 1.5B (AutoAWQ keeps its head and embedding dense, in fp16): the decode step with
them held as stored (fp16, this session) against them widened to fp32 (before), one process, alternated.

    .venv/bin/python bench/awq_checkpoint.py --model default --floats fp16 --out <folder>
    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-04/session18-checkpoint-head/head_ab.py <folder>
"""
import statistics
import sys
import time

import torch
from torch import nn

from engine.infer.loader import load

lm = load(sys.argv[1], "int4-checkpoint-g32", "cpu")
m = lm.model
held_head, held_emb = m.lm_head, m.model.embed_tokens
wide = nn.Linear(held_head.in_features, held_head.out_features, bias=False)
wide.weight.data = held_head.weight.float()
tied = held_emb.weight is held_head.weight  # then the fp32 head and embedding share one fp32 tensor, as before
wide_emb = nn.Embedding.from_pretrained(wide.weight.data if tied else held_emb.weight.float())


def use(which):
    m.lm_head, m.model.embed_tokens = (held_head, held_emb) if which == "fp16 head" else (wide, wide_emb)


def step_ms(n=32):
    cache = m.new_cache(1, 256)
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3, 4]]), 0, cache)
        tok = torch.tensor([[5]])
        t = time.perf_counter()
        for i in range(n):
            m(tok, 4 + i, cache)
    return (time.perf_counter() - t) / n * 1e3


print("weights MB by part (held):", {k: round(v / 1e6) for k, v in lm.weights.items()}, "tied:", tied)
times = {"fp16 head": [], "fp32 head": []}
for rep in range(5):
    for which in (("fp16 head", "fp32 head") if rep % 2 == 0 else ("fp32 head", "fp16 head")):
        use(which)
        step_ms(4)  # warm
        times[which].append(step_ms())
for which, t in times.items():
    print(f"{which}: decode step median {statistics.median(t):.1f} ms (runs: {', '.join(f'{x:.1f}' for x in t)})")
a, b = statistics.median(times["fp32 head"]), statistics.median(times["fp16 head"])
print(f"fp16 head / fp32 head: {a / b:.2f}x faster per step")
use("fp16 head")
with torch.no_grad():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    got = m(ids, 0, m.new_cache(1, 16))[0]
    use("fp32 head")
    want = m(ids, 0, m.new_cache(1, 16))[0]
print(f"largest logit difference over 8 positions: {float((got - want).abs().max() / want.abs().max()):.1e} "
      "of the largest logit")
