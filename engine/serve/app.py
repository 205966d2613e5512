"""The OpenAI-compatible HTTP app (FastAPI): completions and chat completions with SSE streaming,
/v1/models, /health and /metrics (Prometheus text, vLLM's names)."""
from __future__ import annotations

import asyncio
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


def create_app(engine: EngineLoop, served_name: str, facts: dict | None = None, default_max_tokens: int = 256) -> FastAPI:
    app = FastAPI(title="Serving Cost Lab", docs_url=None, redoc_url=None, openapi_url=None)
    tok = engine.tokenizer
    max_len = engine.settings.max_model_len - engine.scheduler.headroom
    started = int(time.time())
    # Tokenizing and chat templates run here, off the event loop (a long prompt must not stall the streams);
    # one worker, because a fast tokenizer is not safe to call from several threads at once.
    tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="scl-tokenize")

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
                                            "owned_by": "serving-cost-lab", "max_model_len": max_len,
                                            **({"lab": facts} if facts else {})}]}

    @app.get("/metrics")
    async def metrics():
        g = engine.gauges()
        return PlainTextResponse(prometheus_text(engine.stats, g["running"], g["waiting"], g["slots_used"], g["slots"],
                                                 served_name), media_type="text/plain; version=0.0.4")

    async def run(kind: str, request: Request):
        try:
            raw = await body_of(request)
            p = await asyncio.get_running_loop().run_in_executor(
                tokenize_pool, P.parse, kind, raw, served_name, tok, max_len, default_max_tokens)
        except P.APIError as e:
            return error(e)
        sp = SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed,
                            presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                            repetition_penalty=p.repetition_penalty, logit_bias=p.logit_bias)
        req = EngineRequest(p.prompt_ids, p.max_tokens, sp, stop_at_eos=not p.ignore_eos, min_tokens=p.min_tokens,
                            stop=p.stop, stop_token_ids=p.stop_token_ids)
        rid = P.new_id(kind)
        try:
            h = engine.submit(req, label=rid)
        except QueueFull as e:
            return error(P.APIError(429, f"the server is at capacity ({engine.settings.max_seqs} running, "
                                         f"{engine.settings.max_waiting} waiting); retry after "
                                         f"{e.retry_after_s:.0f} s", None, "server_overloaded",
                                    {"Retry-After": str(max(1, round(e.retry_after_s)))}))
        except UserError as e:
            return error(P.APIError(400, str(e), "max_tokens"))
        except EngineDead as e:
            return error(P.APIError(503, str(e), None, "server_error"))
        if p.stream:
            return StreamingResponse(_stream(kind, rid, p, h, engine, request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        parts, info = [], None
        try:
            while True:
                if await request.is_disconnected():
                    engine.cancel(h)
                    return JSONResponse({}, status_code=499)
                ev, val = await h.queue.get()
                if ev == "token":
                    parts.append(val)
                elif ev == "done":
                    info = val
                    break
                else:  # this request failed (500) or the engine stopped (503)
                    return error(P.APIError(val["status"], val["message"], None, "server_error"))
        except BaseException:
            engine.cancel(h)
            raise
        return P.full_response(kind, rid, p.model, "".join(parts), info["finish_reason"],
                               P.usage(info["prompt_tokens"], info["completion_tokens"]))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await run("completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await run("chat", request)

    return app


async def _stream(kind: str, rid: str, p, h, engine: EngineLoop, request: Request):
    """SSE events: content chunks, the finish reason, usage when asked, then [DONE]. A client that goes
    away makes Starlette cancel this generator: the finally clause cancels its sequence."""
    def sse(obj) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    finished = False
    try:
        if kind == "chat":
            yield sse(P.chunk(kind, rid, p.model, None, role=True))
        while True:
            ev, val = await h.queue.get()
            if ev == "token":
                if val:
                    yield sse(P.chunk(kind, rid, p.model, val))
            elif ev == "done":
                finished = True
                yield sse(P.chunk(kind, rid, p.model, None if kind == "chat" else "", val["finish_reason"]))
                if p.include_usage:
                    yield sse(P.chunk(kind, rid, p.model, None, u=P.usage(val["prompt_tokens"],
                                                                          val["completion_tokens"])))
                yield "data: [DONE]\n\n"
                return
            else:  # an OpenAI-style error event, then the stream closes
                finished = True
                yield sse(P.APIError(val["status"], val["message"], None, "server_error").body())
                yield "data: [DONE]\n\n"
                return
    finally:
        if not finished:
            engine.cancel(h)
