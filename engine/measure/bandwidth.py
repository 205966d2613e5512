"""The memory read-bandwidth probe: the floor a decode step cannot beat on this machine."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from engine.common.paths import cache_dir
from engine.measure.machine import cpu_model, gpu_facts


def _probe_file() -> Path:
    return cache_dir() / "bandwidth.json"


def sum_times(device: str = "cpu", mb: int = 256, reps: int = 10, x=None) -> tuple[int, list[float]]:
    """(bytes, seconds of each of `reps` full sums) over a buffer much larger than any cache (`x`, or a
    new one of `mb` MiB), after one discarded sum (the first read after writing the buffer finds part
    of it still in cache)."""
    dev = torch.device(device)
    if x is None:
        x = torch.ones(mb * (1 << 20) // 4, dtype=torch.float32, device=dev)
    x.sum()
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        x.sum()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return x.numel() * 4, times


def measure_bandwidth(device: str = "cpu", mb: int = 256, reps: int = 10) -> float:
    """Read bandwidth in GB/s: the best of `reps` sums (other processes can only slow a reading down)."""
    nbytes, times = sum_times(device, mb, reps)
    return nbytes / min(times) / 1e9


def bandwidth_gbs(device: str = "cpu", refresh: bool = False) -> float:
    """Measured once per machine and device, then read from the cache.

    refresh=True measures again and keeps the higher of old and new: a busy machine reads low.
    """
    f = _probe_file()
    key = f"{torch.device(device).type}|{cpu_model()}|{os.cpu_count()}|{gpu_facts().get('gpu_name', '')}"
    data = {}
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        pass
    if not refresh and isinstance(data.get(key), (int, float)):
        return float(data[key])
    gbs = max(measure_bandwidth(device), float(data.get(key) or 0.0))
    data[key] = gbs
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(data, indent=1))
    return gbs


IN_RUN = "this process, before and after the run"
CACHED = "cached machine probe (another process)"


def run_bandwidth(before: dict | None, after: dict | None, cached: float | None) -> tuple[float | None, str]:
    """(GB/s, where from) for a run's floor: the higher of its own probes, taken in the measuring process
    around the measured repetitions (a probe reads 34-83 GB/s from one process to the next here, so a
    floor from another process can be off by 2x); the cached machine probe only when neither ran."""
    own = [x for x in ((before or {}).get("probe_gbs"), (after or {}).get("probe_gbs")) if x]
    return (max(own), IN_RUN) if own else (cached, CACHED)
