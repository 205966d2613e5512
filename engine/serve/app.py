"""The OpenAI-compatible HTTP app (FastAPI): completions and chat completions with SSE streaming,
/v1/models, /health and /metrics (Prometheus text, vLLM's names)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from engine.common.errors import UserError
from engine.infer.batch import Request as EngineRequest
from engine.infer.sampling import SamplingParams
from engine.infer.scheduler import QueueFull
from engine.serve import protocol as P
from engine.serve.loop import EngineDead, EngineLoop
from engine.serve.stats import prometheus_text

log = logging.getLogger("scl.serve")


def create_app(engine: EngineLoop, served_name: str, facts: dict | None = None,
               default_max_tokens: int = 256) -> FastAPI:
    app = FastAPI(title="Serving Cost Lab", docs_url=None, redoc_url=None, openapi_url=None)
    tok = engine.tokenizer
    max_len = engine.settings.max_model_len - engine.scheduler.headroom
    started = int(time.time())
    # Tokenizing and chat templates run here, off the event loop (a long prompt must not stall the streams);
    # one worker, because a fast tokenizer is not safe to call from several threads at once.
    tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="scl-tokenize")
    names = P.TokenNames(tok)  # logprobs' token texts and bytes, cached
    # n choices are n sequences at once: never more than the slots and the waiting queue hold
    max_n = min(P.MAX_N, engine.settings.max_seqs + engine.settings.max_waiting)

    def error(e: P.APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise P.APIError(400, f"the request body is not valid JSON ({str(e)[:80]})", None) from None

    @app.get("/health")
    async def health():
        if not engine.alive:
            return JSONResponse({"status": "error", "error": engine.reason}, status_code=503)
        return {"status": "ok", **engine.gauges()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "created": started,
                                            "owned_by": "serving-cost-lab", "root": served_name,
                                            "parent": None, "max_model_len": max_len,
                                            **({"lab": facts} if facts else {})}]}

    @app.get("/metrics")
    async def metrics():
        g = engine.gauges()
        return PlainTextResponse(prometheus_text(engine.stats, g["running"], g["waiting"], g["slots_used"], g["slots"],
                                                 served_name, kv=g["kv"], spec=g["spec"]),
                                 media_type="text/plain; version=0.0.4")

    async def run(kind: str, request: Request):
        try:
            raw = await body_of(request)
            p = await asyncio.get_running_loop().run_in_executor(
                tokenize_pool, P.parse, kind, raw, served_name, tok, max_len, default_max_tokens, max_n)
        except P.APIError as e:
            return error(e)
        sp = SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed,
                            presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                            repetition_penalty=p.repetition_penalty, logit_bias=p.logit_bias)
        rid = P.new_id(kind)
        handles = []
        try:
            for i in range(p.n):  # each choice is its own sequence; choice i samples with seed + i
                req = EngineRequest(p.prompt_ids, p.max_tokens, sp if not i or p.seed is None else
                                    dataclasses.replace(sp, seed=p.seed + i), stop_at_eos=not p.ignore_eos,
                                    min_tokens=p.min_tokens, stop=p.stop, stop_token_ids=p.stop_token_ids,
                                    logprobs=p.logprobs, prompt_logprobs=p.prompt_logprobs,
                                    prefix_from=handles[0].req if handles else None)
                handles.append(engine.submit(req, label=rid if p.n == 1 else f"{rid}-{i}"))
        except (QueueFull, UserError, EngineDead) as e:
            for h in handles:
                engine.cancel(h)
            if isinstance(e, QueueFull):
                return error(P.APIError(429, f"the server is at capacity ({engine.settings.max_seqs} running, "
                                             f"{engine.settings.max_waiting} waiting); retry after "
                                             f"{e.retry_after_s:.0f} s", None, "server_overloaded",
                                        {"Retry-After": str(max(1, round(e.retry_after_s)))}))
            if isinstance(e, UserError):
                return error(P.APIError(400, str(e), "max_tokens"))
            return error(P.APIError(503, str(e), None, "server_error"))
        choices = [_Choice(kind, p, names, tok) for _ in handles]
        if p.stream:
            return StreamingResponse(_stream(kind, rid, p, handles, choices, engine), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finished = False
        try:
            async with contextlib.aclosing(_events(handles)) as events:  # closing it cancels its pending gets
                async for i, ev, val in events:
                    if await request.is_disconnected():
                        return JSONResponse({}, status_code=499)
                    if ev == "error":  # this request failed (500) or the engine stopped (503)
                        return error(P.APIError(val["status"], val["message"], None, "server_error"))
                    choices[i].take(ev, val)
            finished = True
        finally:
            if not finished:  # a disconnect, a failed choice: the other choices stop too
                for h in handles:
                    engine.cancel(h)
        out = P.full_response(kind, rid, p.model, [c.result() for c in choices], _usage(choices))
        if engine.per_request_spec != "off":
            out["metrics"] = _spec_metrics(engine, choices)
        return out

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await run("completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await run("chat", request)

    return app


class _Choice:
    """One choice as its events arrive: its text pieces, its logprobs, how it finished."""

    def __init__(self, kind: str, p, names, tok):
        self.p, self.info, self.streamed = p, None, 0  # streamed: characters sent so far (streaming)
        self.tokens = 0  # completion tokens so far
        self.parts = [p.echo] if p.echo is not None else []
        self.lp = P.ChoiceLogprobs(kind, names, tok) if p.logprobs is not None else None
        if self.lp is not None and p.echo is not None:
            self.lp.base = len(p.echo)

    def take(self, ev: str, val) -> None:
        if ev == "token":
            self.parts.append(val)
            self.tokens += 1
        elif ev == "text":
            self.parts.append(val)
        elif ev == "logprob":
            self.lp.add(val)
        elif ev == "prompt_logprobs":
            self.lp.prompt(val, self.p.echo, self.p.prompt_ids)
        elif ev == "done":
            self.info = val

    def result(self) -> dict:
        text = "".join(self.parts)
        return {"text": text, "finish": self.info["finish_reason"],
                "logprobs": self.lp.render(len(text)) if self.lp is not None else None}


def _spec_metrics(engine: EngineLoop, choices: list[_Choice]) -> dict:
    pol = engine.scheduler.policy
    return {"speculative_decoding": P.spec_metrics([c.info for c in choices], pol.name if pol else "off",
                                                   pol.gamma_max if pol else 0)}


def _usage(choices: list[_Choice]) -> dict:
    """The prompt counted once, the completion tokens of every choice."""
    return P.usage(choices[0].info["prompt_tokens"], sum(c.info["completion_tokens"] for c in choices))


async def _events(handles):
    """(choice index, event, value) from every handle's queue as they come, until each is done or failed."""
    if len(handles) == 1:  # the common case: no tasks in between
        while True:
            ev, val = await handles[0].queue.get()
            yield 0, ev, val
            if ev in ("done", "error"):
                return
    waiting = {asyncio.ensure_future(h.queue.get()): i for i, h in enumerate(handles)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=waiting.get):
                i = waiting.pop(t)
                ev, val = t.result()
                yield i, ev, val
                if ev not in ("done", "error"):
                    waiting[asyncio.ensure_future(handles[i].queue.get())] = i
    finally:
        for t in waiting:
            t.cancel()


