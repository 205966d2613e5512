"""Weight-only quantized linear kernels (int8 / int4) and fused speculative verification.

This is the only module the engine calls for quantized matmuls.  It owns

* the canonical quantized formats (``quantize_int8`` / ``quantize_int4`` and their
  dequantizers; ``engine/quant.py`` calls these, so there is one definition),
* load-time conversion to the kernels' packed layouts (``prepare_int8`` / ``prepare_int4``),
* ``int8_linear`` / ``int4_linear``: a C++ SIMD kernel (AVX-512 / AVX2 / scalar,
  chosen at run time) for small M (decode, speculative verification) and
  dequantize-a-block + torch matmul for large M (prefill); the CUDA extension on
  CUDA tensors; a plain-PyTorch fallback everywhere,
* ``fused_verify``: speculative-sampling verification (torch reference; CUDA kernel),
* ``backend_info()`` for the run record.

Canonical formats
-----------------
int8: ``qweight`` int8 [N, K], ``scale`` float32 [N];  w[n, k] = qweight[n, k] * scale[n].

int4: group size gs in {32, 64, 128}, G = ceil(K / gs); ``packed`` uint8 [N, G*gs//2];
byte j of row n holds q[n, 2j] in the low nibble and q[n, 2j+1] in the high nibble,
q in 0..15, q = 0 for padding positions k >= K; ``scales`` / ``mins`` float16 [N, G];
w[n, k] = float(scales[n, k//gs]) * q[n, k] + float(mins[n, k//gs]).

Environment
-----------
``SCL_KERNELS=torch``       force the plain-PyTorch fallback (A/B benchmarks).
``SCL_KERNEL_CACHE=dir``    build directory root (default ~/.cache/serving-cost-lab/kernels).
``SCL_KERNEL_ISA=scalar|avx2|avx512``  cap the CPU ISA (tests / benchmarks).
``SCL_KERNEL_SMALL_M=n``    largest M that uses the small-M CPU kernel (default 32, max 64).
``SCL_KERNEL_PREFILL=dequant``  M above the small-M limit dequantizes weight blocks for torch
                            matmul, as before; the default runs the small-M kernel in chunks.
``SCL_KERNEL_ACT=int8``     opt-in: int4 CPU kernels quantize activations to int8 per block of
                            32 k and use AVX-512 VNNI integer dot products (faster for M > 1,
                            adds activation-quantization error, see docs/KERNELS.md).

The extension is built on first use (about a minute on 2 cores) and cached; if it
cannot be built, everything still works through PyTorch and ``backend_info()``
says why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Optional

import torch

__all__ = [
    "quantize_int8", "dequantize_int8", "quantize_int4", "dequantize_int4",
    "PreparedInt8", "PreparedInt4", "prepare_int8", "prepare_int4",
    "int8_linear", "int4_linear", "fused_verify", "fused_verify_reference",
    "backend_info", "load_cpu_extension", "load_cuda_extension", "unpack_int4", "TILE",
]

log = logging.getLogger(__name__)

from engine.common.paths import REPO_ROOT, cache_dir  # noqa: E402
CPU_SRC_DIR = REPO_ROOT / "kernels" / "cpu"
CUDA_SRC_DIR = REPO_ROOT / "kernels" / "cuda"
CPU_SOURCES = ["qgemm.cpp", "qgemm_scalar.cpp", "qgemm_avx2.cpp", "qgemm_avx512.cpp"]
CPU_HEADERS = ["qgemm_kernels.h", "qgemm_simd_body.h"]
CUDA_SOURCES = ["qgemm_cuda.cpp", "qgemm_cuda.cu", "fused_verify.cu"]
CUDA_HEADERS = ["qgemm_cuda.h"]

TILE = 64              # output rows per packed CPU tile (must match kernels/cpu/qgemm_kernels.h)
KERNEL_MAX_M = 64      # MAX_M in the C++ code
DEFAULT_SMALL_M = 32   # M above this -> the small-M kernel in chunks, or (past the next) dequantize + matmul
PREFILL_CHUNKS_MAX_M = 512
CUDA_SMALL_M = 32      # same on CUDA: above this torch bf16 matmul on dequantized blocks wins
PREFILL_BLOCK_ROWS = 4096
ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512"}
ISA_IDS = {v: k for k, v in ISA_NAMES.items()}


# ---------------------------------------------------------------------------
# Canonical formats: pure-torch reference quantizers / dequantizers
# ---------------------------------------------------------------------------

def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8: returns (qweight int8 [N,K], scale fp32 [N])."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    w32 = w.detach().to(torch.float32)
    amax = w32.abs().amax(dim=1)
    scale = amax / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero row
    q = torch.round(w32 / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def dequantize_int8(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return qweight.to(torch.float32) * scale.to(torch.float32)[:, None]


def _check_gs(group_size: int) -> None:
    if group_size not in (32, 64, 128):
        raise ValueError(f"group_size must be 32, 64 or 128, got {group_size}")


def quantize_int4(w: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise asymmetric int4 (min/max per group, scale = (max-min)/15).

    Returns (packed uint8 [N, G*gs//2], scales fp16 [N, G], mins fp16 [N, G]).
    q is computed against the fp16-rounded scale/min, so dequantization with the
    stored values is exactly what the quantizer intended.  Padding k >= K: q = 0.
    """
    _check_gs(group_size)
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    N, K = w.shape
    gs = group_size
    G = (K + gs - 1) // gs
    Kp = G * gs
    w32 = w.detach().to(torch.float32)
    wp = torch.zeros(N, Kp, dtype=torch.float32, device=w.device)
    wp[:, :K] = w32
    valid = torch.zeros(N, Kp, dtype=torch.bool, device=w.device)
    valid[:, :K] = True
    wg, vg = wp.view(N, G, gs), valid.view(N, G, gs)
    inf = torch.tensor(float("inf"), device=w.device)
    wmin = torch.where(vg, wg, inf).amin(dim=2)
    wmax = torch.where(vg, wg, -inf).amax(dim=2)
    scale = ((wmax - wmin) / 15.0).to(torch.float16)
    mins = wmin.to(torch.float16)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant group / fp16 underflow
    s32, m32 = scale.float()[:, :, None], mins.float()[:, :, None]
    q = torch.round((wg - m32) / s32).clamp_(0, 15).to(torch.uint8)
    q = torch.where(vg, q, torch.zeros_like(q)).view(N, Kp)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    return packed, scale.contiguous(), mins.contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, Kp/2] -> q uint8 [N, Kp]."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, K: int) -> torch.Tensor:
    N, G = scales.shape
    Kp = packed.shape[1] * 2
    if Kp % G:
        raise ValueError("packed width is not a whole number of groups")
    gs = Kp // G
    q = unpack_int4(packed).to(torch.float32).view(N, G, gs)
    w = q * scales.to(torch.float32)[:, :, None] + mins.to(torch.float32)[:, :, None]
    return w.reshape(N, Kp)[:, :K]


