"""The dashboard's side of the backend: a small HTTP client the pages call (docs/BACKEND.md).

It imports httpx, the standard library and engine.common only: a page that drives a backend never
loads torch or the engine's inference code. Records come back as plain dicts (the page reads them
with engine.measure.RunRecord.from_dict, or stores them with Store.import_run).

Every failure a user can meet is a BackendError (a UserError) with its fix, never a traceback:
BackendUnavailable (nothing answers), BackendVersionMismatch (another checkout's backend),
BackendAuthError (401), BackendRejected (a 400, naming the field), BackendJobUnknown (404).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from engine.backend.contract import API_VERSION, DEFAULT_URL, ENDED, VERSION_HEADER, is_loopback
from engine.common.errors import UserError


class BackendError(UserError):
    """Anything that went wrong talking to a backend, with the fix."""


class BackendUnavailable(BackendError):
    """Nothing (or nothing that is a lab backend) answers at the URL."""


class BackendVersionMismatch(BackendError):
    """The backend speaks another API version (it runs another checkout)."""


class BackendAuthError(BackendError):
    """401: the token is missing or wrong."""


class BackendRejected(BackendError):
    """400: the backend refused a request; `field` is the path of the bad value in the body."""

    def __init__(self, problem: str, fix: str = "", field: str | None = None):
        super().__init__(problem + (f" (field {field})" if field else ""), fix)
        self.field = field


class BackendJobUnknown(BackendError):
    """404: the backend does not know this job (another backend's, or its journal was replaced)."""


def _start_fix(url: str) -> str:
    if is_loopback(urlsplit(url).hostname or ""):
        port = urlsplit(url).port
        extra = f" --port {port}" if port and url.rstrip("/") != DEFAULT_URL else ""
        return f"start it: python -m engine backend{extra} (make run starts it beside the dashboard)"
    return ("start it on that machine: python -m engine backend --host 0.0.0.0 --token-file F, or point "
            "SCL_BACKEND_URL at a backend that runs")


class Backend:
    """One backend at `url`. Each method is one short request (timeout_s) and returns plain JSON data."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout_s: float = 5.0):
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BackendError(f"'{url}' is not a backend URL", "give http://HOST:PORT, e.g. " + DEFAULT_URL)
        self.url = url.strip().rstrip("/")
        self.token = token.strip() if token else None
        self.timeout_s = timeout_s
        self._http = httpx.Client(timeout=timeout_s, headers=self._headers())

    @classmethod
    def from_env(cls, timeout_s: float = 5.0) -> "Backend":
        """SCL_BACKEND_URL (default http://127.0.0.1:8502); the token from SCL_BACKEND_TOKEN or the file
        SCL_BACKEND_TOKEN_FILE names."""
        token = os.environ.get("SCL_BACKEND_TOKEN") or None
        path = os.environ.get("SCL_BACKEND_TOKEN_FILE")
        if token is None and path:
            try:
                token = Path(path).expanduser().read_text().strip()
            except OSError as e:
                raise BackendAuthError(f"cannot read SCL_BACKEND_TOKEN_FILE {path} ({e.strerror})",
                                       "point it at the token file the backend was started with") from None
        return cls(os.environ.get("SCL_BACKEND_URL") or DEFAULT_URL, token, timeout_s)

    def _headers(self) -> dict:
        h = {VERSION_HEADER: str(API_VERSION)}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def close(self) -> None:
        self._http.close()

    # ---- the one place a response becomes data or a BackendError
    def _call(self, method: str, path: str, **kw):
        try:
            r = self._http.request(method, self.url + path, **kw)
        except httpx.TimeoutException:
            raise BackendUnavailable(f"the backend at {self.url} did not answer within {self.timeout_s:g} s",
                                     "it may be stuck or gone: check its log, or restart it; "
                                     + _start_fix(self.url)) from None
        except httpx.HTTPError as e:
            raise BackendUnavailable(f"no backend answers at {self.url} ({type(e).__name__})",
                                     _start_fix(self.url)) from None
        theirs = r.headers.get(VERSION_HEADER)
        try:
            body = r.json()
        except ValueError:
            body = None
        err = (body or {}).get("error") if isinstance(body, dict) else None
        if theirs is None or not isinstance(body, dict) or (r.status_code >= 400 and not isinstance(err, dict)):
            if r.status_code == 401:  # a proxy's 401 without our body still means the token
                raise BackendAuthError(f"the backend at {self.url} refused the token (401)", _token_fix())
            raise BackendUnavailable(f"what answers at {self.url} is not a Serving Cost Lab backend "
                                     f"(HTTP {r.status_code})", _start_fix(self.url) + ", or fix SCL_BACKEND_URL")
        if theirs != str(API_VERSION) or r.status_code == 409:
            raise BackendVersionMismatch(f"the backend at {self.url} speaks API version {theirs}, this dashboard "
                                         f"{API_VERSION}", "restart the backend from this checkout (python -m engine "
                                         "backend), or run the same version of the lab on both machines")
        if r.status_code == 401:
            raise BackendAuthError(f"the backend at {self.url} refused the request: {err.get('message')} (401)",
                                   _token_fix())
        if r.status_code == 404:
            raise BackendJobUnknown(f"the backend at {self.url}: {err.get('message')}", err.get("fix") or "")
        if r.status_code >= 400:
            raise BackendRejected(f"the backend at {self.url} refused the request: {err.get('message')}",
                                  err.get("fix") or "", err.get("field"))
        return body

    # ---- the API
    def info(self) -> dict:
        """The backend's machine, models, loaded pool, queue and version (GET /v1/info)."""
        return self._call("GET", "/v1/info")

    def submit(self, title: str, work: dict, client: str | None = None) -> str:
        """Queue a job; its id. The whole submission is checked first (BackendRejected names the field)."""
        return self._call("POST", "/v1/jobs", json={"title": title, "client": client, "work": work})["job_id"]

    def job(self, job_id: str) -> dict:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def jobs(self, client: str | None = None) -> list[dict]:
        return self._call("GET", "/v1/jobs", params={"client": client} if client is not None else None)["jobs"]

    def cancel(self, job_id: str) -> dict:
        """A queued job is dropped; a running one stops before its next run. The job as it stands."""
        return self._call("POST", f"/v1/jobs/{job_id}/cancel", json={})

    def tokens(self, job_id: str, since: int = 0) -> dict:
        """{"events": [{"text", "origin", "accepted", "token_id"}], "next", "done", "state"} from event `since`."""
        return self._call("GET", f"/v1/jobs/{job_id}/tokens", params={"since": int(since)})

    def records(self, run_ids: list[str]) -> list[dict]:
        """The records of these runs, as RunRecord dicts, in the order asked (ids the store lacks are left out)."""
        if not run_ids:
            return []
        got = self._call("GET", "/v1/runs", params={"ids": ",".join(run_ids)})["records"]
        by_id = {r.get("run_id"): r for r in got}
        return [by_id[i] for i in run_ids if i in by_id]

    def wait(self, job_id: str, timeout_s: float = 600.0, poll_s: float = 0.5) -> dict:
        """Poll until the job ends; the job. A backend that stops answering raises BackendUnavailable."""
        deadline = time.monotonic() + timeout_s
        while True:
            j = self.job(job_id)
            if j["state"] in ENDED:
                return j
            if time.monotonic() > deadline:
                raise BackendError(f"job {job_id} did not end within {timeout_s:g} s (it is {j['state']})",
                                   "wait longer, or cancel it")
            time.sleep(poll_s)

    def job_lost(self, job_id: str, last_seen: dict | None, why: BaseException | str | None = None) -> dict:
        """The job as the page should show it once its backend stopped answering: failed, with the reason.

        The runs in `last_seen["run_ids"]` finished before and are in the backend's store; the run in
        progress is lost. A restarted backend does not resume it (its GET says the same).
        """
        j = dict(last_seen or {"job_id": job_id, "done": 0, "total": 0, "run_ids": [], "skipped": []})
        done = len(j.get("run_ids") or [])
        if j.get("state") in ENDED:
            return j
        reason = f" ({why})" if why else ""
        j.update(state="failed", position=None, eta_s=None, finished_at=time.time(),
                 message="lost: the backend stopped",
                 error=f"the backend at {self.url} stopped answering while this job was {j.get('state', 'queued')}"
                       f"{reason}: its {done} finished run(s) are stored in that backend's store; the run in "
                       "progress is lost and is not resumed when the backend restarts")
        return j


def _token_fix() -> str:
    return ("set SCL_BACKEND_TOKEN_FILE to the token file the backend was started with "
            "(or SCL_BACKEND_TOKEN to its contents)")
