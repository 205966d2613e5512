"""The load generator: an asyncio/httpx client of any OpenAI-compatible endpoint, timed on the client.

Each request streams (SSE, `data: {...}` chunks, `data: [DONE]`); the client stamps the send, every
chunk that carries text, and the end with time.perf_counter(), and keeps the raw stamps. Nothing is
tokenized while the load runs (on a small machine the client shares the CPU with the server):
tokens are counted afterwards (run.py). Every loop is bounded: `Limits.requests` requests, no new
request after `Limits.max_seconds`, each request cut at `Limits.request_timeout_s`.

A profile schedules users (`users`): a multi-turn conversation is one user, who sends turn k+1 only after
turn k's answer ended (a closed loop per conversation); a single-turn request is a user of its own. So
concurrent:C keeps C conversations going, and a rate profile starts conversations at its rate.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from engine.common.errors import UserError
from engine.load.profiles import Limits, Profile
from engine.load.requests import Request

# Where a server that rejects the forcing fields says so (OpenAI-style 400 naming the param, or the text).
FORCING_FIELDS = ("ignore_eos", "min_tokens")


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server: its base URL (with or without /v1) and the model name it serves."""

    url: str
    model: str | None = None
    api_key: str | None = None

    @property
    def base(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def check_url(url: str) -> str:
    from urllib.parse import urlparse

    p = urlparse(url or "")
    if p.scheme not in ("http", "https") or not p.hostname:
        raise UserError(f"'{url}' is not an http(s) URL", "pass --url like http://127.0.0.1:8000")
    return url


def _unreachable(url: str, e: Exception) -> UserError:
    return UserError(f"cannot reach {url} ({type(e).__name__}: {str(e)[:120] or 'no answer'})",
                     "start the server first (and check the host and port), or pass the right --url")


# ---------------------------------------------------------------- before the load: what the server offers

def probe(ep: Endpoint, timeout_s: float = 30.0) -> dict:
    """The served model, whether the server accepts ignore_eos/min_tokens, and /metrics; raises if unreachable."""
    import httpx

    with httpx.Client(timeout=timeout_s, headers=ep.headers()) as c:
        try:
            r = c.get(ep.base + "/v1/models")
        except httpx.HTTPError as e:
            raise _unreachable(ep.url, e) from None
        entries = []
        if r.status_code == 200:
            try:
                entries = [m for m in r.json().get("data", []) if isinstance(m, dict)]
            except (ValueError, AttributeError):
                pass
        models = [m.get("id") for m in entries]
        model = ep.model or (models[0] if models else None)
        # vLLM (and our server) say each model's context in /v1/models
        ctx = next((m.get("max_model_len") for m in entries if m.get("id") == model), None)
        body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0, **({"model": model} if model else {})}
        extra = {"ignore_eos": True, "min_tokens": 2}
        for _ in range(len(extra) + 1):
            try:
                r = c.post(ep.base + "/v1/completions", json={**body, **extra})
            except httpx.HTTPError as e:
                raise _unreachable(ep.url, e) from None
            if r.status_code == 200:
                break
            bad = _rejected_field(r, list(extra))
            if r.status_code != 400 or bad is None:
                raise UserError(f"{ep.url} answered a 2-token completion with HTTP {r.status_code}: "
                                f"{_error_text(r)[:200]}", "check that it is an OpenAI-compatible server and "
                                "that --served-model names a model it serves")
            extra.pop(bad)
        forcing = {k: k in extra for k in FORCING_FIELDS}
        facts = {"models": models, "model": model, "accepts": forcing,
                 "max_model_len": ctx if isinstance(ctx, int) else None}
        lab = next((m.get("lab") for m in entries if m.get("id") == model), None)
        if isinstance(lab, dict):  # our server says its setup (precision, draft, kernels, sequences) there
            parts = ("draft", "setup", "settings", "kv", "step_budget", "calibration")
            facts["lab"] = {**_small(lab), **{k: _small(lab[k]) for k in parts if isinstance(lab.get(k), dict)}}
        for path in ("/version", "/props"):  # vLLM's version; llama-server's settings
            try:
                r = c.get(ep.base + path)
                if r.status_code == 200 and r.headers.get("content-type", "").startswith("application/json"):
                    facts[path.strip("/")] = _small(r.json())
            except (httpx.HTTPError, ValueError):
                pass
        try:
            r = c.get(ep.base + "/metrics")
            facts["metrics_endpoint"] = r.status_code == 200 and "# TYPE" in r.text
        except httpx.HTTPError:
            facts["metrics_endpoint"] = False
    return facts