async def _stream(kind: str, rid: str, p, handles, choices: list[_Choice], engine: EngineLoop):
    """SSE events: content chunks (each with the logprobs of the tokens whose text it carries), the finish
    reason, usage when asked, then [DONE]; n choices interleave, each chunk with its index. A client that
    goes away makes Starlette cancel this generator: the finally clause cancels every choice's sequence."""
    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    def text_chunk(i: int, text: str | None, finish: str | None = None) -> str:
        c = choices[i]
        c.streamed += len(text or "")
        out = P.chunk(kind, rid, p.model, text, finish, index=i,
                      logprobs=c.lp.take(c.streamed) if c.lp is not None else None)
        if p.continuous_usage:  # vLLM's continuous_usage_stats: the counts so far in every chunk
            out["usage"] = P.usage(len(p.prompt_ids), sum(ch.tokens for ch in choices))
        return sse(out)

    finished = False
    try:
        for i in range(len(choices)):
            if kind == "chat":
                yield sse(P.chunk(kind, rid, p.model, None, role=True, index=i))
            elif p.echo is not None and p.prompt_logprobs is None:  # echo without logprobs: the text at once
                yield text_chunk(i, p.echo)
        async with contextlib.aclosing(_events(handles)) as events:
            async for i, ev, val in events:
                if ev == "error":  # an OpenAI-style error event, then the stream closes
                    yield sse(P.APIError(val["status"], val["message"], None, "server_error").body())
                    yield "data: [DONE]\n\n"
                    return
                choices[i].take(ev, val)
                if ev == "prompt_logprobs":  # the echoed prompt, with its logprobs
                    yield text_chunk(i, p.echo)
                elif ev in ("token", "text") and val:  # an empty piece (held text) leaves its logprobs
                                                       # for the next chunk
                    yield text_chunk(i, val)
                elif ev == "done":
                    yield text_chunk(i, None if kind == "chat" else "", val["finish_reason"])
        finished = True
        metrics = _spec_metrics(engine, choices) if engine.per_request_spec != "off" else None
        if p.include_usage or metrics:  # vLLM's per-request metrics ride on the last chunk, choices empty
            last = P.chunk(kind, rid, p.model, None, u=_usage(choices))
            if not p.include_usage:
                del last["usage"]
            yield sse({**last, **({"metrics": metrics} if metrics else {})})
        yield "data: [DONE]\n\n"
    finally:
        if not finished:  # a client that went away, a failed choice: every choice stops
            for h in handles:
                engine.cancel(h)
