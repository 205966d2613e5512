"""Shared by the AppTest page tests: tiny models, a real backend, a scratch store, and what a page shows."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 180


@contextlib.contextmanager
def backend_in_thread(store_path: Path, token: str | None = None, host: str = "127.0.0.1", ray: str | None = None):
    """A real backend (engine.backend's app, job queue, pool and store) served by uvicorn on a free port, in a
    thread of this process, so the models tests/tiny.py registered here are served; stopped on the way out.

    Yields url, queue, pool and store: a test holds `pool.lock` to keep a job running (its progress and
    Cancel on the page), as a measurement in progress does.
    """
    import uvicorn

    from engine.backend.app import create_app
    from engine.backend.cli import info_source
    from engine.backend.jobs import JobQueue
    from engine.measure.pool import ModelPool
    from engine.measure.store import Store

    store = Store(store_path)
    pool = ModelPool(keep=8)
    queue = JobQueue(store, pool, ray).start()
    app = create_app(queue, info_source("cpu", pool, ray, store, time.time()), token)
    sock = socket.socket()
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                           access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="scl-test-backend", daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError("the test backend did not start")
        time.sleep(0.05)
    try:
        yield SimpleNamespace(url=f"http://{host}:{port}", queue=queue, pool=pool, store=store, server=server)
    finally:
        queue.stop("the test session ended")
        server.should_exit = True
        thread.join(15)
        sock.close()


@pytest.fixture(autouse=True)
def app_env(tmp_path, tmp_path_factory, monkeypatch, lab_backend):
    """A fresh store per test, one scratch model cache per session (the tiny models are registered by conftest),
    and the session's backend as the one the pages drive (SCL_BACKEND_URL)."""
    monkeypatch.setenv("SCL_PAGE_DIRECT", "1")  # run the page file itself (see _ui.hand_over_to_app)
    monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SCL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "scl-app-cache"))
    monkeypatch.setenv("SCL_BACKEND_URL", lab_backend.url)
    monkeypatch.delenv("SCL_BACKEND_TOKEN", raising=False)
    monkeypatch.delenv("SCL_BACKEND_TOKEN_FILE", raising=False)
    yield tmp_path


def wait_job(at, key: str, timeout_s: float = TIMEOUT):
    """Wait for the page's backend job under `key` to end (importing its runs, as the page's poll does), then
    redraw the page; returns the job."""
    from pages import _ui

    job = at.session_state[key]
    assert job.wait(_ui.get_store(), timeout_s), f"job {job.title} still {job.state} after {timeout_s} s: {job.status}"
    at.run()
    return job


def problems(at) -> list[str]:
    """Exceptions (tracebacks) and error boxes on the page."""
    return [e.value for e in at.exception] + [e.value for e in at.error]


def frame(at, *columns):
    """The first dataframe on the page that has all these columns."""
    for d in at.dataframe:
        if all(c in d.value.columns for c in columns):
            return d.value
    raise AssertionError(f"no table with columns {columns}")


_POOL: list = []


def local_pool():
    """A model pool in the test process, to store runs a page then reads (pages measure nothing themselves)."""
    if not _POOL:
        from engine.measure.pool import ModelPool

        _POOL.append(ModelPool(keep=8))
    return _POOL[0]
