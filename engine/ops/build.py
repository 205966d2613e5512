"""Building and loading the C++ and CUDA extensions (kernels/cpu, kernels/cuda): lazy, cached, never fatal.

The first use builds with torch.utils.cpp_extension (about a minute on 2 cores) into
``<cache_dir>/kernels/<kind>-torch<ver>-py<ver>-<hash of the sources and their folder>`` (``SCL_KERNEL_CACHE``
overrides the root, a temp dir is used if it is not writable; ``SCL_KERNEL_VERBOSE=1`` shows the
compiler). A failed build is caught: the engine runs on PyTorch and `backend_info()` says why.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import torch

from engine.common.paths import REPO_ROOT, cache_dir
from engine.ops import config as _config

__all__ = ["load_cpu_extension", "load_cuda_extension", "cpu_extension", "cuda_extension", "cpu_isa"]

log = logging.getLogger(__name__)

CPU_SRC_DIR = REPO_ROOT / "kernels" / "cpu"
CUDA_SRC_DIR = REPO_ROOT / "kernels" / "cuda"
CPU_SOURCES = ["qgemm.cpp", "qgemm_scalar.cpp", "qgemm_avx2.cpp", "qgemm_avx512.cpp",
               "fused_plan.cpp", "fused_cpu.cpp", "fused_scalar.cpp", "fused_avx2.cpp", "fused_avx512.cpp",
               "dense.cpp", "dense_scalar.cpp", "dense_avx2.cpp", "dense_avx512.cpp", "dense_amx.cpp"]
CPU_HEADERS = ["qgemm_kernels.h", "qgemm_simd_body.h", "act_prep_body.h", "q8w_tiles_body.h", "fused_kernels.h",
               "fused_simd_body.h", "fused_plan.h", "fused_q8_x86.h", "fused_bf16.h", "dense_kernels.h",
               "dense_simd_body.h", "dense_bf16_x86.h"]
CUDA_SOURCES = ["qgemm_cuda.cpp", "qgemm_cuda.cu", "fused_verify.cu", "decode_attention.cu", "rmsnorm_residual.cu"]
CUDA_HEADERS = ["qgemm_cuda.h"]

_lock = threading.RLock()
_cpu_state: dict = {"tried": False, "ext": None, "reason": "not built yet"}
_cuda_state: dict = {"tried": False, "ext": None, "reason": "not built yet"}


def _cache_root() -> Path:
    env = os.environ.get("SCL_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    return cache_dir() / "kernels"


def _build_dir(kind: str, files: list[Path]) -> Path:
    """One build dir per source tree and content: torch's ninja file names the sources by path, so two checkouts
    sharing one dir would each rebuild everything (75 s here) whenever the other built last."""
    h = hashlib.sha1()
    h.update(str(files[0].resolve().parent).encode())
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    tag = f"{kind}-torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{h.hexdigest()[:10]}"
    tag = "".join(c if c.isalnum() or c in "-._" else "_" for c in tag)
    return _cache_root() / tag


def _make_build_dir(kind: str, files: list[Path]) -> Path:
    """Build dir under the cache root; a temp dir if the cache root is not writable."""
    bdir = _build_dir(kind, files)
    try:
        bdir.mkdir(parents=True, exist_ok=True)
        if os.access(bdir, os.W_OK):
            return bdir
    except OSError:
        pass
    alt = Path(tempfile.gettempdir()) / "serving-cost-lab-kernels" / bdir.name
    alt.mkdir(parents=True, exist_ok=True)
    return alt


@contextlib.contextmanager
def _build_lock(bdir: Path):
    """Hold an OS lock on the build dir while building, and clear torch's stale baton.

    torch's FileBaton (``<bdir>/lock``) is a plain file: a build killed mid-way (Ctrl-C, a stopped
    test) leaves it behind, and every later build waits on it forever. The OS lock dies with its
    process, so whoever holds it knows any baton left is stale.
    """
    with open(bdir / ".scl-build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            baton = bdir / "lock"
            if baton.exists():
                log.warning("removing a stale build lock left by an interrupted build: %s", baton)
                baton.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _short(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    # compiler errors: keep the first lines that mention "error"
    errs = [ln for ln in lines if "error" in ln.lower()]
    keep = (errs or lines)[:3]
    return " | ".join(keep)[:400]


def load_cpu_extension(raise_errors: bool = False):
    """Build (first time) and import the CPU extension; None if impossible."""
    with _lock:
        if _cpu_state["tried"]:
            if _cpu_state["ext"] is None and raise_errors:
                raise RuntimeError(f"CPU kernel extension unavailable: {_cpu_state['reason']}")
            return _cpu_state["ext"]
        _cpu_state["tried"] = True
        try:
            from torch.utils import cpp_extension

            cxx = os.environ.get("CXX", "c++")
            if shutil.which(cxx) is None and shutil.which("g++") is None:
                raise RuntimeError("no C++ compiler found (c++/g++ not on PATH)")
            sources = [CPU_SRC_DIR / s for s in CPU_SOURCES]
            bdir = _make_build_dir("cpu", sources + [CPU_SRC_DIR / h for h in CPU_HEADERS])
            with _build_lock(bdir):
                ext = cpp_extension.load(
                    name="scl_qgemm_cpu",
                    sources=[str(s) for s in sources],
                    extra_cflags=["-O3", "-fopenmp", f"-I{CPU_SRC_DIR}"],
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(bdir),
                    verbose=bool(os.environ.get("SCL_KERNEL_VERBOSE")),
                )
            _cpu_state.update(ext=ext, reason="", build_dir=str(bdir))
        except BaseException as e:  # noqa: BLE001 - never crash the engine
            if isinstance(e, KeyboardInterrupt):
                _cpu_state["tried"] = False
                raise
            _cpu_state.update(ext=None, reason=_short(e))
            log.warning("CPU quantized kernels unavailable, using PyTorch fallback: %s", _cpu_state["reason"])
            if raise_errors:
                raise RuntimeError(f"CPU kernel extension unavailable: {_cpu_state['reason']}") from e
        return _cpu_state["ext"]


def load_cuda_extension(raise_errors: bool = False):
    """Build (first time) and import the CUDA extension; None if impossible."""
    with _lock:
        if _cuda_state["tried"]:
            if _cuda_state["ext"] is None and raise_errors:
                raise RuntimeError(f"CUDA kernel extension unavailable: {_cuda_state['reason']}")
            return _cuda_state["ext"]
        _cuda_state["tried"] = True
        try:
            if torch.version.cuda is None:
                raise RuntimeError("torch built without CUDA")
            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device visible")
            from torch.utils import cpp_extension

            sources = [CUDA_SRC_DIR / s for s in CUDA_SOURCES]
            bdir = _make_build_dir("cuda", sources + [CUDA_SRC_DIR / h for h in CUDA_HEADERS])
            major, minor = torch.cuda.get_device_capability()
            arch = f"{major}{minor}"
            with _build_lock(bdir):
                ext = cpp_extension.load(
                    name="scl_qgemm_cuda",
                    sources=[str(s) for s in sources],
                    extra_cflags=["-O3"],
                    extra_cuda_cflags=["-O3",
                                       f"-gencode=arch=compute_{arch},code=sm_{arch}"],
                    extra_include_paths=[str(CUDA_SRC_DIR)],
                    build_directory=str(bdir),
                    verbose=bool(os.environ.get("SCL_KERNEL_VERBOSE")),
                )
            _cuda_state.update(ext=ext, reason="", build_dir=str(bdir))
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                _cuda_state["tried"] = False
                raise
            _cuda_state.update(ext=None, reason=_short(e))
            if torch.cuda.is_available():
                log.warning("CUDA quantized kernels unavailable, using PyTorch fallback: %s", _cuda_state["reason"])
            if raise_errors:
                raise RuntimeError(f"CUDA kernel extension unavailable: {_cuda_state['reason']}") from e
        return _cuda_state["ext"]


def cpu_extension(cfg: "_config.KernelConfig | None" = None):
    """The CPU extension if the kernels are enabled and it builds, else None."""
    cfg = cfg or _config.kernel_config()
    if not cfg.enabled:
        return None
    return _cpu_state["ext"] or load_cpu_extension()


def cuda_extension(cfg: "_config.KernelConfig | None" = None):
    """The CUDA extension if the kernels are enabled and it builds, else None."""
    cfg = cfg or _config.kernel_config()
    if not cfg.enabled:
        return None
    return _cuda_state["ext"] or load_cuda_extension()


_isa_resolved: dict = {}  # (extension, cap) -> ISA id; filled once per cap


def cpu_isa(ext, cfg: "_config.KernelConfig") -> int:
    """ISA id to run: the best the CPU supports, capped by cfg.isa (resolved once per cap)."""
    key = (id(ext), cfg.isa)
    hit = _isa_resolved.get(key)
    if hit is not None:
        return hit
    best = int(ext.best_isa())
    isa = best
    if cfg.isa is not None:
        want = _config.ISA_IDS[cfg.isa]
        if ext.isa_supported(want):
            isa = want
        else:
            log.warning("kernel ISA %s not supported on this CPU; using %s", cfg.isa, _config.ISA_NAMES[best])
    _isa_resolved[key] = isa
    return isa
