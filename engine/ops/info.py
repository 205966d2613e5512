"""``backend_info()``: what the kernels will run in this process, for the run record (record.kernels)."""
from __future__ import annotations

import torch

from engine.ops import build as _build
from engine.ops import config as _config
from engine.ops.dense import DENSE_KERNELS, dense_kernel, dense_rows
from engine.ops.fused import fused_info
from engine.ops.prepared import TILE

__all__ = ["backend_info"]

_DISABLED = "kernels disabled (SCL_KERNELS=torch or ops.configure(enabled=False))"


def _dense_text(ext, cfg) -> str:
    """Which kernel runs bf16 and fp32 linears, up to which M (torch's F.linear past it), and where M comes from."""
    if cfg.dense_m == 0:
        return "off (dense_m = 0: torch F.linear)"
    parts = []
    for kind, bf16 in (("bf16", True), ("fp32", False)):
        kernel = dense_kernel(ext, cfg, bf16)
        parts.append(f"{kind} {DENSE_KERNELS[kernel]} M <= {dense_rows(ext, cfg, kernel, kind)}")
    src = "dense_m" if cfg.dense_m is not None else "measured against torch's F.linear on this machine"
    return f"{', '.join(parts)} ({src}; torch past it)"


def backend_info(build: bool = True) -> dict:
    """{"cpu": "avx512"|"avx2"|"scalar"|"torch-fallback", "cpu_reason", "cpu_best", "cpu_vnni",
    "int4_activations", "int8_activations", "dense_kernel" (bf16/fp32 linears, engine.ops.dense),
    "cuda": "built"|"unavailable: <reason>",
    "threads", "small_m", "tile_rows",
    "config": the KernelConfig as a dict, "fused": on/off and why, "fused_steps" / "reference_steps":
    forward passes that took each path in the enclosing ``count_steps()`` run (else in this process;
    "steps_counted" says which), "last_step", "reference_reasons"}.
    Builds the extensions lazily if build=True."""
    cfg = _config.kernel_config()
    info: dict = {"threads": torch.get_num_threads(), "small_m": cfg.small_m, "tile_rows": TILE,
                  "config": cfg.to_dict()}
    if not cfg.enabled:
        info.update(cpu="torch-fallback", cpu_reason=_DISABLED)
    else:
        ext = _build.load_cpu_extension() if build else _build._cpu_state["ext"]
        if ext is None:
            st = _build._cpu_state
            why = st["reason"] if st["tried"] else "not built yet (build=False)"
            info.update(cpu="torch-fallback", cpu_reason=why)
        else:
            isa = _build.cpu_isa(ext, cfg)
            best = int(ext.best_isa())
            names = _config.ISA_NAMES
            info.update(cpu=names[isa], cpu_best=names[best],
                        cpu_reason="" if isa == best else f"capped by isa={cfg.isa} (SCL_KERNEL_ISA / ops.configure)",
                        cpu_vnni=bool(ext.has_vnni()),
                        cpu_build_dir=_build._cpu_state.get("build_dir", ""))
            kern = {"avx512-vnni": "AVX-512 VNNI", "avx2-maddubs": "AVX2 vpmaddubsw",
                    "scalar": "scalar reference"}[ext.q8_kernel(isa)]
            info["int4_activations"] = f"int8 per-32 block ({kern})" if cfg.act_int8 else "fp32"
            # int8 weights follow the same switch (since session 39; a record without this key ran them on fp32)
            info["int8_activations"] = info["int4_activations"]
            info["int4_q8_kernel"] = kern
            info["dense_kernel"] = _dense_text(ext, cfg)
    info.update(fused_info())
    if not cfg.enabled:
        info["cuda"] = "unavailable: " + _DISABLED
    elif torch.version.cuda is None or not torch.cuda.is_available():
        info["cuda"] = "unavailable: " + ("torch built without CUDA" if torch.version.cuda is None
                                          else "no CUDA device visible")
    else:
        ext = _build.load_cuda_extension() if build else _build._cuda_state["ext"]
        info["cuda"] = "built" if ext is not None else f"unavailable: {_build._cuda_state['reason']}"
    return info
