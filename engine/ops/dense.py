"""``dense_linear`` / ``DenseLinear``: bf16 and fp32 linears on CPU at small M through the C++ dense kernels,
and fp32 linears whose weights are held in half precision (a checkpoint's dense head as it stores it).

| x (CPU) | M | path |
| bf16 x, bf16 W (or fp32 x, fp32 W), extension built, ``dense_m`` != 0 | 1 .. limit | kernels/cpu/dense*: one |
|   | | pass over W's own [N, K] storage, fp32 accumulation, output rounded once to x's dtype |
| fp32 x, bf16 or fp16 W (widened exactly) | 1 .. limit | the same kernels, fp32 output: the fp32 linear's |
| fp32 x, bf16 or fp16 W | more, or no kernel | torch's F.linear on W widened to fp32, HALF_CHUNK rows at a time |
| anything else (prefill M, mixed dtypes, CUDA, grad, kernels off) | any | torch's F.linear |

Kernel per ISA cap (``KernelConfig.isa``): avx512 -> AMX's TDPBF16PS for bf16 where the CPU has AMX-BF16 and
the OS grants the tiles, else VDPBF16PS where it has AVX512_BF16, else the AVX-512 shift/FMA kernel; avx2 -> the
AVX2 shift/FMA kernel, scalar -> the portable reference.
The limit is ``dense_m`` where the config sets it, else the M up to which the kernel is no slower than torch
on this machine (``dense_rows``, measured once: engine/ops/dense_crossover.py): decode and speculative
verification take the kernel, and prefill chunks where it wins (oneDNN's bf16 GEMM reorders the weight on
every call, but past 4-8 rows on AMX tiles it still beats the AVX-512 kernels; the AMX kernel wins to 64).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from engine.ops import build as _build
from engine.ops import config as _config
from engine.ops import dense_crossover as _crossover

__all__ = ["DENSE_KERNELS", "dense_kernel", "dense_rows", "dense_linear", "DenseLinear", "adopt_dense_linears"]

DENSE_KERNELS = {0: "scalar", 1: "avx2", 2: "avx512", 3: "avx512-bf16", 4: "amx-bf16"}   # ids of ext.dense_gemm
_DTYPES = (torch.bfloat16, torch.float32)
_KIND = {torch.bfloat16: "bf16", torch.float32: "fp32"}
HALF_WEIGHTS = (torch.bfloat16, torch.float16)  # held as stored, widened to fp32 against fp32 x
HALF_CHUNK = 8192  # rows of a half-precision W widened at a time off the kernel (a 1.5B head: 8192 x 1536 fp32)
_resolved: dict = {}  # (extension, isa cap, bf16) -> kernel id


def dense_kernel(ext, cfg: "_config.KernelConfig", bf16: bool) -> int:
    """Kernel id for a weight dtype: the best the CPU has under the ISA cap (resolved once per cap)."""
    key = (id(ext), cfg.isa, bf16)
    hit = _resolved.get(key)
    if hit is None:
        isa = _build.cpu_isa(ext, cfg)
        hit = (4 if ext.has_amx_bf16() else 3) if isa == 2 and bf16 and ext.has_avx512_bf16() else isa
        _resolved[key] = hit
    return hit


def dense_rows(ext, cfg: "_config.KernelConfig", kernel: int, kind: str) -> int:
    """The largest M the kernel takes: ``dense_m`` where set, else measured on this machine (dense_crossover)."""
    if cfg.dense_m is not None:
        return cfg.dense_m
    return _crossover.crossover(ext, kernel, kind)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear(x, weight, bias); on CPU at 1 <= M <= the limit (``dense_rows``) with bf16 or fp32 x and weight
    of one dtype, the C++ dense kernel (same semantics: fp32 accumulation, one rounding to x.dtype). fp32 x
    against bf16 or fp16 weights is the fp32 linear of the weights widened exactly (the kernel at small M, else
    torch by chunks)."""
    cfg = _config.kernel_config()
    half = x.dtype is torch.float32 and weight.dtype in HALF_WEIGHTS
    if (cfg.enabled and cfg.dense_m != 0 and (x.dtype is weight.dtype and x.dtype in _DTYPES or half)
            and x.device.type == "cpu"
            and weight.device.type == "cpu" and weight.dim() == 2 and x.is_contiguous() and weight.is_contiguous()
            and (bias is None or (bias.dtype in _DTYPES and bias.device.type == "cpu"))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None and bias.requires_grad)))):
        K = weight.shape[1]
        M = x.numel() // K if K else 0
        if M > 0 and x.shape[-1] == K:
            ext = _build._cpu_state["ext"] or _build.load_cpu_extension()
            if ext is not None:
                kernel = dense_kernel(ext, cfg, x.dtype is torch.bfloat16)
                if (ext.dense_kernel_supported(kernel, x.dtype is torch.bfloat16, weight.dtype is torch.float16)
                        and (M == 1 or M <= dense_rows(ext, cfg, kernel, "half" if half else _KIND[x.dtype]))):
                    b = None if bias is None else bias.contiguous()
                    return ext.dense_gemm(x, weight, b, kernel)
    if half:
        return torch.cat([F.linear(x, weight[i:i + HALF_CHUNK].float(),
                                   None if bias is None else bias[i:i + HALF_CHUNK].float())
                          for i in range(0, weight.shape[0], HALF_CHUNK)], -1)
    return F.linear(x, weight, bias)


class DenseLinear(nn.Linear):
    """An nn.Linear (same parameters, same state dict) whose forward is `dense_linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias)

    @classmethod
    def adopt(cls, lin: nn.Linear) -> "DenseLinear":
        """A DenseLinear holding `lin`'s own Parameter objects (no copy: a tied head stays tied)."""
        new = cls(lin.in_features, lin.out_features, bias=lin.bias is not None, device="meta")
        new.weight = lin.weight
        new.bias = lin.bias
        new.train(lin.training)
        return new


def adopt_dense_linears(model: nn.Module) -> int:
    """Swap every plain nn.Linear of `model` (exact type: quantized and bitsandbytes layers are left alone)
    for a DenseLinear on the same parameters; returns how many were swapped."""
    n, kinds = 0, set()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, DenseLinear.adopt(child))
                n += 1
                if child.weight.device.type == "cpu" and child.weight.dtype in _DTYPES:
                    kinds.add(_KIND[child.weight.dtype])
    _resolve_rows(kinds)
    return n


def _resolve_rows(kinds) -> None:
    """Measure (or read) this machine's limits at load, so no request waits for it."""
    cfg = _config.kernel_config()
    if not (kinds and cfg.enabled and cfg.dense_m is None):
        return
    ext = _build._cpu_state["ext"] or _build.load_cpu_extension()
    if ext is None:
        return
    for kind in sorted(kinds):
        kernel = dense_kernel(ext, cfg, kind == "bf16")
        if ext.dense_kernel_supported(kernel, kind == "bf16", False):
            dense_rows(ext, cfg, kernel, kind)
