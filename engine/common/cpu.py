"""The CPU's model name, as /proc/cpuinfo gives it: one home for the machine record and the kernels' keys."""
from __future__ import annotations

import functools
import platform

__all__ = ["cpu_model"]


@functools.cache
def cpu_model() -> str:
    """/proc/cpuinfo's first "model name" (read once per process), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
