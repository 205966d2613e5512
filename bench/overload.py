"""A server under a 2x overload for 60 s: it keeps answering /health, turns requests away with 429 or queues
them (never a 5xx or a dropped connection), and finishes every request it accepted with the right tokens.

    .venv/bin/python bench/overload.py                              # our engine, 0.5B int4, 8 slots
    .venv/bin/python bench/overload.py --system llama-server        # the same check on a peer
    .venv/bin/python bench/overload.py --url http://127.0.0.1:8000  # a server someone else runs

1. Reference: each of the prompts (ShareGPT chat, data/workloads.json) is sent alone, greedy, with
   max_tokens forced (ignore_eos), and its text kept.
2. Capacity: requests/s at concurrency = slots (closed loop, the same prompts): R.
3. Overload: requests sent at 2R/s (constant rate, open loop) for --seconds, while /health is polled
   every 0.5 s on its own connection. Sending stops at --seconds; every accepted request is then
   awaited (--drain seconds at most).
4. Verdicts: /health answered 200 every time (and its slowest answer); every answer was 200 or 429
   (the others counted by kind); every accepted answer has max_tokens tokens and the reference's text
   (greedy decoding; our int4 kernels are row-independent, so batching changes no token).
Writes <out>/<name>.md and .json; exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.common.errors import UserError  # noqa: E402


def _prompts(spec: str) -> list[str]:
    from engine.measure import workloads

    return [p.text for p in workloads.load(spec)]


async def _one(client, url: str, model: str | None, prompt: str, max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "min_tokens": max_tokens, **({"model": model} if model else {})}
    t = time.perf_counter()
    try:
        r = await client.post(url + "/v1/completions", json=body)
    except Exception as e:  # a dropped connection or a timeout is a failure of the check, counted by kind
        return {"status": None, "error": type(e).__name__, "s": time.perf_counter() - t}
    out = {"status": r.status_code, "s": time.perf_counter() - t}
    if r.status_code == 200:
        d = r.json()
        ch = (d.get("choices") or [{}])[0]
        out.update(text=ch.get("text"), finish=ch.get("finish_reason"),
                   tokens=(d.get("usage") or {}).get("completion_tokens"))
    return out


async def _closed(url, model, prompts, max_tokens, streams, n, timeout):
    import httpx

    async with httpx.AsyncClient(timeout=timeout) as c:
        todo = list(range(n))

        async def worker():
            res = []
            while todo:
                i = todo.pop()
                res.append((i, await _one(c, url, model, prompts[i % len(prompts)], max_tokens)))
            return res

        t = time.perf_counter()
        parts = await asyncio.gather(*[worker() for _ in range(streams)])
        return [x for p in parts for x in p], time.perf_counter() - t


async def _open(url, model, prompts, max_tokens, rate, seconds, drain, timeout):
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as c:
        t0, tasks, i = time.perf_counter(), [], 0
        while time.perf_counter() - t0 < seconds:
            tasks.append((i, asyncio.create_task(_one(c, url, model, prompts[i % len(prompts)], max_tokens))))
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
        sent_s = time.perf_counter() - t0
        done, pending = await asyncio.wait([t for _, t in tasks], timeout=drain)
        for t in pending:
            t.cancel()
        out = [(j, t.result() if t in done else {"status": None, "error": "not finished after the drain"})
               for j, t in tasks]
        return out, sent_s, time.perf_counter() - t0


def _poll_health(url: str, stop: threading.Event, log: list) -> None:
    import httpx

    with httpx.Client(timeout=5.0) as c:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                code = c.get(url + "/health").status_code
            except httpx.HTTPError as e:
                code = type(e).__name__
            log.append((round(time.perf_counter() - t, 4), code))
            stop.wait(0.5)


def check(url: str, model: str | None, prompts: list[str], max_tokens: int, slots: int, seconds: float,
          overload: float, drain: float, say) -> dict:
    say(f"reference: {len(prompts)} prompts alone")
    ref, _ = asyncio.run(_closed(url, model, prompts, max_tokens, 1, len(prompts), 600))
    refs = {i: r.get("text") for i, r in ref}
    if any(r.get("status") != 200 for _, r in ref):
        raise UserError(f"the server did not answer the reference requests: {[r for _, r in ref][:2]}",
                        "check that it serves /v1/completions")
    n_cap = max(2 * slots, len(prompts))
    say(f"capacity: {n_cap} requests at concurrency {slots}")
    cap, cap_s = asyncio.run(_closed(url, model, prompts, max_tokens, slots, n_cap, 600))
    capacity = sum(1 for _, r in cap if r.get("status") == 200) / cap_s
    rate = overload * capacity
    say(f"capacity {capacity:.3f} req/s; overload: {rate:.3f} req/s for {seconds:g} s")
    health: list = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll_health, args=(url, stop, health), daemon=True)
    poller.start()
    try:
        res, sent_s, total_s = asyncio.run(_open(url, model, prompts, max_tokens, rate, seconds, drain, drain))
    finally:
        stop.set()
        poller.join(10)
    statuses: dict[str, int] = {}
    for _, r in res:
        k = str(r.get("status") or r.get("error"))
        statuses[k] = statuses.get(k, 0) + 1
    accepted = [(i, r) for i, r in res if r.get("status") == 200]
    wrong = [i for i, r in accepted if r.get("text") != refs[i % len(prompts)] or r.get("tokens") != max_tokens]
    bad_health = [h for h in health if h[1] != 200]
    other = {k: v for k, v in statuses.items() if k not in ("200", "429")}
    return {
        "capacity_req_s": capacity, "overload_req_s": rate, "sent": len(res), "sent_s": sent_s, "total_s": total_s,
        "statuses": statuses, "accepted": len(accepted), "rejected_429": statuses.get("429", 0),
        "wrong_answers": len(wrong), "health_polls": len(health), "health_failures": len(bad_health),
        "health_max_s": max((h[0] for h in health), default=None),
        "accepted_e2e_max_s": max((r["s"] for _, r in accepted), default=None),
        "checks": {"health answered 200 every poll": not bad_health and bool(health),
                   "only 200 or 429 (no errors, no dropped connections)": not other,
                   "every accepted request finished with the right tokens": not wrong and bool(accepted)},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", default="serving-cost-lab", help="serving-cost-lab, llama-server or vllm")
    ap.add_argument("--url", default=None, help="a running server instead (nothing started)")
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--workload", default="chat:8")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--overload", type=float, default=2.0, help="times the measured capacity")
    ap.add_argument("--drain", type=float, default=900.0, help="seconds to wait for accepted requests after sending")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--name", default="overload")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still stops its server
    say = lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", file=sys.stderr, flush=True)  # noqa: E731
    from engine.peers import servers
    from engine.peers.servers import ServerSpec

    rs = None
    load_before = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    if a.url:
        url, label, model = a.url.rstrip("/"), a.url, None
    else:
        spec = ServerSpec.of(a.system, model=a.model, precision=a.precision, slots=a.slots,
                             max_model_len=a.max_model_len)
        rs = servers.start(spec, progress=say)
        url, label, model = rs.url, spec.label, spec.served_name
    try:
        res = check(url, model, _prompts(a.workload), a.max_tokens, a.slots, a.seconds, a.overload, a.drain, say)
    finally:
        if rs is not None:
            rs.stop()
    load_after = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    command = "python bench/overload.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# {label} under a {a.overload:g}x overload for {a.seconds:g} s", "",
             f"`{command.strip()}`. Load average before: {load_before}; after: {load_after}.", "",
             f"- capacity at concurrency {a.slots}: {res['capacity_req_s']:.3f} req/s; sent {res['sent']} requests at "
             f"{res['overload_req_s']:.3f} req/s over {res['sent_s']:.0f} s; all settled after {res['total_s']:.0f} s",
             f"- answers: {res['statuses']} (429 = turned away while full)",
             f"- /health: {res['health_polls']} polls, {res['health_failures']} not 200, slowest "
             f"{res['health_max_s']:.3f} s",
             f"- accepted: {res['accepted']}, with wrong tokens: {res['wrong_answers']}; slowest accepted "
             f"{res['accepted_e2e_max_s'] or 0:.1f} s", ""]
    lines += [f"- {'PASS' if ok else 'FAIL'}: {what}" for what, ok in res["checks"].items()]
    md = "\n".join(lines) + "\n"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.md").write_text(md)
    (out / f"{a.name}.json").write_text(json.dumps({"command": command, **res,
                                                    "load_average": [load_before, load_after]}, indent=1))
    print(md)
    return 0 if all(res["checks"].values()) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
