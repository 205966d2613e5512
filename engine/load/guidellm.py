"""GuideLLM (the vLLM project's load tool) as a second generator: the same requests, its timings, our records.

`make guidellm` builds .venv-guidellm (guidellm==0.8.1 with the CPU torch). A load point is then
sent by `guidellm run` in that environment, offline, with our tokenizer folder and our requests
written to a JSONL file (`prompt`, `output_tokens_count`); its per-request results are read back
into the same raw samples the lab's own client produces, so metrics.py and the record are the
same. GuideLLM keeps the first and last token times of each request but not every chunk's, so
these samples have no gaps (gap_s_* stay empty) and ITL is (last - first) / (tokens - 1).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import REPO_ROOT
from engine.load.profiles import Limits, Profile
from engine.load.requests import Request, text_of_length

VENV = REPO_ROOT / ".venv-guidellm"
VERSION = "0.8.1"


def binary() -> Path | None:
    p = VENV / "bin" / "guidellm"
    return p if p.exists() else None


def unavailable_reason() -> str | None:
    if binary() is None:
        return f"GuideLLM is not installed (no .venv-guidellm): run `make guidellm` (guidellm=={VERSION}, CPU torch)"
    return None


def worker_processes() -> int:
    """GuideLLM starts a worker process per stream (up to 10), each a whole Python process that streams and
    counts tokens. On a machine as small as the server's own (2 cores here) they take the CPU of the server
    they measure: 4 workers slowed our server's decode by ~30% against the lab's single async client in the
    same run. One worker per core beyond the first, at least one; GUIDELLM__MAX_WORKER_PROCESSES overrides."""
    return int(os.environ.get("GUIDELLM__MAX_WORKER_PROCESSES") or max(1, len(os.sched_getaffinity(0)) - 1))


def profile_arg(p: Profile) -> str:
    if p.kind == "concurrent":
        return f"kind=concurrent,streams={p.streams}"
    if p.kind in ("constant", "poisson"):
        return f"kind={p.kind},rate={p.rate:g}"
    if p.kind in ("synchronous", "throughput"):
        return f"kind={p.kind}"
    raise UserError(f"the GuideLLM generator runs one load point, not a {p.kind}",
                    "run a sweep with the lab's own client (--generator lab)")


def _text_prompt(r: Request, tokenizer) -> str:
    """GuideLLM sends text: a token-id prompt becomes text of exactly as many tokens (requests.text_of_length)."""
    if r.messages is not None:
        return r.messages[-1]["content"]
    return r.prompt if isinstance(r.prompt, str) else text_of_length(r.prompt, tokenizer)


def run_point(base_url: str, model: str | None, reqs: list[Request], profile: Profile, limits: Limits,
              tokenizer, tokenizer_folder: Path) -> list[dict]:
    """Send `reqs` through `guidellm run`; raw samples in the lab's shape (times relative to the first send)."""
    why = unavailable_reason()
    if why:
        raise UserError(why.split(": run")[0], "run `make guidellm`")
    with tempfile.TemporaryDirectory(prefix="scl-guidellm-") as d:
        data, out = Path(d) / "requests.jsonl", Path(d) / "out.json"
        with open(data, "w") as f:
            for r in reqs:
                f.write(json.dumps({"prompt": _text_prompt(r, tokenizer), "output_tokens_count": r.max_tokens}) + "\n")
        # The endpoint the lab's client would use: GuideLLM's default is chat, whose template adds tokens.
        chat = reqs[0].messages is not None if reqs else False
        if any((r.messages is not None) != chat for r in reqs):
            raise UserError("GuideLLM sends every request of a point to one endpoint; these mix chat and completions",
                            "use a workload of one kind, or the lab's own client (--generator lab)")
        target = (f"kind=openai_http,target={base_url},request_format=/v1/{'chat/' if chat else ''}completions"
                  + (f",model={model}" if model else ""))
        cmd = [str(binary()), "run", "--backend", target, "--profile", profile_arg(profile),
               "--constraint", f"kind=max_requests,count={len(reqs)}",
               "--constraint", f"kind=max_duration,seconds={limits.max_seconds:g}",
               "--data", f"kind=json_file,path={data}",
               "--tokenizer", f"kind=huggingface_auto,model={tokenizer_folder}",
               "--output", f"kind=json,path={out}", "--disable-console-interactive"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "GUIDELLM__MAX_WORKER_PROCESSES": str(worker_processes())}
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env,
                           timeout=limits.max_seconds + limits.request_timeout_s + 120)
        if p.returncode != 0 or not out.exists():
            tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-4:])[-600:]
            raise UserError(f"guidellm run failed with status {p.returncode}: {tail}",
                            "check the server and `make guidellm`; or use the lab's own client (--generator lab)")
        report = json.loads(out.read_text())
    return samples_from(report)


def samples_from(report: dict) -> list[dict]:
    """GuideLLM's per-request stats -> the lab's raw samples (its own token counts: the server's usage)."""
    bench = report["benchmarks"][0]
    stats = [(s, True) for s in bench["requests"].get("successful") or []]
    stats += [(s, False) for key in ("errored", "incomplete") for s in bench["requests"].get(key) or []]
    out = []
    for s, ok in stats:
        t = (s.get("info") or {}).get("timings") or {}
        start, end = t.get("request_start"), t.get("request_end")
        first, last = t.get("first_token_iteration"), t.get("last_token_iteration")
        if start is None:
            continue
        n_out = (s.get("output_metrics") or {}).get("text_tokens")
        n_in = (s.get("input_metrics") or {}).get("text_tokens")
        out.append({"id": s.get("request_id"), "max_tokens": _asked(s), "prompt_tokens": n_in, "ok": ok,
                    "status": 200 if ok else None, "error": (s.get("info") or {}).get("error"),
                    "finish_reason": None, "usage": {"prompt_tokens": n_in, "completion_tokens": n_out},
                    "t_send_s": start, "t_end_s": end if end is not None else start, "e2e_s": (end or start) - start,
                    "ttft_s": first - start if first is not None else None,
                    "first_last_s": [first - start, last - start] if ok and first and last else None,
                    "text": s.get("output") or ""})
    t0 = min((x["t_send_s"] for x in out), default=0.0)
    for x in out:
        x["t_send_s"] -= t0
        x["t_end_s"] -= t0
    return sorted(out, key=lambda x: x["t_send_s"])


def _asked(stat: dict) -> int | None:
    """The output length the request asked for (GuideLLM's body: max_completion_tokens or max_tokens)."""
    try:
        body = json.loads(stat.get("request_args") or "{}").get("body") or {}
    except ValueError:
        return None
    return body.get("max_completion_tokens") or body.get("max_tokens")
