"""The pytest plugin session 36 ran the suite with (PYTHONPATH=<its folder> pytest -p cpuprof ...): per test, the wall
time of setup + call + teardown and the machine's busy cores over it (all processes, from /proc/stat), one JSON
line each in $CPUPROF_OUT (default /tmp/prof/cpu.jsonl). What ran had an unused first draft of the hook above
this one; removed here, nothing else changed."""
import json
import os
import time

import pytest

_F = open(os.environ.get("CPUPROF_OUT", "/tmp/prof/cpu.jsonl"), "a")


def _busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0, (b0, a0) = time.time(), _busy()
    yield
    t1, (b1, a1) = time.time(), _busy()
    _F.write(json.dumps({"id": item.nodeid, "wall": t1 - t0,
                         "busy_cores": (b1 - b0) / max(a1 - a0, 1) * os.cpu_count()}) + "\n")
    _F.flush()
