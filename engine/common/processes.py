"""Stopping a child the lab started in a session of its own (`start_new_session=True`): its whole process group."""
from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to the process group `proc` leads (nothing else), then SIGKILL if it lingers past grace_s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(10)
