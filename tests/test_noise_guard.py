"""The noise guard on a real run: flagged beside CPU-burning processes, not flagged on a quiet machine.

Judged by the verdict and its reason (engine/measure/noise.py), never by a timing threshold here.
The quiet half needs a quiet machine: it only counts an attempt when the other processes used
little CPU just before and just after it (psutil, while this test sleeps), and skips, saying so,
when the machine never was quiet (another engineer's build, a test suite beside this one).
"""
import os
import subprocess
import sys
import time

import psutil
import pytest

from engine.measure import noise
from engine.measure.runs import RunConfig, execute

CFG = dict(model="default-draft", precision="int4", max_new_tokens=16, reps=3, device="cpu")
BURN = "while True: pass"
OTHERS_QUIET = 10.0  # % of all CPUs the other processes may use in the second before and after a quiet attempt


def _cpu_seconds_of_others() -> float:
    me = os.getpid()
    total = 0.0
    for p in psutil.process_iter(["pid", "cpu_times"]):
        t = p.info["cpu_times"]
        if p.info["pid"] != me and t is not None:
            total += t.user + t.system
    return total


def _others_busy_pct() -> float:
    """CPU the other processes use over one second while this process sleeps, from their own CPU times: the
    machine-wide figure (psutil.cpu_percent) also counts the hypervisor's steal, which on a shared VM kept it
    above the limit in almost every attempt, so the quiet case almost never ran."""
    before = _cpu_seconds_of_others()
    time.sleep(1.0)
    return 100.0 * (_cpu_seconds_of_others() - before) / (os.cpu_count() or 1)


def test_quiet_machine_is_not_flagged(pool, small_int4):
    """Up to 3 attempts: one that the rest of the machine kept quiet (psutil, before and after) must
    come out quiet. More than one attempt, because a VM's host moves its memory bandwidth on its own
    (seen here: the probe flips between about 50 and 80 GB/s with the guest idle) and a flip during a
    run reads as a drop; the CPU-pressure rule, the one the burners trip, must stay silent every time."""
    seen = []
    for _ in range(3):
        before = _others_busy_pct()
        if before > OTHERS_QUIET:
            seen.append(f"{before:.0f}% of the CPUs used by others before the run")
            time.sleep(5)
            continue
        rec = execute(RunConfig.of(**CFG), pool)
        after = _others_busy_pct()
        n = rec.metrics["noise"]
        if after > OTHERS_QUIET:
            seen.append(f"{after:.0f}% of the CPUs used by others after the run")
            continue
        assert not any(r.startswith("CPU pressure") for r in n["reasons"]), n["reasons"]
        if not n["noisy"]:
            assert n["interval_checked"] and n["reasons"] == []
            return
        seen.append("flagged: " + "; ".join(n["reasons"]))
    if any(s.startswith("flagged") for s in seen) and not any("used by others" in s for s in seen):
        pytest.fail("flagged on a quiet machine in every attempt: " + " | ".join(seen))
    pytest.skip("the machine was never quiet, so the quiet case cannot be checked now: " + "; ".join(seen))


def test_cpu_burners_beside_the_run_are_flagged(pool, small_int4):
    burners = []
    try:
        for _ in range(os.cpu_count() or 1):  # one per core: busy on any machine, as two were on this 2-core one
            burners.append(subprocess.Popen([sys.executable, "-c", BURN]))
        time.sleep(0.5)
        rec = execute(RunConfig.of(**CFG), pool)
    finally:
        for p in burners:
            p.kill()  # by its PID, nothing else
            p.wait(10)
    n = rec.metrics["noise"]
    assert n["noisy"], n
    if noise.cpu_pressure_us() is not None:
        assert any(r.startswith("CPU pressure") for r in n["reasons"]), n["reasons"]
        assert n["cpu_pressure_share"] > noise.PRESSURE_LIMIT
    else:  # no PSI on this kernel: the load average stands in
        assert any(r.startswith("load average") for r in n["reasons"]), n["reasons"]
