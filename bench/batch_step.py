"""How a decode step's time grows with the number of sequences in it: the ceiling of continuous batching.

    .venv/bin/python bench/batch_step.py --model default-draft --precision int4 --batch 1,2,4,8

One forward pass of B sequences, one row each, at ragged positions (each sequence prefilled with its
own prompt length first), min of --reps, on whichever path the engine picks (the fused C++ step on
CPU; SCL_FUSED=0 for the PyTorch path). Aggregate tokens/s = B / step time: the most a server can
sustain at concurrency B before prefill, sampling, HTTP and streaming take their share.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import ops  # noqa: E402
from engine.infer.loader import load, make_spec  # noqa: E402
from engine.infer.model import Rows  # noqa: E402
from engine.present import format_rows  # noqa: E402


def step_ms(lm, batch: int, reps: int, base_len: int = 200) -> float:
    """min over reps of one forward pass of `batch` one-row segments at positions base_len + 7·i."""
    m = lm.model
    gen = torch.Generator().manual_seed(0)
    lens = [base_len + 7 * i for i in range(batch)]
    cache = m.new_cache(batch, max(lens) + reps + 8)
    with torch.inference_mode():
        for slot, n in enumerate(lens):  # each sequence's own prompt
            ids = torch.randint(100, 20000, (n,), generator=gen)
            m.forward_rows(ids, Rows.of([(slot, 0, n)], "cpu"), cache, logits_at=torch.tensor([n - 1]))
        best = float("inf")
        for r in range(reps):
            toks = torch.randint(100, 20000, (batch,), generator=gen)
            rows = Rows.of([(slot, n + r, 1) for slot, n in enumerate(lens)], "cpu")
            t = time.perf_counter()
            m.forward_rows(toks, rows, cache)
            best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args(argv)
    lm = load(a.model, make_spec(a.precision), "cpu")
    sizes = [int(x) for x in a.batch.split(",")]
    one = None
    out = []
    for b in sizes:
        ms = step_ms(lm, b, a.reps)
        one = one or ms
        out.append({"sequences": b, "step ms": round(ms, 2), "vs 1 sequence": round(ms / one, 2),
                    "aggregate tok/s": round(b * 1e3 / ms, 1), "per-sequence tok/s": round(1e3 / ms, 1)})
    info = ops.backend_info()
    print(f"# {lm.label}: forward pass of B one-row sequences at ragged positions; path: "
          f"{info.get('last_step') or 'reference'}, kernels {info.get('cpu')}, "
          f"activations {info.get('int4_activations')}")
    print(format_rows(out, "md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
