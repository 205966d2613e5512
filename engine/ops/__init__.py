"""Kernels: the quantized formats, load-time packed layouts, int8/int4 linear dispatch (C++/CUDA kernels
with a PyTorch path), speculative-sampling verification, and the kernel settings.

Modules: ``formats`` (canonical int8/int4: quantize, dequantize, unpack), ``prepared`` (PreparedInt8 /
PreparedInt4, prepare_*), ``linear`` (int8_linear / int4_linear), ``dense`` (dense_linear / DenseLinear:
bf16 and fp32 linears at small M on CPU), ``verify`` (verify_drafts), ``build`` (building/loading kernels/cpu
and kernels/cuda), ``config`` (KernelConfig, configure,
using), ``info`` (backend_info for the run record), ``fused`` (the fused forward pass: one C++ call
per step of up to FUSED_MAX_ROWS = 64 rows, longer steps split into calls of 64; ``count_steps``
counts a run's passes). Imports only engine.common and torch.
"""
from engine.ops.build import load_cpu_extension, load_cuda_extension
from engine.ops.config import KernelConfig, configure, kernel_config, using
from engine.ops.dense import DenseLinear, adopt_dense_linears, dense_linear
from engine.ops.fused import FUSED_MAX_ROWS, StepCounts, count_steps, fused_forward_rows, fused_info, reset_fused_stats
from engine.ops.formats import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8, unpack_int4
from engine.ops.info import backend_info
from engine.ops.linear import int4_linear, int8_linear
from engine.ops.prepared import (TILE, PreparedInt4, PreparedInt8, prepare_int4, prepare_int8, quantize_int4_at_load,
                                 quantize_int8_at_load)
from engine.ops.verify import verify_drafts, verify_drafts_torch

__all__ = [
    "quantize_int8", "dequantize_int8", "quantize_int4", "dequantize_int4", "unpack_int4",
    "PreparedInt8", "PreparedInt4", "prepare_int8", "prepare_int4", "quantize_int4_at_load", "quantize_int8_at_load",
    "TILE",
    "int8_linear", "int4_linear", "dense_linear", "DenseLinear", "adopt_dense_linears",
    "verify_drafts", "verify_drafts_torch",
    "KernelConfig", "kernel_config", "configure", "using",
    "backend_info", "load_cpu_extension", "load_cuda_extension",
    "fused_forward_rows", "fused_info", "reset_fused_stats", "count_steps", "StepCounts", "FUSED_MAX_ROWS",
]
