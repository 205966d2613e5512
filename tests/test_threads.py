"""engine.common.threads.on_a_passing_thread: its result and errors, and that the OpenMP team of what it ran
leaves the process with the thread (what keeps a server's and the backend's measuring thread at full speed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.common.threads import on_a_passing_thread

ROOT = Path(__file__).resolve().parents[1]

# A fresh process (this one's main thread has run OpenMP work already): the thread count after a parallel torch op
# on a passing thread, then after one on the main thread, each once OpenMP's threads have had time to go.
COUNT = """
import os, sys, time, torch
sys.path.insert(0, sys.argv[1])
from engine.common.threads import on_a_passing_thread
def threads():
    time.sleep(0.5)
    return len(os.listdir("/proc/self/task"))
torch.set_num_threads(2)
before = threads()
on_a_passing_thread(lambda: torch.ones(1 << 22).sum())
passing = threads()
torch.ones(1 << 22).sum()
print(before, passing, threads())
"""


def test_it_returns_the_result_and_raises_the_error_here():
    assert on_a_passing_thread(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(KeyError, match="missing"):
        on_a_passing_thread(lambda: {}["missing"])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc: the thread count cannot be read")
def test_the_openmp_team_goes_with_the_thread_and_stays_with_the_main_thread():
    out = subprocess.run([sys.executable, "-c", COUNT, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, passing, main = map(int, out.stdout.split())
    assert passing == before, (before, passing)  # nothing of the passing thread is left
    assert main == before + 1, (before, main)  # the main thread's team stays: what the helper avoids
