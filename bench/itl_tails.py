"""How long prefill chunks hold up decode steps: ITL tails against TTFT at each prefill chunk size and step budget.

Our server (the 0.5B at int4 unless told) is started once per chunk size and step factor (`--prefill-chunk C
--max-step-factor F`; F 0 is the budget before issue 41: a decode round plus one whole chunk; F > 0 lets the
server choose the prompt rows a step carries from its measured step costs), and `python -m engine load`'s client
sends the same kind of load to each: concurrency 8, fresh random prompts of 256 tokens, 128 forced output
tokens. A decode step that also runs a prefill chunk takes as long as the chunk, so every stream's next token
waits for it: ITL p99 (vLLM's ITL: every gap between tokens, pooled) grows with the chunk, while smaller
chunks spread a prompt over more steps and raise TTFT.

    .venv/bin/python bench/itl_tails.py                       # chunk 64, step factors 0 and 3, on the 0.5B int4
    .venv/bin/python bench/itl_tails.py --chunks 256,128,64,32 --step-factors 0
    .venv/bin/python bench/itl_tails.py --model default --requests 16
    .venv/bin/python bench/itl_tails.py --pin                 # the server alone on a core, the client apart
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.load.run import LoadConfig, run  # noqa: E402
from engine.peers import servers  # noqa: E402
from engine.peers.servers import ServerSpec  # noqa: E402

VLLM_PY = Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python"


def point(chunk: int, factor: float, a) -> dict:
    spec = ServerSpec.of(servers.OURS, model=a.model, precision=a.precision, slots=a.concurrency,
                         max_model_len=a.input_len + a.output_len + 16,
                         extra_args=["--prefill-chunk", str(chunk), "--max-step-factor", f"{factor:g}"])
    cores = sorted(os.sched_getaffinity(0))
    if a.pin:  # the server inherits core 0 alone (one torch thread); this process, the client, keeps the rest
        os.sched_setaffinity(0, cores[:1])
    try:
        rs = servers.start(spec, progress=lambda s: print(s, file=sys.stderr))
    finally:
        os.sched_setaffinity(0, cores[1:] if a.pin and len(cores) > 1 else cores)
    with rs:
        import httpx

        lab = httpx.get(rs.url + "/v1/models", timeout=30).json()["data"][0].get("lab") or {}
        out = _vllm_point(rs, spec, a) if a.client == "vllm" else _lab_point(rs, a)
    os.sched_setaffinity(0, cores)
    sb, st = lab.get("step_budget") or {}, lab.get("settings") or {}
    return {"chunk": chunk, "factor": factor, **out, "budget": st.get("max_batched_tokens"),
            "prompt_rows": sb.get("prompt_rows"),
            "decode_ms": None if sb.get("decode_s") is None else sb["decode_s"] * 1e3,
            "profile_s": sb.get("profile_s")}


def _lab_point(rs, a) -> dict:
    """The lab's load client (`python -m engine load`): every gap pooled, the run stored as a load record."""
    cfg = LoadConfig(url=rs.url, profile=f"concurrent:{a.concurrency}", workload=None, input_len=a.input_len,
                     output_len=a.output_len, prompt_kind="random", requests=a.requests, warmup=1, max_seconds=900,
                     tokenizer=a.model if a.model in ("default", "default-draft") else "default-draft")
    (rec,) = run(cfg)
    m = rec.metrics["load"]
    assert m["completed"] == a.requests and m["lengths_forced"] == "forced", m
    return {"tok_s": m["server_output_tok_s"], "gap_p50": m["gap_s_p50"], "gap_p99": m["gap_s_p99"],
            "ttft_p50": m["ttft_s_p50"], "ttft_p99": m["ttft_s_p99"], "run": rec.run_id}


def _vllm_point(rs, spec, a) -> dict:
    """vLLM's client (bench/vllm_bench_client.py, from .venv-vllm), as issue 41's targets are stated: a warm-up
    request, then fresh random prompts (a seed per server), lengths forced with ignore_eos."""
    import argparse
    import time

    from engine.infer import catalog
    from under_load import vllm_client

    tok = catalog.resolve(a.model)
    ns = argparse.Namespace(input_len=a.input_len, output_len=a.output_len, prompts=1, concurrency=a.concurrency)
    vllm_client(rs.url, spec.served_name, tok, ns, 1)
    v = vllm_client(rs.url, spec.served_name, tok, argparse.Namespace(**{**vars(ns), "prompts": a.requests}),
                    int(time.time()))
    assert v["completed"] == a.requests, v.get("errors")
    return {"tok_s": v["output_throughput"], "gap_p50": v["median_itl_ms"] / 1e3, "gap_p99": v["p99_itl_ms"] / 1e3,
            "ttft_p50": v["median_ttft_ms"] / 1e3, "ttft_p99": v["p99_ttft_ms"] / 1e3, "run": "vLLM client"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="64")
    ap.add_argument("--step-factors", default="0,3", help="--max-step-factor of each server (0: a decode round plus "
                    "one whole chunk)")
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--client", choices=("vllm", "lab"), default="vllm" if VLLM_PY.exists() else "lab",
                    help="vLLM's bench client (.venv-vllm; issue 41's targets are stated with it) or the lab's")
    ap.add_argument("--pin", action="store_true",
                    help="the server alone on the first core, the client on the others (no oversubscription)")
    a = ap.parse_args()
    rows = [point(int(c), float(f), a) for c in a.chunks.split(",") for f in a.step_factors.split(",")]
    print(f"\n{a.model} at {a.precision}, concurrency {a.concurrency}, {a.requests} fresh random prompts of "
          f"{a.input_len} tokens, {a.output_len} forced output tokens, {a.client}'s client; output tok/s"
          + ("; the server alone on one core, the client on the rest" if a.pin else "") + "\n")
    print("| prefill chunk | step factor | step budget (rows) | prompt rows | profiled decode ms | output tok/s | "
          "ITL p50 ms | ITL p99 ms | p99 / p50 | TTFT p50 s | TTFT p99 s | run |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['chunk']} | {r['factor']:g} | {r['budget']} | {r['prompt_rows'] or 'n/a'} | "
              f"{'n/a' if r['decode_ms'] is None else format(r['decode_ms'], '.0f')} | {r['tok_s']:.1f} | "
              f"{r['gap_p50'] * 1000:.0f} | {r['gap_p99'] * 1000:.0f} | {r['gap_p99'] / r['gap_p50']:.1f} | "
              f"{r['ttft_p50']:.2f} | {r['ttft_p99']:.2f} | {r['run']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
