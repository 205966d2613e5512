"""Sliding windows, measured: decode at context 2048 on a Mistral-shape model (random weights: speed does not
depend on their values), window 256 against full attention, the fused C++ step against the PyTorch path.

    PYTHONPATH=. .venv/bin/python bench/sliding_window.py [int4|int8] [threads] [rounds]

The four configurations take turns within each round (the host is noisy); the table is medians of
per-step times, and the ratios are within this one run."""
import os
import statistics
import sys
import time
import warnings

import torch

from engine import ops
from engine.common.paths import cache_dir
from engine.infer.loader import load
from engine.infer.model import Rows
from tests import families

warnings.filterwarnings("ignore")
SHAPE = dict(hidden_size=1024, intermediate_size=3584, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=4096)
CTX, N, ROUNDS = 2048, 8, int(sys.argv[3]) if len(sys.argv) > 3 else 6
prec = sys.argv[1] if len(sys.argv) > 1 else "int4"
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
CACHE = cache_dir() / "bench" / "sliding-window"
torch.set_num_threads(threads)
ids = torch.randint(3, 380, (CTX + N,), generator=torch.Generator().manual_seed(0))
models, caches = {}, {}
for name, win in (("window256", 256), ("full", None)):
    f = families.build("mistral", CACHE / name, **SHAPE, sliding_window=win)
    m = models[name] = load(str(f), prec).model
    cache = caches[name] = m.new_cache(1, CTX + N + 1)
    with ops.using(fused=True):
        for s in range(0, CTX, 512):
            m.forward_rows(ids[s:s + 512], Rows.of([(0, s, 512)], "cpu"), cache, logits_at=torch.tensor([511]))

def steps(name, fused):
    m, cache = models[name], caches[name]
    out = []
    with ops.using(fused=fused), ops.count_steps() as c:
        for k in range(N):
            t = time.perf_counter()
            m.forward_rows(ids[CTX + k:CTX + k + 1], Rows.of([(0, CTX + k, 1)], "cpu"), cache)
            out.append(time.perf_counter() - t)
    assert (c.fused > 0) == fused and (c.reference > 0) != fused, c.as_dict()
    return out[1:]

CONF = {"fused+window": ("window256", True), "pytorch+window": ("window256", False),
        "fused full": ("full", True), "pytorch full": ("full", False)}
res, loads = {k: [] for k in CONF}, []
for rep in range(ROUNDS):
    for key, (name, fused) in CONF.items():
        res[key] += steps(name, fused)
    loads.append(os.getloadavg()[0])
med = {k: 1 / statistics.median(v) for k, v in res.items()}
best = {k: 1 / min(v) for k, v in res.items()}
print(prec, "threads", threads, "load", [round(x, 1) for x in loads])
print("  median tok/s", {k: round(v, 1) for k, v in med.items()})
print("  best   tok/s", {k: round(v, 1) for k, v in best.items()})
print(("  median: fused+window / pytorch+window = %.2fx; fused+window / fused full = %.2fx; "
       "pytorch+window / pytorch full = %.2fx") %
      (med["fused+window"] / med["pytorch+window"], med["fused+window"] / med["fused full"],
       med["pytorch+window"] / med["pytorch full"]))
