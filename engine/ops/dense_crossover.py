"""The largest M at which the dense C++ kernel is no slower than torch's F.linear, measured on this machine.

Where torch's bf16 GEMM has AMX tiles (oneDNN on Sapphire Rapids and later) it is 1.3x the VDPBF16PS kernel at
8 rows and 5.5x at 64, and slower than the AMX kernel at every M; without AMX (an EPYC) VDPBF16PS led it up to 16
rows (docs/runs/2026-12-05/session27-dense-rows, docs/runs/2026-12-02/bf16_baseline.md, docs/KERNELS.md).
So the row count up to which ``dense_linear`` takes the kernel is measured, not fixed: once per machine (CPU
model), kernel, kind and thread count, kept in ``dense_crossover.json`` beside the built extension (a rebuilt
kernel is measured again), and the same for every process after, so one configuration runs one path.

How: an 8 MB weight ([4096, 1024] in the weight dtype), M in ``ROWS``, both paths timed in turn, the min of
``REPS`` calls each. Torch takes over at the first M where it is faster by more than ``MARGIN``; one row is
the kernel's always (a decode step reads its weights from DRAM once, where the kernel is at the bandwidth
floor: bench/kernel_speed.py).
"""
from __future__ import annotations

import datetime
import json
import os
import threading
import time
from pathlib import Path

import torch

from engine.common.cpu import cpu_model
from engine.ops import build as _build

__all__ = ["ROWS", "MARGIN", "crossover", "measure", "limit_of"]

ROWS = (2, 4, 8, 16, 32, 64)
MARGIN = 0.10   # torch must be this much faster to take the rows (one noisy pass must not flip the path)
REPS = 5
SHAPE = (4096, 1024)
FILE = "dense_crossover.json"
KINDS = {"bf16": (torch.bfloat16, torch.bfloat16), "fp32": (torch.float32, torch.float32),
         "half": (torch.float32, torch.bfloat16)}   # (x dtype, w dtype); "half": fp32 x on a bf16/fp16 weight

_lock = threading.Lock()
_known: dict = {}


def _key(kernel: int, kind: str) -> str:
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "any"
    return f"{kind}-kernel{kernel}-threads{torch.get_num_threads()}-onednn-{onednn}-{cpu_model()}"


def _file() -> Path | None:
    bdir = _build._cpu_state.get("build_dir")
    return Path(bdir) / FILE if bdir else None


def _torch_path(kind: str):
    if kind == "half":  # what dense_linear does past the kernel: the weight widened to fp32
        return lambda x, w: torch.nn.functional.linear(x, w.float())
    return torch.nn.functional.linear


def measure(ext, kernel: int, kind: str) -> dict:
    """{"limit", "rows", "kernel_ms", "torch_ms"}: both paths at each M in ROWS (min of REPS calls), up to the
    first M torch takes."""
    xd, wd = KINDS[kind]
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(SHAPE, generator=gen).to(wd)
    ours, theirs = [], []
    linear = _torch_path(kind)
    with torch.inference_mode():
        for m in ROWS:
            x = torch.randn(m, SHAPE[1], generator=gen).to(xd)
            ext.dense_gemm(x, w, None, kernel)
            linear(x, w)
            best = [float("inf"), float("inf")]
            for _ in range(REPS):
                t0 = time.perf_counter()
                ext.dense_gemm(x, w, None, kernel)
                t1 = time.perf_counter()
                linear(x, w)
                t2 = time.perf_counter()
                best = [min(best[0], t1 - t0), min(best[1], t2 - t1)]
            ours.append(round(best[0] * 1e3, 4))
            theirs.append(round(best[1] * 1e3, 4))
            if limit_of(ROWS, ours, theirs) < m:  # torch has taken these rows: more rows cannot change the limit
                break
    rows = list(ROWS[:len(ours)])
    return {"limit": limit_of(rows, ours, theirs), "rows": rows, "kernel_ms": ours, "torch_ms": theirs}


def limit_of(rows, kernel_ms, torch_ms) -> int:
    """1, or the last of `rows` before the first where torch is faster than the kernel by more than MARGIN."""
    limit = 1
    for m, ours, theirs in zip(rows, kernel_ms, torch_ms):
        if theirs * (1 + MARGIN) < ours:
            break
        limit = m
    return limit


def crossover(ext, kernel: int, kind: str) -> int:
    """The largest M for the kernel on this machine: from dense_crossover.json, else measured and stored."""
    key = _key(kernel, kind)
    with _lock:
        if key in _known:
            return _known[key]
        path = _file()
        stored: dict = {}
        if path is not None and path.exists():
            try:
                stored = json.loads(path.read_text())
            except (OSError, ValueError):
                stored = {}
        entry = stored.get(key)
        if not (isinstance(entry, dict) and isinstance(entry.get("limit"), int)):
            entry = measure(ext, kernel, kind)
            entry["measured"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            if path is not None:
                stored[key] = entry
                tmp = path.with_name(f"{FILE}.{os.getpid()}.tmp")
                try:
                    tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
                    os.replace(tmp, path)
                except OSError:
                    pass
        _known[key] = entry["limit"]
        return entry["limit"]
