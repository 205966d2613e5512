"""The paged KV cache's three targets, in one run, as ratios.

1. capacity: at one KV budget on the 1.5B, the blocks each KV precision's cache really allocates
   (engine/infer/paged.py) and the sequences of --seq-len positions that fit, int8 / bf16; and the
   KV cache's own quality loss: llama.cpp-style KLD of the 1.5B's fp32 weights with its K/V cached at
   bf16 and at int8, against the fp32 reference, on the same --kld-tokens tokens (mean increase);
2. prefix caching: our server (the 0.5B at int4) on the multi-turn ShareGPT workload at concurrency
   4, with --prefix-caching and with --no-prefix-caching: TTFT p50 off / on, output tok/s on / off,
   and the hit rate from /metrics (vLLM's vllm:prefix_cache_* counters);
3. no regression: the same server, the single-turn ShareGPT chat workload at concurrency 8, paged
   (prefix caching off) against --kv-cache slots: output tok/s paged / slots;
4. cost: the same server at one small KV budget, its KV cache at the compute dtype and at int8, swept
   over concurrencies on long prompts: $/1M output tokens at the SLO each (stored as load records).

    .venv/bin/python bench/kv_cache.py                        # all three (~30 min on 2 cores)
    .venv/bin/python bench/kv_cache.py --parts capacity       # one part: capacity, prefix, regression, cost
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.common.formulas import DEFAULT_USD_PER_HOUR  # noqa: E402
from engine.load.run import LoadConfig, run  # noqa: E402
from engine.peers import servers  # noqa: E402
from engine.peers.servers import ServerSpec  # noqa: E402


def capacity(a) -> list[str]:
    import torch

    from engine.common.formulas import sequences_in_blocks
    from engine.infer.loader import make_spec
    from engine.infer.paged import PagedKVCache, blocks_in_budget
    from engine.measure import quality
    from engine.measure.pool import ModelPool

    lm = ModelPool(keep=1).get(a.big, make_spec("fp32"), "cpu")
    cfg, rows, fits = lm.model.cfg, [], {}
    for kv in ("fp32", "bf16", "int8"):
        n, _ = blocks_in_budget(cfg, 64, kv, a.kv_gib, a.seq_len)
        cache = PagedKVCache(cfg, 1, a.seq_len, n, 64, torch.float32, "cpu", kv)  # what is really allocated
        fits[kv] = sequences_in_blocks(n, 64, a.seq_len)
        rows.append((kv, n, cache.nbytes() / 2 ** 30, fits[kv]))
        del cache
    out = [f"\n### 1. Capacity at a {a.kv_gib:g} GiB KV budget ({a.big}, sequences of {a.seq_len} positions)\n",
           "| KV dtype | blocks of 64 | allocated GiB | sequences that fit |", "| --- | --- | --- | --- |"]
    out += [f"| {kv} | {n} | {g:.3f} | {f} |" for kv, n, g, f in rows]
    out.append(f"\nint8 / bf16 sequences: **{fits['int8'] / fits['bf16']:.2f}x** (target >= 1.9x)\n")
    kld = {}
    for kv in ("bf16", "int8"):
        r = quality.evaluate(lm, a.kld_tokens, progress=lambda s: print(s, file=sys.stderr), kv_dtype=kv)
        kld[kv] = r
    out += [f"KLD of {a.big} (fp32 weights) against its fp32 reference, {a.kld_tokens} tokens, the K/V cached at:\n",
            "| KV dtype | KLD mean | KLD p99 | same top-1 |", "| --- | --- | --- | --- |"]
    for kv, r in kld.items():
        out.append(f"| {kv} | {r['kld_mean']:.5f} | {r['kld_p99']:.4f} | {r['top1_agreement']:.4f} |")
    inc = kld["int8"]["kld_mean"] - kld["bf16"]["kld_mean"]
    out.append(f"\nKLD mean increase int8 - bf16: **{inc:.5f}** (target <= 0.005)\n")
    return out


def _load(spec: ServerSpec, profile: str, workload: str, a) -> dict:
    with servers.start(spec, progress=lambda s: print(s, file=sys.stderr)) as rs:
        cfg = LoadConfig(url=rs.url, profile=profile, workload=workload, max_output_len=a.max_output_len,
                         requests=a.requests, warmup=1, max_seconds=1800, tokenizer=a.small)
        (rec,) = run(cfg)
    m = rec.metrics["load"]
    return {"tok_s": m["server_output_tok_s"] or m["output_tok_s"], "ttft_p50": m["ttft_s_p50"],
            "ttft_p90": m.get("ttft_s_p90"), "completed": m["completed"], "requests": m["requests"],
            "prefix": m.get("prefix_cache")}


def _spec(a, slots: int, extra: list[str], **kv) -> ServerSpec:
    return ServerSpec.of(servers.OURS, model=a.small, precision="int4", slots=slots, max_model_len=a.max_model_len,
                         extra_args=extra, **kv).validate()


def prefix(a) -> list[str]:
    wl = f"multiturn:{a.conversations}:{a.turns}"
    on = _load(_spec(a, 4, ["--prefix-caching"]), "concurrent:4", wl, a)
    off = _load(_spec(a, 4, []), "concurrent:4", wl, a)
    hr = (on["prefix"] or {}).get("hit_rate")
    out = [f"\n### 2. Prefix caching: {a.small} int4, {wl} (ShareGPT, each turn the conversation so far), "
           f"concurrency 4, max output {a.max_output_len}\n",
           "| prefix cache | requests ok | TTFT p50 s | TTFT p90 s | output tok/s | hit rate |",
           "| --- | --- | --- | --- | --- | --- |"]
    for name, r in (("on", on), ("off", off)):
        h = (r["prefix"] or {}).get("hit_rate")
        out.append(f"| {name} | {r['completed']}/{r['requests']} | {r['ttft_p50']:.2f} | {r['ttft_p90'] or 0:.2f} | "
                   f"{r['tok_s']:.1f} | {'-' if h is None else f'{h:.2f}'} |")
    out.append(f"\nTTFT p50 off / on: **{off['ttft_p50'] / on['ttft_p50']:.2f}x** (target >= 2x); "
               "output tok/s on / off: "
               f"**{on['tok_s'] / off['tok_s']:.2f}x** (target > 1); hit rate {hr if hr is None else f'{hr:.2f}'}\n")
    return out


def regression(a) -> list[str]:
    rows = {}
    for name, cache in (("slots", "slots"), ("paged", "paged"), ("slots again", "slots")):
        rows[name] = _load(_spec(a, 8, [], kv_cache=cache), "concurrent:8", f"chat:{a.requests}", a)
    slots = (rows["slots"]["tok_s"] + rows["slots again"]["tok_s"]) / 2
    out = [f"\n### 3. No regression: {a.small} int4, ShareGPT chat (single turn), concurrency 8, prefix caching off\n",
           "| KV cache | requests ok | output tok/s | TTFT p50 s |", "| --- | --- | --- | --- |"]
    out += [f"| {n} | {r['completed']}/{r['requests']} | {r['tok_s']:.1f} | {r['ttft_p50']:.2f} |"
            for n, r in rows.items()]
    out.append(f"\npaged / slots (the mean of the two slot runs around it): **{rows['paged']['tok_s'] / slots:.2f}x** "
               "(target >= 0.95x)\n")
    return out


def cost(a) -> list[str]:
    """Our server at one small KV budget, its KV cache at the compute dtype (fp32 here) and at int8, each
    swept over the same concurrencies on long prompts; $/1M output tokens at the SLO from the records
    (engine.present.load_cost.kv_cost_rows, what the Load and Cost pages and reports show)."""
    from engine.measure.store import Store
    from engine.peers.load_sweep import SweepPlan, sweep_servers
    from engine.present import load_cost, load_view

    specs = [_spec(a, 8, [], kv_dtype=kv, kv_cache_gib=a.cost_kv_gib) for kv in ("auto", "int8")]
    plan = SweepPlan(loads=a.cost_loads, workload=a.cost_workload, max_output_len=a.max_output_len, slo=a.cost_slo,
                     max_model_len=a.max_model_len, warmup=1)
    res = sweep_servers(specs, plan, Store(), progress=lambda s: print(s, file=sys.stderr))
    if res.skipped:
        raise SystemExit(f"not measured: {res.skipped}")
    recs = res.records
    out = [f"\n### 4. $/1M output tokens at the SLO, KV cache quantized or not: {a.small} int4, one "
           f"{a.cost_kv_gib:g} GiB KV budget, {a.cost_workload}, concurrency {a.cost_loads}, SLO {a.cost_slo}, "
           f"${a.usd_per_hour:g}/hour\n", "| KV cache | load | output tok/s | TTFT p50 s | TTFT p90 s | ITL p90 s | "
           "met SLO | preemptions |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in recs:
        row = load_view.load_row(r)
        out.append(f"| {row['kv']} | {row['profile']} | {row['out_tok_s']:.1f} | {row['ttft_p50_ms'] / 1000:.1f} | "
                   f"{row['ttft_p90_ms'] / 1000:.1f} | {row['itl_p90_ms'] / 1000:.2f} | {row['slo_share']:.2f} | "
                   f"{row['preempted']} |")
    (kv,) = load_cost.kv_cost_rows(recs, a.usd_per_hour)
    out += ["", "| " + " | ".join(load_cost.KV_COST_LABELS.values()) + " |",
            "|" + " --- |" * len(load_cost.KV_COST_LABELS),
            "| " + " | ".join("-" if kv[k] is None else str(kv[k]) for k in load_cost.KV_COST_LABELS) + " |",
            f"\nrun ids: {', '.join(r.run_id for r in recs)}\n"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="capacity,prefix,regression,cost")
    ap.add_argument("--big", default="default", help="the capacity and KLD model (the 1.5B)")
    ap.add_argument("--small", default="default-draft", help="the served model (the 0.5B)")
    ap.add_argument("--kv-gib", type=float, default=1.0)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--kld-tokens", type=int, default=8192)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16, help="single-turn requests (part 3)")
    ap.add_argument("--max-output-len", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--cost-kv-gib", type=float, default=0.1, help="part 4's KV budget (fp32 KV: ~3 long prompts)")
    ap.add_argument("--cost-workload", default="summarize:16", help="part 4: long ShareGPT prompts (~1,100 tokens)")
    ap.add_argument("--cost-loads", default="1,4,8")
    ap.add_argument("--cost-slo", default="ttft=20,itl=0.5")
    ap.add_argument("--usd-per-hour", type=float, default=DEFAULT_USD_PER_HOUR)
    ap.add_argument("--json", default=None, help="also write the lines to this file")
    a = ap.parse_args()
    parts = {"capacity": capacity, "prefix": prefix, "regression": regression, "cost": cost}
    lines = []
    for p in a.parts.split(","):
        lines += parts[p](a)
        print("\n".join(lines), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(lines, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
