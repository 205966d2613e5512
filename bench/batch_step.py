"""How a decode step's time grows with the number of sequences in it: the ceiling of continuous batching.

    .venv/bin/python bench/batch_step.py --model default-draft --precision int4 --batch 1,2,4,8
    .venv/bin/python bench/batch_step.py --precision int4 --batch 8 --prompt-len 256 --output-len 128

One forward pass of B sequences, one row each, at ragged positions (each sequence prefilled with its
own prompt length first), min of --reps, on whichever path the engine picks (the fused C++ step on
CPU; SCL_FUSED=0 for the PyTorch path). Aggregate tokens/s = B / step time: the most a server can
sustain at concurrency B before prefill, sampling, HTTP and streaming take their share.

With --prompt-len P, the ceiling of a workload of P-token prompts and --output-len O output tokens at
concurrency B counts prefill as well: each request costs one prefill of its P tokens (one forward pass of
the whole prompt, min of --reps; it yields the first output token) and O - 1 decode rows, each 1/B of a
B-sequence step (at the mean decode position P + O/2), so

    workload ceiling tok/s = O / (prefill ms + (O - 1) * step ms / B) * 1000

the most a server can deliver on that traffic with this engine's steps and nothing else (bench/under_load.py
measures what it does deliver; docs/BENCHMARKS.md compares the two).
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


def prefill_ms(lm, prompt_len: int, reps: int) -> float:
    """min over reps of one forward pass of a fresh prompt_len-token prompt into an empty slot (logits at its end)."""
    m = lm.model
    gen = torch.Generator().manual_seed(1)
    cache = m.new_cache(1, prompt_len + 8)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            ids = torch.randint(100, 20000, (prompt_len,), generator=gen)
            t = time.perf_counter()
            m.forward_rows(ids, Rows.of([(0, 0, prompt_len)], "cpu"), cache, logits_at=torch.tensor([prompt_len - 1]))
            best = min(best, time.perf_counter() - t)
    return best * 1e3


def workload_ceiling(prefill: float, step: float, batch: int, output_len: int) -> float:
    """Output tok/s at concurrency `batch`: each request one prefill (its first token) and output_len - 1 decode
    rows at 1/batch of a step each (the module docstring's formula)."""
    return output_len / (prefill + (output_len - 1) * step / batch) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--prompt-len", type=int, default=0,
                    help="add the workload ceiling for prompts of this many tokens (0: the decode step alone)")
    ap.add_argument("--output-len", type=int, default=128, help="output tokens per request, with --prompt-len")
    a = ap.parse_args(argv)
    if a.prompt_len < 0 or a.output_len < 1:
        ap.error(f"--prompt-len must be >= 0 and --output-len >= 1 (got {a.prompt_len}, {a.output_len})")
    lm = load(a.model, make_spec(a.precision), "cpu")
    sizes = [int(x) for x in a.batch.split(",")]
    base = a.prompt_len + a.output_len // 2 if a.prompt_len else 200
    pre = prefill_ms(lm, a.prompt_len, a.reps) if a.prompt_len else None
    one = None
    out = []
    for b in sizes:
        ms = step_ms(lm, b, a.reps, base)
        one = one or ms
        row = {"sequences": b, "step ms": round(ms, 2), "vs 1 sequence": round(ms / one, 2),
               "aggregate tok/s": round(b * 1e3 / ms, 1), "per-sequence tok/s": round(1e3 / ms, 1)}
        if pre is not None:
            row[f"workload ceiling tok/s ({a.prompt_len} in / {a.output_len} out)"] = round(
                workload_ceiling(pre, ms, b, a.output_len), 1)
        out.append(row)
    info = ops.backend_info()
    print(f"# {lm.label}: forward pass of B one-row sequences at ragged positions from {base}; path: "
          f"{info.get('last_step') or 'reference'}, kernels {info.get('cpu')}, "
          f"activations {info.get('int4_activations')}")
    if pre is not None:
        print(f"# prefill of one {a.prompt_len}-token prompt in one forward pass: {pre:.2f} ms (min of {a.reps})")
    print(format_rows(out, "md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
