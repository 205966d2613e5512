"""Machine facts for every record: CPU model and SIMD level, cores, memory, GPU, library versions."""
from __future__ import annotations

import functools
import os
import platform
import subprocess

import torch

from engine.common.cpu import cpu_model  # noqa: F401 - machine.cpu_model, where records and probes read it
from engine.common.paths import REPO_ROOT


def simd_level() -> str:
    """Best x86 SIMD level this CPU reports (from /proc/cpuinfo flags), or the machine name."""
    try:
        flags = set()
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return platform.machine()
    if {"avx512f", "avx512bw"} <= flags:
        return "avx512" + ("+vnni" if "avx512_vnni" in flags else "")
    if {"avx2", "fma"} <= flags:
        return "avx2+fma" + ("+vnni" if "avx_vnni" in flags else "")
    if "avx" in flags:
        return "avx"
    if "sse4_2" in flags:
        return "sse4.2"
    return platform.machine()


def gpu_facts() -> dict:
    if not torch.cuda.is_available():
        return {}
    p = torch.cuda.get_device_properties(0)
    out = {"gpu_name": p.name, "gpu_memory_bytes": p.total_memory,
           "gpu_capability": f"{p.major}.{p.minor}", "cuda_runtime": torch.version.cuda}
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out["gpu_driver"] = pynvml.nvmlSystemGetDriverVersion()
        out["gpu_memory_used_bytes"] = pynvml.nvmlDeviceGetMemoryInfo(h).used
    except Exception as e:  # pynvml missing or no driver access: the rest still stands
        out["pynvml"] = f"unavailable: {type(e).__name__}"
    return out


def machine_facts(device: str = "cpu") -> dict:
    import psutil

    return {
        "device": torch.device(device).type,
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "simd": simd_level(),
        "memory_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        **gpu_facts(),
    }


@functools.lru_cache(maxsize=1)
def lab_commit() -> str | None:
    """The lab's git commit (12 hex digits, '+changes' when tracked files differ from it); None outside a checkout.
    Records carry it so a drift canary can say the code changed between two runs."""
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode:
            return None
        return head.stdout.strip() + ("+changes" if git("diff", "--quiet", "HEAD").returncode else "")
    except (OSError, subprocess.SubprocessError):
        return None


def library_versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "lab": lab_commit()}
    for pkg in ("torch", "transformers", "bitsandbytes", "streamlit", "gguf"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def nvml_gpus() -> list[dict]:
    """GPUs NVML reports (name, memory, driver), even when torch is a CPU build; [] when none or no driver."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
        pynvml.nvmlInit()
    except Exception:
        return []
    out = []
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append({"index": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                        "memory_GB": round(mem.total / 1e9, 1), "used_GB": round(mem.used / 1e9, 1),
                        "driver": drv.decode() if isinstance(drv, bytes) else str(drv)})
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out


def kernel_info(build: bool = False) -> dict:
    """Which kernel path runs here (engine.ops.backend_info); build=False never compiles just to say so."""
    from engine import ops as kernels

    info = kernels.backend_info(build=build)
    if info.get("cpu") == "torch-fallback" and "not built yet" in str(info.get("cpu_reason")):
        info["cpu"] = "built on the first int8/int4 run"
    return info
