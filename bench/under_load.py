"""Our quality-matched int4 against llama-server at its best, under load, through vLLM's client.

    .venv/bin/python bench/under_load.py                       # the 1.5B: ours int4-gguf; llama-server Q4_K_M, Q8_0
    .venv/bin/python bench/under_load.py --ours int4-gguf,int4-g32 --llama Q4_K_M,Q4_K_M-imatrix,BF16
    .venv/bin/python bench/under_load.py --model <AWQ folder> --ours int4-checkpoint-g32 --llama "" \
        --vllm int4-checkpoint     # the same int4 weights in ours and vLLM's CPU build (bench/awq_checkpoint.py)

Each server is started by the lab on 127.0.0.1 (engine/peers/servers.py) with every core and --slots
slots, warmed with one request, then sent --prompts requests by vLLM's `bench serve` (bench/vllm_bench_client.py,
from .venv-vllm) at --concurrency: random token prompts of --input-len, --output-len forced with ignore_eos,
a fresh seed for every server (no prompt is seen twice), prompt caches off. llama-server "at its best" is
its fastest configuration in this run; ours is the first of --ours, the quality-matched int4. Writes
<out>/under_load.{md,json}; the .md states the target and whether this run met it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.peers import servers  # noqa: E402

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
TARGET = 2.5  # the quality-matched int4 >= 2.5x llama-server at its best, concurrency 8 (BENCHMARKS.md)


def vllm_client(url: str, served: str, tokenizer: Path, a, seed: int) -> dict:
    """vLLM's client against one server: its result dict (output_throughput, median_ttft_ms, ...)."""
    import subprocess

    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([str(VLLM_PY), str(ROOT / "bench" / "vllm_bench_client.py"), "--base-url", url,
                            "--backend", "openai", "--endpoint", "/v1/completions", "--model", served,
                            "--dataset-name", "random", "--random-input-len", str(a.input_len),
                            "--random-output-len", str(a.output_len), "--ignore-eos", "--num-prompts", str(a.prompts),
                            "--max-concurrency", str(a.concurrency), "--temperature", "0", "--seed", str(seed),
                            "--tokenizer", str(tokenizer), "--disable-tqdm", "--save-result", "--save-detailed",
                            "--result-dir", d, "--result-filename", "v.json"],
                           capture_output=True, text=True, cwd=ROOT, timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {(p.stdout + p.stderr)[-1500:]}")
        return json.loads((Path(d) / "v.json").read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--ours", default="int4-gguf", help="our engine at these precisions")
    ap.add_argument("--llama", default="Q4_K_M,Q8_0", help="llama-server at these (gguf_tools.LLAMA_PRECISIONS)")
    ap.add_argument("--vllm", default="", help="vLLM's CPU build at these (servers.VLLM_PRECISIONS)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", default=str(ROOT / "docs" / "runs" / time.strftime("%Y-%m-%d")))
    ap.add_argument("--render", metavar="JSON", help="only rewrite the .md of a saved under_load.json")
    a = ap.parse_args(argv)
    if a.render:
        print(markdown(json.loads(Path(a.render).read_text())))
        return 0
    from engine.infer import catalog

    if not VLLM_PY.exists():
        print("vLLM's client is not installed (.venv-vllm): run `make peers-vllm`", file=sys.stderr)
        return 2
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    tokenizer = catalog.resolve(a.model)
    specs = [servers.ServerSpec.of(servers.OURS, model=a.model, precision=p, slots=a.slots, max_model_len=1024,
                                   startup_timeout_s=900) for p in a.ours.split(",") if p.strip()]
    specs += [servers.ServerSpec.of("llama-server", model=a.model, precision=p, slots=a.slots, max_model_len=1024,
                                    startup_timeout_s=900) for p in a.llama.split(",") if p.strip()]
    specs += [servers.ServerSpec.of("vllm", model=a.model, precision=p, slots=a.slots, max_model_len=1024,
                                    startup_timeout_s=1200) for p in a.vllm.split(",") if p.strip()]
    rows, t0 = [], time.time()
    for i, spec in enumerate(specs):
        spec = spec.validate()
        why = servers.unavailable_reason(spec)
        if why:
            rows.append({"system": spec.system, "label": spec.label, "unavailable": why})
            continue
        with servers.start(spec, progress=say) as rs:
            vllm_client(rs.url, spec.served_name, tokenizer, argparse.Namespace(**{**vars(a), "prompts": 1}), 1)
            say(f"[{time.time() - t0:5.0f}s] {spec.label}: {a.prompts} requests at concurrency {a.concurrency}")
            v = vllm_client(rs.url, spec.served_name, tokenizer, a, int(time.time()) + i)
        rows.append({"system": spec.system, "label": spec.label, "precision": spec.setup.precision,
                     "out_tok_s": v["output_throughput"], "ttft_p50_ms": v["median_ttft_ms"],
                     "tpot_p50_ms": v["median_tpot_ms"], "itl_p99_ms": v.get("p99_itl_ms"),
                     "completed": v["completed"], "failed": v["failed"],
                     "errors": sorted({str(e).strip().splitlines()[-1][:300] for e in (v.get("errors") or []) if e})})
        say(f"[{time.time() - t0:5.0f}s] {spec.label}: {v['output_throughput']:.1f} tok/s")
    rep = {"command": "python bench/under_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "rows": rows, "quality_matched": a.ours.split(",")[0].strip(), "target": TARGET, "prompts": a.prompts,
           "concurrency": a.concurrency, "input_len": a.input_len, "output_len": a.output_len,
           "wall_s": time.time() - t0}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "under_load.json").write_text(json.dumps(rep, indent=1))
    md = markdown(rep)
    (out / "under_load.md").write_text(md)
    print(md)
    return 0


def markdown(rep: dict) -> str:
    """The table, each of our rows against the peer at its best (the fastest llama-server, else the fastest peer),
    and the target (the first of --ours, the quality-matched int4, against llama-server) checked."""
    rows = rep["rows"]
    peers = [r for r in rows if r["system"] != servers.OURS and r.get("out_tok_s")]
    llama = max((r for r in peers if r["system"] == "llama-server"), key=lambda r: r["out_tok_s"], default=None) \
        or max(peers, key=lambda r: r["out_tok_s"], default=None)  # no llama-server: the best peer
    md = ["# Under load: vLLM's client", "", f"Command: `{rep['command'].strip()}`", "",
          f"{rep['prompts']} requests at concurrency {rep['concurrency']}, random prompts of {rep['input_len']} "
          f"tokens, {rep['output_len']} output tokens forced (ignore_eos), a fresh seed per server, caches off, "
          f"{rep['wall_s'] / 60:.0f} min.", "",
          "| server | output tok/s | / peer at its best | TTFT p50 ms | TPOT p50 ms | ITL p99 ms | completed "
          "| failed |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    ratio = ours = None
    for r in rows:
        if "unavailable" in r:
            md.append(f"| {r['label']} | unavailable: {r['unavailable']} | | | | | | |")
            continue
        x = r["out_tok_s"] / llama["out_tok_s"] if llama and r["system"] == servers.OURS else None
        if x is not None and ratio is None:  # our first row: the first of --ours
            ratio, ours = x, r
        md.append(f"| {r['label']} | {r['out_tok_s']:.1f} | {f'{x:.2f}x' if x else ''} | {r['ttft_p50_ms']:.0f} | "
                  f"{r['tpot_p50_ms']:.0f} | {(r['itl_p99_ms'] or 0):.0f} | {r['completed']} | {r['failed']} |")
    md += [f"- {r['label']}: {r['failed']} failed: " + "; ".join(r["errors"]) for r in rows if r.get("errors")]
    verdict = (f"target >= {rep['target']}x: {'met' if ratio >= rep['target'] else 'missed'}"
               if llama and llama["system"] == "llama-server" else "the target is against llama-server: not checked")
    md += ["", (f"Ours ({ours['label']}) / the peer at its best ({llama['label']}): **{ratio:.2f}x** ({verdict})."
                if ratio else "No ratio: a side did not run.")]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    sys.exit(main())
