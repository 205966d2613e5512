"""Decode steps over an fp32 and an int8 paged KV cache at long context, the fused C++ step (issue 41, item 3:
int8 K/V with integer dot products). One model, one process, the two caches' steps taking turns within each
round (the host is noisy): median step ms per context and cache, and int8 / fp32 within this run.

    PYTHONPATH=. .venv/bin/python bench/kv_int8_attention.py [--model default-draft] [--contexts 512,2048,4096]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.infer.model import Rows  # noqa: E402
from engine.infer.paged import PagedKVCache  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--contexts", default="512,2048,4096")
    ap.add_argument("--seqs", type=int, default=4, help="sequences decoding together")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="decode steps per cache per round")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from engine import ops
    from engine.infer.loader import load

    lm = load(a.model, a.precision)
    model, cfg = lm.model, lm.model.cfg
    contexts = [int(c) for c in a.contexts.split(",")]
    top = max(contexts) + a.rounds * a.steps + 1
    blocks = -(-top // 64)
    rows = []
    for ctx in contexts:
        caches = {}
        for kv in ("fp32", "int8"):
            c = caches[kv] = PagedKVCache(cfg, a.seqs, top, a.seqs * blocks, 64, torch.float32, "cpu", kv)
            for s in range(a.seqs):
                c.blocks.admit(s, [], top, 0)
                c.sync(s)
            with torch.inference_mode():
                for s in range(a.seqs):  # every sequence's context, prefilled 64 rows at a time
                    ids = torch.randint(3, 20000, (ctx,), generator=torch.Generator().manual_seed(s))
                    for p in range(0, ctx, 64):
                        model.forward_rows(ids[p:p + 64], Rows.of([(s, p, min(64, ctx - p))], "cpu"), c,
                                           logits_at=torch.tensor([min(64, ctx - p) - 1]))
        times = {kv: [] for kv in caches}
        pos = ctx
        tok = torch.full((a.seqs,), 100)
        ops.reset_fused_stats()
        with torch.inference_mode():
            for _ in range(a.rounds):
                for kv, c in caches.items():
                    for i in range(a.steps):
                        t0 = time.perf_counter()
                        model.forward_rows(tok, Rows.of([(s, pos + i, 1) for s in range(a.seqs)], "cpu"), c)
                        times[kv].append(time.perf_counter() - t0)
                pos += a.steps
        info = ops.backend_info()
        med = {kv: statistics.median(t) * 1e3 for kv, t in times.items()}
        rows.append(dict(context=ctx, seqs=a.seqs, fp32_ms=med["fp32"], int8_ms=med["int8"],
                         int8_over_fp32=med["int8"] / med["fp32"], fused_steps=info["fused_steps"],
                         reference_steps=info["reference_steps"]))
        print(json.dumps(rows[-1]), file=sys.stderr)
    lines = [f"{a.model} at {a.precision}, {a.seqs} sequences decoding, the fused step "
             f"({ops.backend_info()['cpu']}), median of {a.rounds * a.steps} steps per cell\n",
             "| context | fp32 KV step ms | int8 KV step ms | int8 / fp32 |", "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['context']} | {r['fp32_ms']:.1f} | {r['int8_ms']:.1f} | {r['int8_over_fp32']:.2f} |" for r in rows]
    print("\n".join(lines))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "kv_int8_attention.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