def _small(d) -> dict:
    """The scalar facts of a JSON object (llama-server's /props also returns its chat template and defaults)."""
    if not isinstance(d, dict):
        return {"value": str(d)[:200]}
    out = {k: v for k, v in d.items() if isinstance(v, (str, int, float, bool)) and len(str(v)) <= 200}
    gs = d.get("default_generation_settings")
    if isinstance(gs, dict):
        out["n_ctx"] = gs.get("n_ctx", out.get("n_ctx"))
    return out


def _error_text(r) -> str:
    try:
        e = r.json().get("error")
        return str(e.get("message") if isinstance(e, dict) else e)
    except (ValueError, AttributeError):
        return r.text[:300]


def _rejected_field(r, fields: list[str]) -> str | None:
    try:
        err = r.json().get("error") or {}
    except (ValueError, AttributeError):
        err = {}
    param = err.get("param") if isinstance(err, dict) else None
    if param in fields:
        return param
    text = _error_text(r)
    return next((f for f in fields if f in text), None)


def fetch_metrics(ep: Endpoint, timeout_s: float = 10.0) -> str | None:
    """The server's Prometheus text, or None where it has none."""
    import httpx

    try:
        r = httpx.get(ep.base + "/metrics", timeout=timeout_s, headers=ep.headers())
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


# ---------------------------------------------------------------- one request

@dataclass(frozen=True)
class Sampling:
    """What every request of a load point carries besides its prompt."""

    temperature: float = 0.0
    seed: int | None = 0
    force: dict | None = None  # {"ignore_eos": bool, "min_tokens": bool}: the fields the server accepted


def body_of(req: Request, ep: Endpoint, s: Sampling) -> dict:
    b = {"max_tokens": req.max_tokens, "temperature": s.temperature, "stream": True,
         "stream_options": {"include_usage": True}}
    if ep.model:
        b["model"] = ep.model
    if s.seed is not None:
        b["seed"] = s.seed
    force = s.force or {}
    if force.get("ignore_eos"):
        b["ignore_eos"] = True
    if force.get("min_tokens"):
        b["min_tokens"] = req.max_tokens
    if req.messages is not None:
        b["messages"] = req.messages
    else:
        b["prompt"] = req.prompt
    return b


