"""How long prefill chunks hold up decode steps: ITL tails against TTFT at each prefill chunk size.

Our server (the 0.5B at int4 unless told) is started once per chunk size with `--prefill-chunk C`, and
`python -m engine load`'s client sends the same kind of load to each: concurrency 8, fresh random
prompts of 256 tokens, 128 forced output tokens. A decode step that also runs a prefill chunk takes as
long as the chunk, so every stream's next token waits for it: ITL p99 (vLLM's ITL: every gap between
tokens, pooled) grows with the chunk, while smaller chunks spread a prompt over more steps and raise TTFT.

    .venv/bin/python bench/itl_tails.py                       # chunks 256,128,64,32 on the 0.5B int4
    .venv/bin/python bench/itl_tails.py --chunks 256,64 --model default --requests 16
    .venv/bin/python bench/itl_tails.py --pin                 # the server alone on a core, the client apart
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.load.run import LoadConfig, run  # noqa: E402
from engine.peers import servers  # noqa: E402
from engine.peers.servers import ServerSpec  # noqa: E402


def point(chunk: int, a) -> dict:
    spec = ServerSpec.of(servers.OURS, model=a.model, precision=a.precision, slots=a.concurrency,
                         max_model_len=a.input_len + a.output_len + 16, extra_args=["--prefill-chunk", str(chunk)])
    cores = sorted(os.sched_getaffinity(0))
    if a.pin:  # the server inherits core 0 alone (one torch thread); this process, the client, keeps the rest
        os.sched_setaffinity(0, cores[:1])
    try:
        rs = servers.start(spec, progress=lambda s: print(s, file=sys.stderr))
    finally:
        os.sched_setaffinity(0, cores[1:] if a.pin and len(cores) > 1 else cores)
    with rs:
        cfg = LoadConfig(url=rs.url, profile=f"concurrent:{a.concurrency}", workload=None, input_len=a.input_len,
                         output_len=a.output_len, prompt_kind="random", requests=a.requests, warmup=1,
                         max_seconds=900,
                         tokenizer=a.model if a.model in ("default", "default-draft") else "default-draft")
        (rec,) = run(cfg)
    os.sched_setaffinity(0, cores)
    m = rec.metrics["load"]
    assert m["completed"] == a.requests and m["lengths_forced"] == "forced", m
    return {"chunk": chunk, "tok_s": m["server_output_tok_s"], "gap_p50": m["gap_s_p50"], "gap_p99": m["gap_s_p99"],
            "ttft_p50": m["ttft_s_p50"], "ttft_p99": m["ttft_s_p99"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", default="256,128,64,32")
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--pin", action="store_true",
                    help="the server alone on the first core, the client on the others (no oversubscription)")
    a = ap.parse_args()
    rows = [point(int(c), a) for c in a.chunks.split(",")]
    print(f"\n{a.model} at {a.precision}, concurrency {a.concurrency}, {a.requests} fresh random prompts of "
          f"{a.input_len} tokens, {a.output_len} forced output tokens; the server's output tok/s"
          + ("; the server alone on one core, the client on the rest" if a.pin else "") + "\n")
    print("| prefill chunk | output tok/s | ITL p50 ms | ITL p99 ms | p99 / p50 | TTFT p50 s | TTFT p99 s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['chunk']} | {r['tok_s']:.1f} | {r['gap_p50'] * 1000:.0f} | {r['gap_p99'] * 1000:.0f} | "
              f"{r['gap_p99'] / r['gap_p50']:.1f} | {r['ttft_p50']:.2f} | {r['ttft_p99']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