# ---------------------------------------------------------------------------
# Extension building (lazy, cached, never raises unless asked to)
# ---------------------------------------------------------------------------

_lock = threading.RLock()
_cpu_state: dict = {"tried": False, "ext": None, "reason": "not built yet"}
_cuda_state: dict = {"tried": False, "ext": None, "reason": "not built yet"}


def _cache_root() -> Path:
    env = os.environ.get("SCL_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    return cache_dir() / "kernels"


def _build_dir(kind: str, files: list[Path]) -> Path:
    h = hashlib.sha1()
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
    import tempfile

    alt = Path(tempfile.gettempdir()) / "serving-cost-lab-kernels" / bdir.name
    alt.mkdir(parents=True, exist_ok=True)
    return alt


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


# Environment variables are re-read on every call (tests and A/B runs flip them at
# run time), so reading them must be cheap: os.environ.get costs ~1-2 us (key
# encoding), which is a noticeable fraction of a 20 us GEMV.  On POSIX we read the
# underlying bytes dict directly (tens of ns); elsewhere fall back to os.environ.
_ENV_DATA = getattr(os.environ, "_data", None)
if not (isinstance(_ENV_DATA, dict) and os.name == "posix"
        and all(isinstance(k, bytes) for k in list(_ENV_DATA)[:1])):
    _ENV_DATA = None


def _env(name: str) -> str:
    if _ENV_DATA is not None:
        v = _ENV_DATA.get(name.encode())
        return v.decode(errors="replace") if v is not None else ""
    return os.environ.get(name, "")


_OFF_VALUES = ("torch", "fallback", "off", "0", "none")


def _kernels_forced_off() -> bool:
    if _ENV_DATA is not None:
        v = _ENV_DATA.get(b"SCL_KERNELS")
        return v is not None and v.decode(errors="replace").strip().lower() in _OFF_VALUES
    return _env("SCL_KERNELS").strip().lower() in _OFF_VALUES


_isa_cache: dict = {}


def _cpu_isa(ext) -> int:
    """ISA level to run: the best the CPU supports, capped by SCL_KERNEL_ISA."""
    raw = _ENV_DATA.get(b"SCL_KERNEL_ISA") if _ENV_DATA is not None else _env("SCL_KERNEL_ISA")
    hit = _isa_cache.get(raw)
    if hit is not None:
        return hit
    want = (raw.decode(errors="replace") if isinstance(raw, bytes) else (raw or "")).strip().lower()
    best = int(ext.best_isa())
    isa = best
    if want:
        if want not in ISA_IDS:
            log.warning("SCL_KERNEL_ISA=%r not one of %s; using %s", want, list(ISA_IDS), ISA_NAMES[best])
        elif not ext.isa_supported(ISA_IDS[want]):
            log.warning("SCL_KERNEL_ISA=%s not supported on this CPU; using %s", want, ISA_NAMES[best])
        else:
            isa = ISA_IDS[want]
    _isa_cache[raw] = isa
    return isa


def _act_int8() -> bool:
    """SCL_KERNEL_ACT=int8: int4 kernels quantize activations to int8 (per 32-k block)."""
    v = _ENV_DATA.get(b"SCL_KERNEL_ACT") if _ENV_DATA is not None else _env("SCL_KERNEL_ACT")
    if not v:
        return False
    v = v.decode(errors="replace") if isinstance(v, bytes) else v
    return v.strip().lower() in ("int8", "q8", "i8")


def _int4_call(ext, x, prepared, bias, N, K, isa):
    """int4 small-M kernel call: fp32 activations, or int8 activations (VNNI) if asked."""
    gs = prepared.group_size
    if _act_int8():
        if isa == 2 and ext.has_vnni():
            return ext.int4_gemm_q8(x, prepared.w, prepared.sm, bias, N, K, gs, 2)
        if isa == 0:
            return ext.int4_gemm_q8(x, prepared.w, prepared.sm, bias, N, K, gs, 0)
    return ext.int4_gemm(x, prepared.w, prepared.sm, bias, N, K, gs, isa)


def _small_m() -> int:
    v = _ENV_DATA.get(b"SCL_KERNEL_SMALL_M") if _ENV_DATA is not None else _env("SCL_KERNEL_SMALL_M")
    if v:
        try:
            return max(0, min(KERNEL_MAX_M, int(v)))
        except ValueError:
            pass
    return DEFAULT_SMALL_M


def _cpu_ext_if_enabled():
    if _kernels_forced_off():
        return None
    return load_cpu_extension()


# ---------------------------------------------------------------------------
# Prepared (load-time packed) weights
# ---------------------------------------------------------------------------

def _tensors_nbytes(*ts) -> int:
    return int(sum(t.numel() * t.element_size() for t in ts if t is not None))


@dataclasses.dataclass
class PreparedInt8:
    """int8 weight in the layout the kernel for its device wants.

    layout "cpu_tiled": w int8 [NT, K, 64] (tile t, column k, row r), scale fp32 [NT*64]
    layout "canonical": w int8 [N, K], scale fp32 [N]   (torch fallback, CUDA)
    """
    N: int
    K: int
    layout: str
    w: torch.Tensor
    scale: torch.Tensor

    def nbytes(self) -> int:
        return _tensors_nbytes(self.w, self.scale)

    @property
    def device(self) -> torch.device:
        return self.w.device

    def dequantize_rows(self, r0: int, r1: int) -> torch.Tensor:
        """fp32 rows [r0, r1) of the dequantized weight (pure torch)."""
        if self.layout == "cpu_tiled":
            t0, t1 = r0 // TILE, (r1 + TILE - 1) // TILE
            q = self.w[t0:t1].permute(0, 2, 1).reshape(-1, self.K)
            q = q[r0 - t0 * TILE: r1 - t0 * TILE]
        else:
            q = self.w[r0:r1, : self.K]   # CUDA layout pads K to 16
        return q.to(torch.float32) * self.scale[r0:r1, None]

    def dequantize(self) -> torch.Tensor:
        return self.dequantize_rows(0, self.N)

    def canonical(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layout == "cpu_tiled":
            q = self.w.permute(0, 2, 1).reshape(-1, self.K)[: self.N].contiguous()
            return q, self.scale[: self.N].contiguous()
        return self.w[:, : self.K].contiguous(), self.scale


@dataclasses.dataclass
class PreparedInt4:
    """int4 weight in the layout the kernel for its device wants.

    layout "cpu_tiled": w int32 [NT, Kp/8, 64]: dword (t, o, r) holds q[n, 8o..8o+7] of
                        row n = 64t + r, byte i = q[8o+i] | q[8o+4+i] << 4;
                        sm fp16 [NT, G, 2, 64]: (scale, min) per group per row.
    layout "canonical": w = packed uint8 [N, Kp/2], sm fp16 [N, G, 2]   (torch fallback, CUDA)
    """
    N: int
    K: int
    group_size: int
    layout: str
    w: torch.Tensor
    sm: torch.Tensor

    @property
    def G(self) -> int:
        return (self.K + self.group_size - 1) // self.group_size

    @property
    def Kp(self) -> int:
        return self.G * self.group_size

    def nbytes(self) -> int:
        return _tensors_nbytes(self.w, self.sm)

    @property
    def device(self) -> torch.device:
        return self.w.device

    def _canonical_rows(self, r0: int, r1: int):
        if self.layout == "cpu_tiled":
            t0, t1 = r0 // TILE, (r1 + TILE - 1) // TILE
            a, b = r0 - t0 * TILE, r1 - t0 * TILE
            dw = self.w[t0:t1].permute(0, 2, 1).reshape(-1, self.Kp // 8)[a:b]
            packed = _octets_to_canonical(dw)
            sm = self.sm[t0:t1].permute(0, 3, 1, 2).reshape(-1, self.G, 2)[a:b]
        else:
            packed, sm = self.w[r0:r1], self.sm[r0:r1]
        return packed, sm[..., 0], sm[..., 1]

    def dequantize_rows(self, r0: int, r1: int) -> torch.Tensor:
        packed, s, m = self._canonical_rows(r0, r1)
        return dequantize_int4(packed, s, m, self.K)

    def dequantize(self) -> torch.Tensor:
        return self.dequantize_rows(0, self.N)

    def canonical(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed, s, m = self._canonical_rows(0, self.N)
        return packed.contiguous(), s.contiguous(), m.contiguous()


def _canonical_to_octets(packed: torch.Tensor) -> torch.Tensor:
    """canonical uint8 [R, Kp/2] -> int32 [R, Kp/8] octet dwords of the CPU layout:
    byte i of dword o = q[8o+i] | q[8o+4+i] << 4 (see kernels/cpu/qgemm_kernels.h)."""
    R = packed.shape[0]
    q = unpack_int4(packed).view(R, -1, 8)
    b = q[..., :4] | (q[..., 4:] << 4)
    return b.contiguous().view(torch.int32).view(R, -1)


def _octets_to_canonical(dw: torch.Tensor) -> torch.Tensor:
    """Inverse of _canonical_to_octets: int32 [R, Kp/8] -> canonical uint8 [R, Kp/2]."""
    R = dw.shape[0]
    b = dw.contiguous().view(torch.uint8).view(R, -1, 4)
    q = torch.cat([b & 0x0F, b >> 4], dim=-1).view(R, -1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def _use_cpu_tiled(device: torch.device) -> bool:
    return device.type == "cpu" and _cpu_ext_if_enabled() is not None


def prepare_int8(qweight: torch.Tensor, scale: torch.Tensor) -> PreparedInt8:
    """Canonical int8 -> kernel layout (done once at load time)."""
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise ValueError("qweight must be int8 [N, K]")
    N, K = qweight.shape
    if scale.numel() != N:
        raise ValueError(f"scale has {scale.numel()} elements, expected N={N}")
    scale = scale.reshape(N).to(torch.float32)
    if qweight.device.type == "cpu" and _use_cpu_tiled(qweight.device):
        NT = (N + TILE - 1) // TILE
        wp = torch.zeros(NT * TILE, K, dtype=torch.int8)
        wp[:N] = qweight
        w = wp.view(NT, TILE, K).permute(0, 2, 1).contiguous()
        sp = torch.zeros(NT * TILE, dtype=torch.float32)
        sp[:N] = scale
        return PreparedInt8(N, K, "cpu_tiled", w, sp)
    if qweight.device.type == "cuda":
        # CUDA kernel: row-major, K padded to 16 bytes so every row is 16-byte aligned.
        Kpad = (K + 15) // 16 * 16
        if Kpad != K:
            wp = torch.zeros(N, Kpad, dtype=torch.int8, device=qweight.device)
            wp[:, :K] = qweight
            qweight = wp
        return PreparedInt8(N, K, "canonical", qweight.contiguous(), scale.contiguous())
    return PreparedInt8(N, K, "canonical", qweight.contiguous(), scale.contiguous())


def prepare_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, K: int,
                 group_size: int) -> PreparedInt4:
    """Canonical int4 -> kernel layout (done once at load time)."""
    _check_gs(group_size)
    gs = group_size
    G = (K + gs - 1) // gs
    Kp = G * gs
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != Kp // 2:
        raise ValueError(f"packed must be uint8 [N, {Kp // 2}] for K={K}, gs={gs}; got "
                         f"{packed.dtype} {tuple(packed.shape)}")
    N = packed.shape[0]
    if tuple(scales.shape) != (N, G) or tuple(mins.shape) != (N, G):
        raise ValueError(f"scales/mins must be [N, G] = [{N}, {G}]")
    sm = torch.stack([scales.to(torch.float16), mins.to(torch.float16)], dim=-1)  # [N, G, 2]
    if packed.device.type == "cpu" and _use_cpu_tiled(packed.device):
        NT = (N + TILE - 1) // TILE
        pp = torch.zeros(NT * TILE, Kp // 2, dtype=torch.uint8)
        pp[:N] = packed
        w = _canonical_to_octets(pp).view(NT, TILE, Kp // 8).permute(0, 2, 1).contiguous()
        smp = torch.zeros(NT * TILE, G, 2, dtype=torch.float16)
        smp[:N] = sm
        smt = smp.view(NT, TILE, G, 2).permute(0, 2, 3, 1).contiguous()
        return PreparedInt4(N, K, gs, "cpu_tiled", w, smt)
    return PreparedInt4(N, K, gs, "canonical", packed.contiguous(), sm.contiguous())


# ---------------------------------------------------------------------------
# Linear layers
# ---------------------------------------------------------------------------

def _torch_linear(x2: torch.Tensor, prepared, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Fallback / prefill: dequantize blocks of rows and call torch matmul."""
    N = prepared.N
    M = x2.shape[0]
    dt = x2.dtype
    y = torch.empty(M, N, dtype=dt, device=x2.device)
    step = PREFILL_BLOCK_ROWS
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        wb = prepared.dequantize_rows(r0, r1).to(dt)
        if bias is not None:
            y[:, r0:r1] = torch.addmm(bias[r0:r1].to(dt), x2, wb.t())
        else:
            y[:, r0:r1] = x2 @ wb.t()
    return y


def _cpu_prefill(x2: torch.Tensor, prepared, bias: Optional[torch.Tensor], ext) -> torch.Tensor:
    """Large M on CPU: C++ tile dequantization into fp32 blocks + torch (MKL) matmul."""
    N = prepared.N
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=torch.float32)
    NT = prepared.w.shape[0]
    tb = max(1, PREFILL_BLOCK_ROWS // TILE)
    for t0 in range(0, NT, tb):
        t1 = min(NT, t0 + tb)
        if isinstance(prepared, PreparedInt8):
            wb = ext.int8_dequant(prepared.w, prepared.scale, N, t0, t1)
        else:
            wb = ext.int4_dequant(prepared.w, prepared.sm, N, prepared.K, prepared.group_size, t0, t1)
        r0, r1 = t0 * TILE, min(N, t1 * TILE)
        if bias is not None:
            y[:, r0:r1] = torch.addmm(bias[r0:r1], x2, wb.t())
        else:
            y[:, r0:r1] = x2 @ wb.t()
    return y


def _prefill_mode() -> str:
    """SCL_KERNEL_PREFILL=dequant: large M dequantizes weight blocks for torch matmul (the old path)."""
    return "dequant" if _env("SCL_KERNEL_PREFILL") == "dequant" else "chunks"


def _linear(x: torch.Tensor, prepared, bias: Optional[torch.Tensor], is4: bool) -> torch.Tensor:
    K, N = prepared.K, prepared.N
    if x.shape[-1] != K:
        raise ValueError(f"x has last dim {x.shape[-1]}, weight has K={K}")
    # ---- hot path: CPU decode step, fp32 [M, K] contiguous, packed layout
    if (prepared.layout == "cpu_tiled" and not x.is_cuda and x.dtype == torch.float32
            and x.is_contiguous() and (bias is None or bias.dtype == torch.float32)):
        M = x.numel() // K if K else 0
        if 0 < M <= _small_m() and not _kernels_forced_off():
            ext = _cpu_state["ext"] or load_cpu_extension()
            if ext is not None:
                isa = _cpu_isa(ext)
                b = None if bias is None else bias.contiguous()
                if is4:
                    return _int4_call(ext, x, prepared, b, N, K, isa)
                return ext.int8_gemm(x, prepared.w, prepared.scale, b, N, isa)

    # ---- general path
    out_dtype = x.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if x.device != prepared.device:
        raise ValueError(f"x is on {x.device} but the weight was prepared on {prepared.device}")
    if M == 0:
        return torch.empty(*lead, N, dtype=out_dtype, device=x.device)

    if x.device.type == "cuda":
        ext = None if _kernels_forced_off() else load_cuda_extension()
        if ext is not None and M <= CUDA_SMALL_M and prepared.layout == "canonical":
            xc = x2 if x2.dtype in (torch.float32, torch.float16, torch.bfloat16) else x2.float()
            xc = xc.contiguous()
            b = None if bias is None else bias.to(xc.dtype).contiguous()
            stream = torch.cuda.current_stream(x.device).cuda_stream
            if is4:
                y = ext.int4_gemm(xc, prepared.w, prepared.sm, b, prepared.K, prepared.group_size, stream)
            else:
                y = ext.int8_gemm(xc, prepared.w, prepared.scale, b, prepared.K, stream)
            return y.to(out_dtype).reshape(*lead, N)
        xc = x2 if x2.dtype in (torch.float16, torch.bfloat16, torch.float32) else x2.float()
        y = _torch_linear(xc, prepared, bias)
        return y.to(out_dtype).reshape(*lead, N)

    x32 = x2.to(torch.float32).contiguous()
    b32 = None if bias is None else bias.to(torch.float32).contiguous()
    ext = _cpu_ext_if_enabled() if prepared.layout == "cpu_tiled" else None
    if ext is not None:
        isa = _cpu_isa(ext)
        sm = _small_m()

        def small(xs):
            if is4:
                return _int4_call(ext, xs, prepared, b32, N, K, isa)
            return ext.int8_gemm(xs, prepared.w, prepared.scale, b32, N, isa)

        if M <= sm:
            y = small(x32)
        elif _prefill_mode() == "dequant" or M > PREFILL_CHUNKS_MAX_M:
            y = _cpu_prefill(x32, prepared, b32, ext)
        else:
            # Prefill in chunks of small-M rows: dequantizing the whole weight to fp32 costs 3x
            # more for a 57-token prompt; the two meet near 512 rows (bench: 8960x1536, 2 cores).
            y = torch.cat([small(x32[i:i + sm].contiguous()) for i in range(0, M, sm)])
    else:
        y = _torch_linear(x32, prepared, b32)
    return y.to(out_dtype).reshape(*lead, N)


def int8_linear(x: torch.Tensor, prepared: PreparedInt8, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x @ dequant(W)^T + bias for x [..., K] (fp32; bf16/fp16 are cast). Returns x.dtype."""
    return _linear(x, prepared, bias, is4=False)


def int4_linear(x: torch.Tensor, prepared: PreparedInt4, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x @ dequant(W)^T + bias for x [..., K] (fp32; bf16/fp16 are cast). Returns x.dtype."""
    return _linear(x, prepared, bias, is4=True)


# ---------------------------------------------------------------------------
# Speculative-sampling verification
# ---------------------------------------------------------------------------
#
# Shapes (unbatched):  target_probs [gamma+1, V], draft_probs [gamma, V],
#                      draft_tokens [gamma] int64, uniforms [gamma+1].
# Batched: a leading batch dim on all four.
# uniforms[i] (i < gamma) is the acceptance test of draft token i; uniforms[gamma]
# is the single extra draw used either for the residual resample (at the first
# rejection) or for the bonus token (all accepted) -- only one of them happens.
#
# Exact arithmetic (shared by the torch reference and the CUDA kernel):
#   p_i = target_probs[i, t_i], q_i = draft_probs[i, t_i] (read as float, compared in float64)
#   accept i  <=>  u_i * q_i <= p_i          (== u_i <= min(1, p_i/q_i) for q_i > 0;
#                                             q_i == 0 always accepts)
#   n = number of leading accepted tokens.
#   n < gamma:  r = max(0, p_n - q_n) (float64), n == gamma: r = p_gamma (float64)
#   if sum(r) == 0: r = p_n   (degenerate residual; cannot happen for exact distributions)
#   next = smallest j with cumsum(r)[j] > u_gamma * sum(r)  (inverse CDF), or, if rounding
#          leaves none, the last j with r[j] > 0.
# Returns (accepted_len, next_token): python ints when unbatched, int64 tensors [B] when batched.

def _inverse_cdf(r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """r float64 [B, V] non-negative, u float64 [B] -> int64 [B]."""
    cdf = torch.cumsum(r, dim=-1)
    total = cdf[:, -1:]
    target = u[:, None] * total
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    V = r.shape[-1]
    nz = (r > 0).to(torch.int64)
    last_nz = V - 1 - torch.argmax(nz.flip(-1), dim=-1)
    return torch.where(idx >= V, last_nz, idx)


def fused_verify_reference(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                           draft_tokens: torch.Tensor, uniforms: torch.Tensor):
    """Pure-torch implementation (any device) of the semantics above."""
    batched = target_probs.dim() == 3
    if not batched:
        target_probs, draft_probs = target_probs[None], draft_probs[None]
        draft_tokens, uniforms = draft_tokens[None], uniforms[None]
    # same input precision as the CUDA kernel: probs fp32/fp16/bf16, uniforms fp32
    if target_probs.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        target_probs = target_probs.float()
    draft_probs = draft_probs.to(target_probs.dtype)
    uniforms = uniforms.to(torch.float32)
    B, g1, V = target_probs.shape
    gamma = g1 - 1
    if draft_probs.shape != (B, gamma, V) or draft_tokens.shape != (B, gamma) or uniforms.shape != (B, g1):
        raise ValueError("fused_verify: shape mismatch (see docstring for the expected shapes)")
    dev = target_probs.device
    t = draft_tokens.to(torch.int64)
    if gamma > 0:
        p_sel = torch.gather(target_probs[:, :gamma], 2, t[..., None]).squeeze(-1).double()
        q_sel = torch.gather(draft_probs, 2, t[..., None]).squeeze(-1).double()
        acc = uniforms[:, :gamma].double() * q_sel <= p_sel
        # first rejection index (gamma when all accepted)
        rej = (~acc).to(torch.int64)
        n = torch.where(rej.any(dim=1), torch.argmax(rej, dim=1), torch.full((B,), gamma, device=dev))
    else:
        n = torch.zeros(B, dtype=torch.int64, device=dev)
    bidx = torch.arange(B, device=dev)
    p_n = target_probs[bidx, n].double()
    q_pad = torch.cat([draft_probs, torch.zeros(B, 1, V, dtype=draft_probs.dtype, device=dev)], 1)
    q_n = q_pad[bidx, n].double()
    r = torch.where((n < gamma)[:, None], torch.clamp(p_n - q_n, min=0.0), p_n)
    degenerate = r.sum(dim=-1) <= 0
    r = torch.where(degenerate[:, None], p_n, r)
    nxt = _inverse_cdf(r, uniforms[:, gamma].double())
    if batched:
        return n, nxt
    return int(n[0]), int(nxt[0])


def fused_verify(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                 draft_tokens: torch.Tensor, uniforms: torch.Tensor):
    """Speculative sampling verification (Leviathan et al. 2023); see the comment block above.

    On CUDA tensors uses the fused CUDA kernel when the extension is built, else the
    torch reference (which is also the CPU implementation).
    """
    if target_probs.is_cuda and not _kernels_forced_off():
        ext = load_cuda_extension()
        if ext is not None:
            batched = target_probs.dim() == 3
            tp, dp, dt, u = target_probs, draft_probs, draft_tokens, uniforms
            if not batched:
                tp, dp, dt, u = tp[None], dp[None], dt[None], u[None]
            if tp.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                tp, dp = tp.float(), dp.float()
            n, nxt = ext.fused_verify(tp.contiguous(), dp.to(tp.dtype).contiguous(),
                                      dt.to(torch.int64).contiguous(), u.to(torch.float32).contiguous(),
                                      torch.cuda.current_stream(tp.device).cuda_stream)
            if batched:
                return n, nxt
            return int(n[0]), int(nxt[0])
    return fused_verify_reference(target_probs, draft_probs, draft_tokens, uniforms)


# ---------------------------------------------------------------------------
# Run-record info
# ---------------------------------------------------------------------------

def backend_info(build: bool = True) -> dict:
    """What will run: {"cpu": "avx512"|"avx2"|"scalar"|"torch-fallback", "cpu_reason",
    "cuda": "built"|"unavailable: <reason>", "threads", ...}.  Builds lazily if build=True."""
    info: dict = {"threads": torch.get_num_threads(), "small_m": _small_m(), "tile_rows": TILE}
    if _kernels_forced_off():
        info.update(cpu="torch-fallback", cpu_reason="SCL_KERNELS=torch set")
    else:
        ext = load_cpu_extension() if build else _cpu_state["ext"]
        if ext is None:
            why = _cpu_state["reason"] if _cpu_state["tried"] else "not built yet (build=False)"
            info.update(cpu="torch-fallback", cpu_reason=why)
        else:
            isa = _cpu_isa(ext)
            best = int(ext.best_isa())
            info.update(cpu=ISA_NAMES[isa], cpu_best=ISA_NAMES[best],
                        cpu_reason="" if isa == best else f"capped by SCL_KERNEL_ISA={os.environ.get('SCL_KERNEL_ISA')}",
                        cpu_vnni=bool(ext.has_vnni()),
                        cpu_build_dir=_cpu_state.get("build_dir", ""))
            if not _act_int8():
                act = "fp32"
            elif isa == 2 and ext.has_vnni():
                act = "int8 per-32 block (AVX-512 VNNI)"
            elif isa == 0:
                act = "int8 per-32 block (scalar reference)"
            else:
                act = "fp32 (SCL_KERNEL_ACT=int8 needs AVX-512 VNNI)"
            info["int4_activations"] = act
    if _kernels_forced_off():
        info["cuda"] = "unavailable: SCL_KERNELS=torch set"
    elif torch.version.cuda is None or not torch.cuda.is_available():
        info["cuda"] = "unavailable: " + ("torch built without CUDA" if torch.version.cuda is None
                                          else "no CUDA device visible")
    else:
        ext = load_cuda_extension() if build else _cuda_state["ext"]
        info["cuda"] = "built" if ext is not None else f"unavailable: {_cuda_state['reason']}"
    return info