async def send(client, ep: Endpoint, req: Request, s: Sampling, t0: float) -> dict:
    """Send one request and stream its answer; the sample holds client times relative to t0."""
    import httpx

    path = "/v1/chat/completions" if req.api == "chat" else "/v1/completions"
    sample = {"id": req.id, "max_tokens": req.max_tokens, "prompt_tokens": req.prompt_tokens, "ok": False,
              "status": None, "error": None, "finish_reason": None, "usage": None}
    if req.conversation is not None:
        sample["conversation"], sample["turn"] = req.conversation, req.turn
    if req.category is not None:
        sample["category"] = req.category
    stamps, pieces = [], []
    start = time.perf_counter()
    sample["t_send_s"] = start - t0
    try:
        async with client.stream("POST", ep.base + path, json=body_of(req, ep, s)) as r:
            sample["status"] = r.status_code
            if r.status_code != 200:
                await r.aread()
                sample["error"] = _error_text(r)[:300]
                if r.status_code == 429:
                    sample["retry_after"] = r.headers.get("retry-after")
                return _finish(sample, start, stamps, pieces, t0)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if chunk.get("usage"):
                    sample["usage"] = chunk["usage"]
                if (chunk.get("metrics") or {}).get("speculative_decoding"):  # vLLM's per-request stats, when on
                    sample["spec"] = chunk["metrics"]["speculative_decoding"]
                if "error" in chunk:
                    sample["error"] = str(chunk["error"])[:300]
                    break
                for ch in chunk.get("choices") or []:
                    text = ch.get("text") if req.api == "completions" else (ch.get("delta") or {}).get("content")
                    if text:
                        stamps.append(now)
                        pieces.append(text)
                    if ch.get("finish_reason"):
                        sample["finish_reason"] = ch["finish_reason"]
    except httpx.HTTPError as e:
        sample["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    except asyncio.CancelledError:
        sample["error"] = "cancelled at the load point's time limit"
    sample["ok"] = sample["error"] is None and sample["status"] == 200 and bool(stamps)
    if sample["status"] == 200 and not stamps and sample["error"] is None:
        sample["error"] = "the stream carried no text"
    return _finish(sample, start, stamps, pieces, t0)


def _finish(sample: dict, start: float, stamps: list[float], pieces: list[str], t0: float) -> dict:
    end = time.perf_counter()
    sample["e2e_s"] = end - start
    sample["t_end_s"] = end - t0
    sample["ttft_s"] = stamps[0] - start if stamps else None
    sample["chunk_times_s"] = [t - start for t in stamps]
    sample["text"] = "".join(pieces)
    return sample


# ---------------------------------------------------------------- a load point

def users(reqs: list[Request]) -> list[list[Request]]:
    """The requests as users, each sending its own in order: a conversation's turns, or one single-turn request."""
    out: list[list[Request]] = []
    where: dict[str, int] = {}
    for r in reqs:
        if r.conversation is None:
            out.append([r])
            continue
        if r.conversation not in where:
            where[r.conversation] = len(out)
            out.append([])
        out[where[r.conversation]].append(r)
    return out


async def _run(ep: Endpoint, reqs: list[Request], profile: Profile, limits: Limits, s: Sampling) -> tuple:
    import httpx

    measured = users(reqs)
    in_flight = profile.in_flight(len(measured))
    times = profile.send_times(len(measured))
    conns = (in_flight or 64) + 8
    timeout = httpx.Timeout(limits.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, headers=ep.headers(),
                                 limits=httpx.Limits(max_connections=conns, max_keepalive_connections=conns)) as c:
        t0 = time.perf_counter()
        deadline = t0 + limits.max_seconds
        samples: list[dict] = []

        async def user(turns: list[Request]):
            """One user's requests, each sent when the last one's answer ended; none after the deadline."""
            for i, r in enumerate(turns):
                if i and time.perf_counter() >= deadline:
                    return
                samples.append(await send(c, ep, r, s, t0))
                if asyncio.current_task().cancelling():
                    return  # cut at the time limit: its later turns are not sent

        if times is None:
            queue = list(reversed(measured))

            async def stream():
                while queue and time.perf_counter() < deadline:
                    await user(queue.pop())

            tasks = [asyncio.create_task(stream()) for _ in range(min(in_flight, len(measured)))]
        else:
            async def at(t, u):
                await asyncio.sleep(max(0.0, t0 + t - time.perf_counter()))
                await user(u)

            tasks = [asyncio.create_task(at(t, u)) for t, u in zip(times, measured) if t < limits.max_seconds]
        await _wait(tasks, deadline + limits.request_timeout_s)
        return list(samples), t0


async def _wait(tasks, until: float) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, until - time.perf_counter()))
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5)


async def _warm(ep: Endpoint, reqs: list[Request], limits: Limits, s: Sampling) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(limits.request_timeout_s, connect=10.0),
                                 headers=ep.headers()) as c:
        for r in reqs:
            await send(c, ep, r, s, time.perf_counter())


def warm_up(ep: Endpoint, reqs: list[Request], limits: Limits, s: Sampling) -> None:
    """Send the first `limits.warmup` requests once, one at a time, and drop them (before /metrics is read)."""
    if limits.warmup:
        asyncio.run(_warm(ep, reqs[:limits.warmup], limits, s))


def run_point(ep: Endpoint, reqs: list[Request], profile: Profile, limits: Limits, s: Sampling) -> list[dict]:
    """Send `reqs` under `profile`; the raw samples in completion order (times relative to the first send)."""
    if profile.kind == "sweep":
        raise UserError("a sweep is several load points", "run it through engine.load.run_sweep_profile")
    samples, _ = asyncio.run(_run(ep, reqs, profile, limits.validate(), s))
    return sorted(samples, key=lambda x: x["t_send_s"])
