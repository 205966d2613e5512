"""The noise guard: the machine's state before and after a configuration, and whether to trust its numbers.

Before the measured repetitions and after them, `state()` records a short read-bandwidth probe
(`probe_gbs`: the median of 5 sums over 256 MiB after one discarded sum, about 0.4 s; the median,
because best-of readings here jump to 75 GB/s now and then on a 17 GB/s machine), the 1-minute
load average, and the CPU pressure counter of /proc/pressure/cpu (Linux PSI: `some total=`
is the microseconds during which at least one runnable task waited for a CPU). The counter's
difference over the run's wall time is the share of the run in which something waited for a CPU:
measured here, 0.02 on a quiet machine and 1.00 with two CPU-burning processes beside a 0.5B int4
generation on 2 cores.

The rule (`verdict`), every threshold below a named constant:
- interval: the 95% repetition interval of decode tok/s or of the per-token latency reaches further
  than 10% from its median (stats.relative_half_width > INTERVAL_LIMIT);
- probe: the bandwidth probe dropped by more than 15% from the start of the run to its end (1 - after /
  before > PROBE_DROP_LIMIT): something started streaming memory meanwhile. Within one run, on the same
  buffer, not against an earlier run: a quiet VM here probes either about 50 or about 80 GB/s from one
  minute to the next (measured over 16 runs on 2026-12-01, with CPU pressure at 0.02 throughout and
  the runs' own intervals within ±3%), so a stored best or median would flag quiet runs. Even within
  a run that flip can read as a drop: the record keeps both probes, and the interval rule is the
  one that says whether the numbers themselves moved;
- CPU pressure: a task waited for a CPU during more than 25% of the run (share > PRESSURE_LIMIT);
  where /proc/pressure/cpu is absent, the 1-minute load average after the run above the number of
  cores stands in (a lagging average: it sees only long contention).
Any one makes the run noisy; `reasons` says which, with the numbers.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from engine.common.fields import IV, M, N
from engine.measure.bandwidth import sum_times
from engine.measure.stats import median, relative_half_width

PRESSURE_FILE = Path("/proc/pressure/cpu")
INTERVAL_LIMIT = 0.10
PROBE_DROP_LIMIT = 0.15
PRESSURE_LIMIT = 0.25
PROBE_MB, PROBE_REPS = 256, 5  # about 0.2 s; larger than any last-level cache this lab runs on
JUDGED = ((M.decode_tok_s, "decode tok/s"), (M.token_latency_ms_median, "per-token latency"))


def cpu_pressure_us() -> int | None:
    """/proc/pressure/cpu's `some total=` (microseconds), or None where the kernel has no PSI."""
    try:
        for line in PRESSURE_FILE.read_text().splitlines():
            if line.startswith("some"):
                return int(line.split("total=")[1].split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def probe_gbs(device: str = "cpu", mb: int = PROBE_MB, reps: int = PROBE_REPS, buffer=None) -> float:
    """Read bandwidth in GB/s: the median of `reps` full sums over `mb` MiB (bandwidth.sum_times).
    The median, not the best: the guard asks how fast the machine is now, not at its best moment."""
    nbytes, times = sum_times(device, mb, reps, buffer)
    return nbytes / median(times) / 1e9


# The probe buffer, kept from before() to after(): both probes then read the same pages (a new
# 256 MiB allocation is mapped afresh, and how its pages are mapped moves the reading).
_buffer: dict = {}


def _probe(device: str, keep: bool) -> float | None:
    import torch

    try:
        buf = _buffer.pop(device, None)
        if buf is None:
            buf = torch.ones(PROBE_MB * (1 << 20) // 4, dtype=torch.float32, device=torch.device(device))
        if keep:
            _buffer[device] = buf
        return probe_gbs(device, buffer=buf)
    except Exception:  # noqa: BLE001 — a probe that cannot run (memory) leaves the other checks standing
        return None


def state(device: str = "cpu", probe: bool = True, probe_first: bool = True) -> dict:
    """The machine now: probe GB/s, load average, the PSI counter and a clock.

    Before a run the probe goes first and after it last, so the pressure window holds the run alone.
    """
    out = {"probe_gbs": _probe(device, keep=True) if probe and probe_first else None}
    out.update(loadavg=_loadavg(), cpu_some_us=cpu_pressure_us(), t=time.perf_counter())
    if probe and not probe_first:
        out["probe_gbs"] = _probe(device, keep=False)
    return out


def before(device: str = "cpu", probe: bool = True) -> dict:
    return state(device, probe, probe_first=True)


def after(device: str = "cpu", probe: bool = True) -> dict:
    return state(device, probe, probe_first=False)


def pressure_share(b: dict, a: dict) -> float | None:
    """Share of the wall time between two states in which a task waited for a CPU."""
    if b.get("cpu_some_us") is None or a.get("cpu_some_us") is None:
        return None
    wall = a["t"] - b["t"]
    return None if wall <= 0 else min(1.0, max(0.0, (a["cpu_some_us"] - b["cpu_some_us"]) / 1e6 / wall))


def verdict(b: dict, a: dict, metrics: dict, cores: int | None = None) -> dict:
    """Whether a run is noisy, why, and every number the rule looked at (the record's metrics.noise).

    b, a: state() before and after the run. Pure, so tests feed it states.
    """
    cores = cores or os.cpu_count() or 1
    reasons = []
    ivs = metrics.get(M.intervals) or {}
    widths = {}
    for path, name in JUDGED:
        iv = ivs.get(path) or {}
        w = relative_half_width(metrics.get(path), iv.get(IV.lo), iv.get(IV.hi))
        widths[path] = w
        if w is not None and w > INTERVAL_LIMIT:
            reasons.append(f"{name} interval ±{w:.0%} of the median (limit ±{INTERVAL_LIMIT:.0%})")
    probes = [x for x in (b.get("probe_gbs"), a.get("probe_gbs")) if x]
    drop = (1 - a["probe_gbs"] / b["probe_gbs"]) if len(probes) == 2 else None
    if drop is not None and drop > PROBE_DROP_LIMIT:
        reasons.append(f"bandwidth probe dropped {drop:.0%} during the run, {b['probe_gbs']:.1f} -> "
                       f"{a['probe_gbs']:.1f} GB/s (limit {PROBE_DROP_LIMIT:.0%})")
    share = pressure_share(b, a)
    if share is not None:
        if share > PRESSURE_LIMIT:
            reasons.append(f"CPU pressure: a task waited for a CPU {share:.0%} of the run "
                           f"(limit {PRESSURE_LIMIT:.0%})")
    elif a.get("loadavg") is not None and a["loadavg"] > cores:
        reasons.append(f"load average {a['loadavg']:.2f} above {cores} cores (no /proc/pressure/cpu)")
    interval_checked = any(w is not None for w in widths.values())
    return {
        N.noisy: bool(reasons), N.reasons: reasons, N.interval_checked: interval_checked,
        N.interval_half_width: widths, N.probe_before_gbs: b.get("probe_gbs"), N.probe_after_gbs: a.get("probe_gbs"),
        N.probe_drop: drop, N.cpu_pressure_share: share,
        N.loadavg_before: b.get("loadavg"), N.loadavg_after: a.get("loadavg"), N.cores: cores,
        N.window_s: a["t"] - b["t"] if "t" in a and "t" in b else None,
        N.limits: {"interval": INTERVAL_LIMIT, "probe_drop": PROBE_DROP_LIMIT, "cpu_pressure": PRESSURE_LIMIT},
    }

