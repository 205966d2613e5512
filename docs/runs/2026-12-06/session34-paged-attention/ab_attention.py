"""The fused decode step's attention phase on a slot cache against a paged one, one process, alternated: the pool
head-major (engine/infer/paged.py on CPU) with blocks of 64 in order, every other block, shuffled, and blocks of
256; and block-major (the layout before session 34) in order. What holding K/V in blocks costs the step.

A Mistral-shaped int4 model (8 layers, hidden 1,024, 16/4 heads, head_dim 64, a 2,048-token window), one
sequence decoding at position 6,000 (the caches filled with random K/V: the timing does not depend on values),
10 steps per round per cache, the fused step's phase timers (engine/ops/fused.py fused_profile).

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-06/session34-paged-attention/ab_attention.py [rounds]
"""
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from engine import ops  # noqa: E402
from engine.common.paths import cache_dir  # noqa: E402
from engine.infer.loader import load  # noqa: E402
from engine.infer.model import Rows  # noqa: E402
from engine.infer.paged import PagedKVCache  # noqa: E402
from tests import families  # noqa: E402

SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, head_dim=64, max_position_embeddings=65536, sliding_window=2048)
P = 6000
ATT = "attention (rope, cache write, softmax, o-input prep)"


def paged(m, bs: int, order: str = "in order", block_major: bool = False) -> PagedKVCache:
    n = (P + bs) // bs + 1
    c = PagedKVCache(m.cfg, 1, P + bs, 2 * n, bs, m.compute_dtype, m.device)
    if block_major:  # [layers, blocks, KV, bs, D] contiguous, as the pool was stored before
        c.k, c.v = c.k.contiguous(), c.v.contiguous()
    t = torch.arange(n, dtype=torch.int32)
    if order == "every other":
        t = t * 2
    elif order == "shuffled":
        t = t[torch.randperm(n, generator=torch.Generator().manual_seed(0))]
    c.table[0, :n] = t
    return c


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    m = load(str(families.build("mistral", cache_dir() / "bench" / "paged-attention-mistral", **SHAPE)), "int4").model
    caches = {"slots": m.new_cache(1, P + 64), "paged head-major, 64, in order": paged(m, 64),
              "paged head-major, 64, every other block": paged(m, 64, "every other"),
              "paged head-major, 64, shuffled": paged(m, 64, "shuffled"),
              "paged head-major, 256, in order": paged(m, 256),
              "paged block-major (before), 64, in order": paged(m, 64, block_major=True)}
    assert caches["paged head-major, 64, in order"].k.transpose(1, 2).is_contiguous()
    for c in caches.values():
        c.k.normal_()
        c.v.normal_()
    tok, rows = torch.tensor([5]), Rows.of([(0, P, 1)], "cpu")
    ms = {k: [] for k in caches}
    with torch.inference_mode():
        m.forward_rows(tok, rows, caches["slots"])  # the plan is built on the first step
        for _ in range(rounds):
            for name, c in caches.items():
                ops.fused.fused_profile(m, True, True)
                for _ in range(10):
                    m.forward_rows(tok, rows, c)
                prof = ops.fused.fused_profile(m, False, True)
                ms[name].append(np.mean([th.get(ATT, 0.0) for th in prof["threads"]]) / prof["steps"] * 1e3)
    print(f"{rounds} rounds of 10 steps per cache, alternated; fused steps: {ops.fused_info()['fused_steps']}, "
          f"reference steps: {ops.fused_info()['reference_steps']}\n")
    print("| cache | attention phase ms a step (median) | / slots (median of per-round ratios) |")
    print("| --- | ---: | ---: |")
    base = np.array(ms["slots"])
    for name, v in ms.items():
        print(f"| {name} | {np.median(v):.3f} | {np.median(np.array(v) / base):.3f} |")


if __name__ == "__main__":
    main()
