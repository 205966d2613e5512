"""The kernel settings: resolved once, read by the hot path as plain attributes, carried by the run record.

The environment is the initial source, read once at first use (the first prepare/linear call,
`backend_info()` or `kernel_config()`):

``SCL_KERNELS=torch``            ``enabled=False``: the plain-PyTorch path everywhere (also off/0/none/fallback).
``SCL_KERNEL_ISA=scalar|avx2|avx512``  ``isa``: cap the CPU ISA (default: the best the CPU has).
``SCL_KERNEL_SMALL_M=n``         ``small_m``: largest M for the small-M CPU kernel (default 32, 0..64).
``SCL_KERNEL_DENSE_M=n``         ``dense_m``: largest M for which bf16/fp32 nn.Linear on CPU runs the dense C++ kernel
                                 (engine/ops/dense.py; 0..64; 0 = torch's F.linear; unset or ``auto``: the M
                                 measured on this machine, engine/ops/dense_crossover.py).
``SCL_KERNEL_PREFILL=dequant``   ``prefill="dequant"``: M above ``small_m`` dequantizes weight blocks for a
                                 torch matmul; the default ``"chunks"`` runs the small-M kernel in chunks.
``SCL_KERNEL_ACT=fp32|int8``     ``act_int8``: int4 and int8 CPU kernels quantize activations to int8 per 32-k block
                                 (AVX-512 VNNI, AVX2 vpmaddubsw, scalar). Default int8: measured against
                                 fp32 it adds no KL on the 1.5B and ~2% of int4's own on the 0.5B
                                 (docs/KERNELS.md); ``fp32`` gives exact weight-only semantics.
``SCL_FUSE=0``                   ``fuse=False``: engine.quant does not fuse q/k/v and gate/up at load.
``SCL_FUSED=0``                  ``fused=False``: no fused forward pass (engine/ops/fused.py); every step runs
                                 the model's PyTorch path (the reference).
``SCL_FUSED_BF16=0|1``           ``fused_bf16``: a bf16 model in the fused step (0: its PyTorch path; 1: the step).
                                 Unset: the step, except where the CPU has AMX-BF16 (there the PyTorch path's
                                 AMX kernel was measured and the step has no AMX kernel).
``SCL_CUDA_GRAPH=1``             ``cuda_graph=True``: on CUDA, plain decode steps replay a captured CUDA graph
                                 (engine/ops/cuda_graph.py); off by default until checked on a GPU.

After that the environment is never read again. Code and tests that switch settings say so:
``prev = configure(isa="avx2")`` (returns the previous config; ``configure(prev)`` restores it), or
``with using(act_int8=True): ...``. A child process started with a changed environment resolves
its own settings from it (engine/peers does that for SCL_KERNEL_ACT).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from typing import Iterator, Mapping, Optional

__all__ = ["KernelConfig", "kernel_config", "configure", "using", "ISA_NAMES", "ISA_IDS", "KERNEL_MAX_M",
           "DEFAULT_SMALL_M", "DEFAULT_DENSE_M"]

log = logging.getLogger(__name__)

ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512"}
ISA_IDS = {v: k for k, v in ISA_NAMES.items()}
KERNEL_MAX_M = 64      # MAX_M in the C++ code
DEFAULT_SMALL_M = 32   # M above this -> the small-M kernel in chunks, or (past PREFILL_CHUNKS_MAX_M) dequantize
DEFAULT_DENSE_M = None  # bf16/fp32 linears: the kernel up to the M measured on this machine (ops.dense_crossover)
PREFILL_MODES = ("chunks", "dequant")
_OFF_VALUES = ("torch", "fallback", "off", "0", "none")
_ACT_FP32_VALUES = ("fp32", "f32", "float", "float32", "0", "off")   # anything else (int8, unset): int8


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """What the kernels do in this process. Frozen: a change is a new config (`configure`)."""

    enabled: bool = True               # False: plain PyTorch everywhere (CPU and CUDA kernels off)
    isa: Optional[str] = None          # CPU ISA cap: None (best available), "scalar", "avx2", "avx512"
    small_m: int = DEFAULT_SMALL_M     # largest M for the small-M CPU kernel
    dense_m: Optional[int] = DEFAULT_DENSE_M  # largest M for the dense CPU kernel (None: measured; 0: torch)
    prefill: str = "chunks"            # M > small_m on CPU: "chunks" (small-M kernel) or "dequant"
    act_int8: bool = True              # int4 and int8 CPU kernels: int8 activations (VNNI / AVX2 maddubs / scalar)
    fuse: bool = True                  # engine.quant fuses q/k/v and gate/up before quantizing
    fused: bool = True                 # CPU forward passes run as one fused C++ call per 64 rows (ops.fused)
    fused_bf16: Optional[bool] = None  # a bf16 model in that step (None: yes unless the CPU has AMX-BF16)
    cuda_graph: bool = False           # CUDA plain decode steps replay a captured graph (ops.cuda_graph)

    def __post_init__(self):
        for name in ("enabled", "act_int8", "fuse", "fused", "cuda_graph"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"KernelConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.fused_bf16 is not None and not isinstance(self.fused_bf16, bool):
            raise TypeError(f"KernelConfig.fused_bf16 must be None or a bool, got {self.fused_bf16!r}")
        if self.isa is not None and self.isa not in ISA_IDS:
            raise ValueError(f"KernelConfig.isa must be None or one of {list(ISA_IDS)}, got {self.isa!r}")
        for name in ("small_m", "dense_m"):
            v = getattr(self, name)
            if name == "dense_m" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= KERNEL_MAX_M:
                raise ValueError(f"KernelConfig.{name} must be an int in 0..{KERNEL_MAX_M}, got {v!r}")
        if self.prefill not in PREFILL_MODES:
            raise ValueError(f"KernelConfig.prefill must be one of {PREFILL_MODES}, got {self.prefill!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "KernelConfig":
        """The settings the environment asks for; an unusable value is logged and left at its default."""
        env = os.environ if env is None else env

        def get(name: str) -> str:
            return (env.get(name) or "").strip().lower()

        isa: Optional[str] = get("SCL_KERNEL_ISA") or None
        if isa is not None and isa not in ISA_IDS:
            log.warning("SCL_KERNEL_ISA=%r not one of %s; using the best available", isa, list(ISA_IDS))
            isa = None

        def rows(name: str, default: Optional[int]) -> Optional[int]:
            if not get(name) or (default is None and get(name) == "auto"):
                return default
            try:
                return max(0, min(KERNEL_MAX_M, int(get(name))))
            except ValueError:
                log.warning("%s=%r is not an integer; using %d", name, get(name), default)
                return default

        small_m = rows("SCL_KERNEL_SMALL_M", DEFAULT_SMALL_M)
        dense_m = rows("SCL_KERNEL_DENSE_M", DEFAULT_DENSE_M)
        return cls(enabled=get("SCL_KERNELS") not in _OFF_VALUES,
                   isa=isa,
                   small_m=small_m,
                   dense_m=dense_m,
                   prefill="dequant" if get("SCL_KERNEL_PREFILL") == "dequant" else "chunks",
                   act_int8=get("SCL_KERNEL_ACT") not in _ACT_FP32_VALUES,
                   fuse=get("SCL_FUSE") != "0",
                   fused=get("SCL_FUSED") not in ("0", "off", "false", "no"),
                   fused_bf16={"0": False, "off": False, "1": True, "on": True}.get(get("SCL_FUSED_BF16")),
                   cuda_graph=get("SCL_CUDA_GRAPH") in ("1", "on", "true", "yes"))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_lock = threading.Lock()
_active: Optional[KernelConfig] = None


def kernel_config() -> KernelConfig:
    """The config in force; the first call resolves it from the environment."""
    cfg = _active
    if cfg is None:
        cfg = _resolve()
    return cfg


def _resolve() -> KernelConfig:
    global _active
    with _lock:
        if _active is None:
            _active = KernelConfig.from_env()
        return _active


def configure(config: Optional[KernelConfig] = None, /, **changes) -> KernelConfig:
    """Set the settings for this process and return the previous ones.

    ``configure(isa="avx2")`` changes fields of the active config; ``configure(prev)`` installs a
    whole config (restoring an earlier one); ``configure(KernelConfig.from_env())`` re-reads the
    environment. Weights prepared before a change keep their layout (a layout prepared with
    ``enabled=True`` is still computed correctly by the PyTorch path after ``enabled=False``).
    """
    global _active
    if config is not None and not isinstance(config, KernelConfig):
        raise TypeError(f"configure() takes a KernelConfig, got {type(config).__name__}")
    with _lock:
        prev = _active if _active is not None else KernelConfig.from_env()
        new = config if config is not None else prev
        if changes:
            unknown = set(changes) - {f.name for f in dataclasses.fields(KernelConfig)}
            if unknown:
                raise TypeError(f"unknown kernel setting(s): {', '.join(sorted(unknown))}")
            new = dataclasses.replace(new, **changes)
        _active = new
    return prev


@contextlib.contextmanager
def using(config: Optional[KernelConfig] = None, /, **changes) -> Iterator[KernelConfig]:
    """``with using(act_int8=True): ...``: the changed config inside, the previous one restored after."""
    prev = configure(config, **changes)
    try:
        yield kernel_config()
    finally:
        configure(prev)
