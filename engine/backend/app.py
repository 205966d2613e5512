"""The backend's HTTP API (FastAPI), all under /v1; docs/BACKEND.md describes it.

Every response carries the API version in a header, and a request that says it speaks another
version is refused (409), so a dashboard and a backend from different checkouts never half-work.
With a token, every request must carry `Authorization: Bearer <token>` (compared in constant time);
a wrong or missing one gets 401 and nothing runs. Without a token (loopback only) the Host header
must name this machine's loopback, so a web page cannot reach the backend through DNS rebinding,
and a POST must be JSON, which a page of another origin cannot send without a CORS preflight.
"""
from __future__ import annotations

import hmac
import json
import os

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from engine.backend import contract
from engine.backend.jobs import JobQueue
from engine.backend.validate import Rejected, submission
from engine.common.errors import UserError

MAX_IDS = 500  # run ids per GET /v1/runs


def _json(body, status: int = 200) -> Response:
    text = json.dumps(body, default=str, allow_nan=False)
    return Response(text, status, media_type="application/json",
                    headers={contract.VERSION_HEADER: str(contract.API_VERSION)})


def _error(status: int, message: str, field: str | None = None, fix: str = "") -> Response:
    return _json(contract.error_body(message, field, fix), status)


def _loopback_host(host_header: str) -> bool:
    host = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    if host_header.startswith("["):  # [::1]:8502
        host = host_header[1:].split("]", 1)[0]
    return contract.is_loopback(host)


def create_app(queue: JobQueue, info, token: str | None = None) -> FastAPI:
    """The API over `queue`; info() -> the dict GET /v1/info answers (machine facts, models, pool)."""
    app = FastAPI(title="Serving Cost Lab backend", docs_url=None, redoc_url=None, openapi_url=None)
    secret = token.encode() if token else None

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if secret is not None:
            given = request.headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if not (scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), secret)):
                return _error(401, "a missing or wrong token" if given else "this backend needs a token",
                              "Authorization", "set SCL_BACKEND_TOKEN_FILE to the token file the backend was "
                              "started with (or SCL_BACKEND_TOKEN to its contents)")
        elif not _loopback_host(request.headers.get("host", "")):
            return _error(403, "this backend has no token, so it answers only requests addressed to loopback",
                          "Host", "connect through 127.0.0.1, or restart it with --token-file F")
        asked = request.headers.get(contract.VERSION_HEADER)
        if asked is not None and asked != str(contract.API_VERSION):
            return _error(409, f"this backend speaks API version {contract.API_VERSION}, the client {asked}",
                          contract.VERSION_HEADER, "restart the backend from the dashboard's checkout "
                          "(python -m engine backend), or update one of the two checkouts")
        if request.method == "POST" and request.headers.get("content-type", "").split(";")[0].strip() \
                != "application/json":
            return _error(415, "a POST body must be JSON", "Content-Type", "send Content-Type: application/json")
        return await call_next(request)

    @app.get("/v1/info")
    def get_info():
        return _json({**info(), "queue": queue.status(), "pid": os.getpid()})

    @app.post("/v1/jobs")
    async def post_job(request: Request):
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            return _error(400, f"the body is not valid JSON ({str(e)[:80]})", None, "send one JSON object")
        try:
            sub = await run_in_threadpool(submission, body)  # every config validated before anything is queued
        except Rejected as e:
            return _error(400, e.problem, e.field, e.fix)
        try:
            job = queue.submit(sub)
        except UserError as e:
            return _error(503, e.problem, None, e.fix)
        return _json({"job_id": job.job_id, "position": queue.position(job)})

    def _job_or_404(job_id: str):
        job = queue.get(job_id)
        if job is None:
            return None, _error(404, f"no job {job_id} on this backend", "job_id",
                                "it may have been submitted to another backend, or before this one's store was "
                                "replaced; list yours with GET /v1/jobs?client=ID")
        return job, None

    @app.get("/v1/jobs")
    def list_jobs(client: str | None = None):
        return _json({"jobs": [queue.view(j) for j in queue.for_client(client)]})

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str):
        job, err = _job_or_404(job_id)
        return err or _json(queue.view(job))

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel_job(job_id: str):
        job, err = _job_or_404(job_id)
        return err or _json(queue.view(queue.cancel(job)))

    @app.get("/v1/jobs/{job_id}/tokens")
    def get_tokens(job_id: str, since: str = "0"):
        job, err = _job_or_404(job_id)
        if err:
            return err
        if not since.isdigit():
            return _error(400, f"since must be a whole number of events, got {since!r}", "since",
                          "send the 'next' of the previous answer (0 at first)")
        n = int(since)
        events = job.events[n:]
        return _json({"events": events, "next": n + len(events),
                      "done": job.stream_done or job.ended, "state": job.state})

    @app.get("/v1/runs")
    def get_runs(ids: str = ""):
        wanted = [i for i in ids.split(",") if i.strip()]
        if not wanted:
            return _error(400, "no run ids given", "ids", "send ids=RUN_ID,RUN_ID (a job's run_ids)")
        if len(wanted) > MAX_IDS:
            return _error(400, f"{len(wanted)} run ids in one request", "ids", f"ask for at most {MAX_IDS} at a time")
        records, missing = [], []
        for rid in wanted:
            try:
                records.append(json.loads(queue.store.get_run(rid.strip()).to_json()))
            except UserError:
                missing.append(rid)
        return _json({"records": records, "missing": missing})

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return _error(404, f"no such endpoint: {request.method} {request.url.path}", "path",
                      "see docs/BACKEND.md for the API")

    return app
