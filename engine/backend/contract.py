"""What the backend and its client agree on: the API version, the default address, the error body.

Torch-free and engine-free (engine.common only): the client imports it, and so do the pages through it.
"""
from __future__ import annotations

import ipaddress

API_VERSION = 1  # bumped when a request or a response changes shape; both sides check it
VERSION_HEADER = "X-SCL-API-Version"  # sent by the client on every request, by the backend on every response
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8502
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"

JOB_STATES = ("queued", "running", "finished", "failed", "cancelled")
ENDED = ("finished", "failed", "cancelled")
QUALITY_TOKENS = (256, 1024, 2048, 8192)  # the eval-token counts a quality score may ask for (the Precision page's)


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    h = (host or "").strip().strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def error_body(message: str, field: str | None = None, fix: str = "") -> dict:
    """The body of every 4xx: {"error": {"message", "field", "fix"}} (field: the request's path to the bad value)."""
    return {"error": {"message": message, "field": field, "fix": fix}}


def lab_version() -> str:
    """This checkout's version: the package's, and the git commit when it is a checkout ('0.1.0+8d90763')."""
    import importlib.metadata
    import subprocess
    from pathlib import Path

    try:
        v = importlib.metadata.version("serving-cost-lab")
    except importlib.metadata.PackageNotFoundError:
        v = "unknown"
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parents[2],
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{v}+{rev}" if rev else v
