"""What a windowed model's KV cache holds at long context (issue 41, item 3): a Mistral-architecture model
(every layer windowed, GQA; small random weights: what the cache holds does not depend on their values), or
with --family gemma3 a Gemma 3 one (5 windowed layers to 1 full, the windowed ones in a pool of their own),
with a 4,096-token window, sequences of 32,768 positions, scheduled as `serve` schedules them (decode-first,
paged, prefill chunks of 64), against the same model with a cache that keeps every block; the planner's
projection (engine/planner/counts.py kv_cache_bytes) beside both; the greedy tokens of the two runs compared.
With --static, the static batch `bench` and `generate` run instead (engine/infer/generate.py run_static:
prefill-first, chunks of 512), its windowed paged cache against slots that keep every position.

    PYTHONPATH=. .venv/bin/python bench/kv_window.py [--family gemma3] [--static] --out docs/runs/<date>/<folder>
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.common.formulas import sequence_blocks  # noqa: E402
from engine.common.paths import cache_dir  # noqa: E402
from engine.infer.batch import Request  # noqa: E402
from engine.infer.paged import block_bytes  # noqa: E402
from engine.infer.sampling import SamplingParams  # noqa: E402
from engine.infer.scheduler import BatchSettings, Scheduler  # noqa: E402
from tests import families  # noqa: E402

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=65536)
GEMMA3 = dict(SHAPE, num_hidden_layers=6, head_dim=64, query_pre_attn_scalar=64,
              layer_types=["sliding_attention"] * 5 + ["full_attention"])  # Gemma 3's 5 local : 1 global


def run(lm, settings, prompts, new, keep_all: bool):
    import engine.infer.paged as paged

    reach = paged.window_reach
    if keep_all:  # the cache as it was before windows gave blocks back
        paged.window_reach = lambda cfg, second_pool=False: 0
    try:
        sched = Scheduler(lm, settings)
    finally:
        paged.window_reach = reach
    seqs, most, most_bytes, t0 = {}, 0, 0, time.perf_counter()
    for i, p in enumerate(prompts):
        r = Request(p, new, SamplingParams(), stop_at_eos=False)
        r.on_token = lambda s, *a, i=i: seqs.setdefault(i, s)
        sched.submit(r)
    while sched.has_work():
        sched.step()
        most = max([most] + [sched.blocks.held(s.slot) for s in sched.running])
        most_bytes = max([most_bytes] + [sched.batch.cache.held_nbytes(s.slot) for s in sched.running])
    return dict(tokens=[list(seqs[i].out) for i in range(len(prompts))], wall_s=time.perf_counter() - t0,
                seq_blocks_most=most, seq_bytes_most=most_bytes, blocks_peak=sched.blocks.peak, kv=sched.kv_facts(),
                allocated_bytes=sched.batch.cache.nbytes())


def run_static_pair(lm, prompts, new, planner: float, out: Path, title: str) -> None:
    """bench's static batch of the prompts with the cache it picks (paged, windows given back) and with slots."""
    from engine.infer.generate import run_static

    passes = []
    for _ in range(3):  # alternated: paged, slots, paged, slots, ... (times move between passes on this host)
        runs = {}
        for kv in (None, "slots"):
            r = run_static(lm, prompts, new, SamplingParams(), stop_at_eos=False, kv_cache=kv)
            runs[r.settings["kv_cache"]] = r
        passes.append(runs)
    paged, slots = passes[0]["paged"], passes[0]["slots"]
    per_seq = paged.kv_bytes / len(prompts)
    res = dict(kv_bytes={k: r.kv_bytes for k, r in passes[0].items()}, planner_bytes_per_sequence=planner,
               held_over_full=paged.kv_bytes / slots.kv_bytes, held_over_planner=per_seq / planner,
               tokens_identical=all(r.new_tokens == slots.new_tokens for p in passes for r in p.values()),
               prefill_s=[{k: r.prefill_s for k, r in p.items()} for p in passes],
               decode_step_median_s=[{k: float(np.median(r.step_s)) for k, r in p.items()} for p in passes],
               settings={k: r.settings for k, r in passes[0].items()})
    out.mkdir(parents=True, exist_ok=True)
    (out / "kv_window_static.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"{title}; the static batch of `bench` (run_static: prefill-first, chunks of 512), three passes "
             "alternating the caches\n",
             "| cache | allocated MiB (the whole batch) | prefill s, passes 1 / 2 / 3 | "
             "decode step median ms, passes 1 / 2 / 3 |",
             "| --- | ---: | ---: | ---: |"]
    for name, k in (("paged, gives back blocks behind the window (picked)", "paged"),
                    ("slots, every position", "slots")):
        pre = " / ".join(f"{p[k].prefill_s:.1f}" for p in passes)
        dec = " / ".join(f"{d[k] * 1e3:.2f}" for d in res["decode_step_median_s"])
        lines.append(f"| {name} | {passes[0][k].kv_bytes / 2 ** 20:.1f} | {pre} | {dec} |")
    lines += ["", f"- held / full context: **{res['held_over_full']:.3f}**",
              f"- held / the planner's projection: **{res['held_over_planner']:.3f}**",
              f"- greedy tokens identical: **{res['tokens_identical']}**"]
    (out / "kv_window_static.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--context", type=int, default=32768, help="positions per sequence: prompt + new tokens")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--precision", default="int4", help="the weights' (int4 and int8 run the fused C++ step)")
    ap.add_argument("--family", choices=("mistral", "gemma3"), default="mistral")
    ap.add_argument("--head-dim", type=int, default=0, help="0: the shape's (Mistral 32: the PyTorch path; 64 and "
                    "up run the fused step)")
    ap.add_argument("--static", action="store_true", help="bench's static batch (prefill-first) against slots")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from engine.infer.loader import load
    from engine.planner.counts import kv_cache_bytes
    from engine.planner.hf_config import shape_from_hf_config_file

    shape = GEMMA3 if a.family == "gemma3" else SHAPE
    if a.head_dim:
        shape = dict(shape, head_dim=a.head_dim, **({"query_pre_attn_scalar": a.head_dim} if a.family == "gemma3"
                                                    else {}))
    hd = f"-hd{a.head_dim}" if a.head_dim else ""
    folder = families.build(a.family, cache_dir() / "bench" / f"kv-window-{a.family}-{a.window}{hd}", **shape,
                            sliding_window=a.window)
    lm = load(str(folder), a.precision)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, families.VOCAB, (a.context - a.new,), generator=g).tolist() for _ in range(a.seqs)]
    planner = kv_cache_bytes(shape_from_hf_config_file(folder / "config.json"), a.context, "fp32")
    arch = ("Gemma 3 architecture (5 windowed layers to 1 full; the windowed ones in a pool of their own)"
            if a.family == "gemma3" else "Mistral architecture (every layer windowed)")
    if a.static:
        from engine import ops

        title = f"{arch}, head_dim {lm.model.cfg.head_dim}, window {a.window}, {a.seqs} sequences of {a.context} " \
                f"positions, {a.precision} weights, fp32 KV"
        run_static_pair(lm, prompts, a.new, planner, a.out, title)
        print(ops.fused_info())  # which path ran: the fused step, or the PyTorch path and why
        return
    settings = BatchSettings(max_seqs=a.seqs, max_model_len=a.context, max_batched_tokens=a.seqs + a.chunk,
                             prefill_chunk=a.chunk, kv_cache="paged")
    windowed = run(lm, settings, prompts, a.new, keep_all=False)
    full = run(lm, settings, prompts, a.new, keep_all=True)
    bs = 64
    res = dict(family=a.family, precision=a.precision, window=a.window, context=a.context, seqs=a.seqs, chunk=a.chunk,
               block_size=bs,
               formula_blocks=sequence_blocks(a.context, bs, a.window, a.chunk),
               full_blocks=sequence_blocks(a.context, bs),
               windowed={k: v for k, v in windowed.items() if k != "tokens"},
               kept_all={k: v for k, v in full.items() if k != "tokens"},
               planner_bytes_per_sequence=planner, block_bytes=block_bytes(lm.model.cfg, bs, "fp32"),
               tokens_identical=windowed["tokens"] == full["tokens"])
    res["held_over_full"] = windowed["seq_bytes_most"] / full["seq_bytes_most"]
    res["held_over_planner"] = windowed["seq_bytes_most"] / planner
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "kv_window.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"{arch}, window {a.window}, {a.seqs} sequences of {a.context} "
             f"positions, prefill chunks of {a.chunk}, blocks of {bs}, {a.precision} weights, fp32 KV "
             "(wall times: once each, one after the other, on a noisy host)\n",
             "| cache | most blocks one sequence held | most MiB one sequence held | blocks allocated (default "
             "budget) | allocated MiB | wall s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in (("gives back blocks behind the window", windowed), ("keeps every block", full)):
        kv = r["kv"]
        alloc = f"{kv['num_blocks']}" + (f" + {kv['window_blocks']} windowed" if kv.get("window_blocks") else "")
        lines.append(f"| {name} | {r['seq_blocks_most']} | {r['seq_bytes_most'] / 2 ** 20:.2f} | {alloc} | "
                     f"{r['allocated_bytes'] / 2 ** 20:.1f} | {r['wall_s']:.1f} |")
    lines += ["",
              f"- held / full context (bytes one sequence held at most): **{res['held_over_full']:.3f}**; the "
              f"formula's bound {res['formula_blocks']} blocks a windowed layer",
              f"- held / the planner's projection (engine/planner/counts.py kv_cache_bytes at {a.context} positions: "
              f"windowed layers count their window): **{res['held_over_planner']:.3f}** (the engine also holds the "
              "next chunk, and whole blocks)",
              f"- greedy tokens identical: **{res['tokens_identical']}**"]
    (a.out / "kv_window.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
