"""A second and a third client against the same servers: vLLM's `bench serve` and GuideLLM beside
`python -m engine load`, on our server and on llama-server, at concurrency 1 and 8.

    .venv/bin/python bench/second_client.py                         # the 0.5B: ours int4, llama-server Q4_K_M
    .venv/bin/python bench/second_client.py --servers ours --concurrency 8 --output-len 32

Each server is started by the lab on 127.0.0.1, alone on the first core (llama-server with -t 1; ours
inherits the affinity and runs one torch thread); every client runs on the other core, so a client's own
CPU does not come out of the server's. At each concurrency C the same fixed-length load (random token
prompts of --input-len, --output-len forced with ignore_eos, caches off) is sent by `engine load`, then
vLLM's client, then GuideLLM, then `engine load` again: the lab's figure is the mean of its two runs, which
bracket the others (a drift linear in time cancels). Every point sends fresh prompts. Output tok/s must
agree within 10% and TTFT p50 within 15% of the lab's, or the row says by how much it does not; where the
server exposes vLLM-style histograms (ours) the server's own mean e2e ratio is printed beside the tok/s
ratio, which is the profile behind a gap. Writes <out>/second_client.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.peers import servers  # noqa: E402

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
TOK_S_BOUND, TTFT_BOUND = 0.10, 0.15  # the agreement bounds


def _client_core() -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[1:] or cores)


def lab(url: str, c: int, n: int, a, generator: str = "lab") -> dict:
    p = subprocess.run([sys.executable, "-m", "engine", "load", "--url", url, "--input-len", str(a.input_len),
                        "--output-len", str(a.output_len), "--prompt-kind", "random", "--profile", f"concurrent:{c}",
                        "--requests", str(n), "--generator", generator, "--json", "--no-store"],
                       capture_output=True, text=True, cwd=ROOT, timeout=1800, preexec_fn=_client_core)
    if p.returncode != 0:
        raise RuntimeError(f"engine load ({generator}) failed: {p.stderr[-1500:]}")
    m = json.loads(p.stdout)[0]["metrics"]["load"]
    v = m.get("server_view") or {}
    return {"tok_s": m["server_output_tok_s"], "ttft_p50_ms": 1000 * m["ttft_s_p50"], "failed": m["failed"],
            "completed": m["completed"], "server_e2e_s": v.get("e2e_s_mean"), "client_e2e_s": m["e2e_s_mean"]}


def vllm_client(url: str, served: str, c: int, n: int, a) -> dict:
    from engine.infer import catalog

    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([str(VLLM_PY), str(ROOT / "bench" / "vllm_bench_client.py"), "--base-url", url,
                            "--backend", "openai", "--endpoint", "/v1/completions", "--model", served,
                            "--dataset-name", "random", "--random-input-len", str(a.input_len),
                            "--random-output-len", str(a.output_len), "--ignore-eos", "--num-prompts", str(n),
                            "--max-concurrency", str(c), "--temperature", "0", "--seed", str(int(time.time())),
                            "--tokenizer", str(catalog.resolve("default-draft")), "--disable-tqdm",
                            "--save-result", "--save-detailed", "--result-dir", d, "--result-filename", "v.json"],
                           capture_output=True, text=True, cwd=ROOT, timeout=1800, preexec_fn=_client_core)
        if p.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {(p.stdout + p.stderr)[-1500:]}")
        v = json.loads((Path(d) / "v.json").read_text())
    errors = sorted({str(e).strip().splitlines()[-1][:300] for e in (v.get("errors") or []) if e})  # its last line
    return {"tok_s": v["output_throughput"], "ttft_p50_ms": v["median_ttft_ms"], "failed": v["failed"],
            "completed": v["completed"], "errors": errors}


def _ratio(x, ref):
    return round(x / ref, 3) if x is not None and ref else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="ours,llama-server")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests-per-stream", type=int, default=3, help="requests sent = this x C (at least 4)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "runs" / time.strftime("%Y-%m-%d")))
    a = ap.parse_args(argv)
    from engine.load import guidellm

    systems = {"ours": servers.OURS, "llama-server": "llama-server"}
    cs = [int(x) for x in a.concurrency.split(",")]
    rows, t0 = [], time.time()
    cores = sorted(os.sched_getaffinity(0))
    for name in a.servers.split(","):
        spec = servers.ServerSpec.of(systems[name], model="default-draft", slots=max(cs), max_model_len=512,
                                     threads=1 if name == "llama-server" else None, startup_timeout_s=900).validate()
        os.sched_setaffinity(0, cores[:1])  # the server inherits the first core
        try:
            rs = servers.start(spec, progress=lambda s: print(s, file=sys.stderr, flush=True))
        finally:
            os.sched_setaffinity(0, cores)
        try:
            lab(rs.url, max(cs), max(cs), a)  # warm-up, never measured
            for c in cs:
                n = max(4, a.requests_per_stream * c)
                print(f"[{spec.label}] concurrency {c}, {n} requests", file=sys.stderr, flush=True)
                first = lab(rs.url, c, n, a)
                got = {"vllm bench serve": vllm_client(rs.url, spec.served_name, c, n, a) if VLLM_PY.exists()
                       else None,
                       "GuideLLM": lab(rs.url, c, n, a, "guidellm") if not guidellm.unavailable_reason() else None}
                second = lab(rs.url, c, n, a)
                ref = {k: (first[k] + second[k]) / 2 for k in ("tok_s", "ttft_p50_ms")}
                e2e = [x["server_e2e_s"] for x in (first, second) if x.get("server_e2e_s")]
                rows.append({"server": spec.label, "c": c, "client": "engine load (mean of 2, bracketing)",
                             "tok_s": round(ref["tok_s"], 2), "ttft_p50_ms": round(ref["ttft_p50_ms"], 1),
                             "runs_tok_s": [round(first["tok_s"], 2), round(second["tok_s"], 2)],
                             "failed": first["failed"] + second["failed"]})
                for client, g in got.items():
                    if g is None:
                        rows.append({"server": spec.label, "c": c, "client": client, "missing": True})
                        continue
                    r_tok, r_ttft = _ratio(g["tok_s"], ref["tok_s"]), _ratio(g["ttft_p50_ms"], ref["ttft_p50_ms"])
                    row = {"server": spec.label, "c": c, "client": client, "tok_s": round(g["tok_s"], 2),
                           "ttft_p50_ms": round(g["ttft_p50_ms"], 1), "tok_s_ratio": r_tok, "ttft_ratio": r_ttft,
                           "failed": g["failed"], "errors": g.get("errors") or [],
                           "agrees": abs(r_tok - 1) <= TOK_S_BOUND and abs(r_ttft - 1) <= TTFT_BOUND}
                    if g.get("server_e2e_s") and e2e:  # the server's own slow-down while this client ran
                        row["server_e2e_ratio"] = round(sum(e2e) / len(e2e) / g["server_e2e_s"], 3)
                    rows.append(row)
        finally:
            rs.stop()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "second_client.json").write_text(json.dumps(rows, indent=1))
    cmd = "python bench/second_client.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = ["# A second client agrees", "", f"`{cmd.strip()}` ({(time.time() - t0) / 60:.0f} min; "
          f"random prompts of {a.input_len} tokens, {a.output_len} forced output tokens, fresh prompts every point, "
          "caches off; server on core 0, clients on core 1)", "",
          "| server | C | client | output tok/s | / lab | TTFT p50 ms | / lab | failed | within 10% / 15% | "
          "server's e2e, lab / client |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("missing"):
            md.append(f"| {r['server']} | {r['c']} | {r['client']} | not installed | | | | | | |")
            continue
        ok = "" if "agrees" not in r else ("yes" if r["agrees"] else "**no**")
        md.append(f"| {r['server']} | {r['c']} | {r['client']} | {r['tok_s']} | {r.get('tok_s_ratio', '')} | "
                  f"{r['ttft_p50_ms']} | {r.get('ttft_ratio', '')} | {r['failed']} | {ok} | "
                  f"{r.get('server_e2e_ratio', '')} |")
    errs = [f"- {r['server']}, C={r['c']}, {r['client']}: {e}" for r in rows for e in r.get("errors") or []]
    if errs:
        md += ["", "Failed requests, as the client reported them:", *errs]
    (out / "second_client.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
