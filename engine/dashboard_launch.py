"""`python -m engine.dashboard_launch` (what `make run` runs): the dashboard beside its backend.

The dashboard measures nothing; the backend (`python -m engine backend`) does. This launcher finds
the backend at SCL_BACKEND_URL (default http://127.0.0.1:8502: GET /v1/info answers), or starts one
on that loopback address when none answers, then runs `streamlit run app.py` in the foreground.
When the dashboard exits (Ctrl-C, a signal, a crash) it stops the backend it started, by its PID,
and leaves alone one it found. A backend on another machine is never started from here: the
dashboard shows its banner with the fix until that backend answers.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from engine.backend.client import Backend, BackendAuthError, BackendUnavailable, BackendVersionMismatch
from engine.backend.contract import is_loopback
from engine.common.paths import REPO_ROOT, data_dir
from engine.common.processes import stop_group

START_TIMEOUT_S = 180.0  # the backend imports torch and checks the kernels before it answers


def find(backend: Backend) -> str | None:
    """None when a backend answers at backend.url (even one that refuses us: the page says why), else why not."""
    try:
        backend.info()
        return None
    except (BackendAuthError, BackendVersionMismatch) as e:
        print(f"note: a backend answers at {backend.url} but cannot be used as it is: {e}", file=sys.stderr)
        return None
    except BackendUnavailable as e:
        return str(e)


def start_backend(backend: Backend, log_path: Path) -> subprocess.Popen:
    """`python -m engine backend` on the URL's loopback host and port, in its own process group; waits until it
    answers."""
    parts = urlsplit(backend.url)
    cmd = [sys.executable, "-m", "engine", "backend", "--host", parts.hostname or "127.0.0.1",
           "--port", str(parts.port or 8502)]
    if os.environ.get("SCL_BACKEND_TOKEN_FILE"):
        cmd += ["--token-file", os.environ["SCL_BACKEND_TOKEN_FILE"]]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + START_TIMEOUT_S
    while True:
        why = find(backend)
        if why is None:
            return proc
        if proc.poll() is not None:
            raise SystemExit(f"the backend exited with code {proc.returncode} before answering; its log: {log_path}\n"
                             + _tail(log_path))
        if time.time() > deadline:
            stop_group(proc)
            raise SystemExit(f"the backend did not answer at {backend.url} within {START_TIMEOUT_S:.0f} s "
                             f"({why}); its log: {log_path}\n" + _tail(log_path))
        time.sleep(0.5)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def streamlit_cmd(host: str, port: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "app.py"), "--server.address", host,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false", *extra]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.dashboard_launch", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="the dashboard's address (loopback unless you mean the LAN)")
    ap.add_argument("--port", type=int, default=8501, help="the dashboard's port")
    ap.add_argument("streamlit_args", nargs="*", help="more `streamlit run` options, after --")
    a = ap.parse_args(argv)

    backend = Backend.from_env()
    started: subprocess.Popen | None = None
    why = find(backend)
    if why is None:
        print(f"Using the backend that answers at {backend.url}.", flush=True)
    elif is_loopback(urlsplit(backend.url).hostname or ""):
        log_path = data_dir() / "backend.log"
        print(f"No backend at {backend.url}: starting `python -m engine backend` (log: {log_path})…", flush=True)
        started = start_backend(backend, log_path)
        print(f"Backend started (PID {started.pid}) at {backend.url}.", flush=True)
    else:
        print(f"WARNING: no backend answers at {backend.url} ({why}). Start it on that machine with "
              "`python -m engine backend --host 0.0.0.0 --token-file F`; the dashboard shows this until it answers.",
              file=sys.stderr, flush=True)

    env = dict(os.environ, SCL_BACKEND_URL=backend.url)
    dash = subprocess.Popen(streamlit_cmd(a.host, a.port, a.streamlit_args), cwd=REPO_ROOT, env=env)

    def on_signal(signum, frame):  # SIGTERM/SIGHUP: stop the dashboard; the finally below stops the backend
        dash.send_signal(signal.SIGTERM)

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    try:
        while True:
            try:
                return dash.wait()
            except KeyboardInterrupt:  # Ctrl-C reached streamlit too (same process group): let it finish
                continue
    finally:
        if dash.poll() is None:
            dash.terminate()
            try:
                dash.wait(15)
            except subprocess.TimeoutExpired:
                dash.kill()
        if started is not None:
            print(f"Stopping the backend this launcher started (PID {started.pid}).", flush=True)
            stop_group(started)


if __name__ == "__main__":
    sys.exit(main())
