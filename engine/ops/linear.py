"""``int8_linear`` / ``int4_linear``: dispatch to the kernels, and the PyTorch path they fall back to.

| x | M | path |
| CPU, extension built | 1 .. small_m | the C++ SIMD kernel (AVX-512 / AVX2 / scalar, capped by ``isa``) |
| CPU, extension built | .. 512 | the small-M kernel in chunks of small_m rows (``prefill="chunks"``) |
| CPU, extension built | > 512 or ``prefill="dequant"`` | C++ dequantizes 4096-row blocks, torch (MKL) matmul |
| CUDA, extension built | 1 .. 32 | the CUDA kernel |
| otherwise | any | torch: dequantize 4096-row blocks + matmul |

The settings come from engine.ops.config, read as attributes of one frozen object: the hot path
never looks at the environment.
"""
from __future__ import annotations

from typing import Optional

import torch

from engine.ops import build as _build
from engine.ops import config as _config
from engine.ops.prepared import TILE, PreparedInt4, PreparedInt8

__all__ = ["int8_linear", "int4_linear"]

PREFILL_CHUNKS_MAX_M = 512
CUDA_SMALL_M = 32      # on CUDA: above this torch bf16 matmul on dequantized blocks wins
PREFILL_BLOCK_ROWS = 4096


def _small_m_call(ext, x, prepared, bias, N, K, isa, act_int8: bool, is4: bool):
    """Small-M kernel call: fp32 activations, or int8 activations if asked (AVX-512 VNNI,
    AVX2 vpmaddubsw, or the scalar reference, by ISA), for int4 and int8 weights alike."""
    if not is4:
        return (ext.int8_gemm_q8 if act_int8 else ext.int8_gemm)(x, prepared.w, prepared.scale, bias, N, isa)
    gs = prepared.group_size
    if act_int8:
        return ext.int4_gemm_q8(x, prepared.w, prepared.sm, bias, N, K, gs, isa)
    return ext.int4_gemm(x, prepared.w, prepared.sm, bias, N, K, gs, isa)


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
            wb = ext.int8_dequant(prepared.w, prepared.scale, N, prepared.K, t0, t1)
        else:
            wb = ext.int4_dequant(prepared.w, prepared.sm, N, prepared.K, prepared.group_size, t0, t1)
        r0, r1 = t0 * TILE, min(N, t1 * TILE)
        if bias is not None:
            y[:, r0:r1] = torch.addmm(bias[r0:r1], x2, wb.t())
        else:
            y[:, r0:r1] = x2 @ wb.t()
    return y


def _linear(x: torch.Tensor, prepared, bias: Optional[torch.Tensor], is4: bool) -> torch.Tensor:
    K, N = prepared.K, prepared.N
    if x.shape[-1] != K:
        raise ValueError(f"x has last dim {x.shape[-1]}, weight has K={K}")
    cfg = _config.kernel_config()
    # ---- hot path: CPU decode step, fp32 [M, K] contiguous, packed layout
    if (prepared.layout == "cpu_tiled" and not x.is_cuda and x.dtype == torch.float32
            and x.is_contiguous() and (bias is None or bias.dtype == torch.float32)):
        M = x.numel() // K if K else 0
        if 0 < M <= cfg.small_m and cfg.enabled:
            ext = _build._cpu_state["ext"] or _build.load_cpu_extension()
            if ext is not None:
                isa = _build.cpu_isa(ext, cfg)
                b = None if bias is None else bias.contiguous()
                return _small_m_call(ext, x, prepared, b, N, K, isa, cfg.act_int8, is4)

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
        ext = _build.cuda_extension(cfg)
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
    ext = _build.cpu_extension(cfg) if prepared.layout == "cpu_tiled" else None
    if ext is not None:
        isa = _build.cpu_isa(ext, cfg)
        sm = cfg.small_m

        def small(xs):
            return _small_m_call(ext, xs, prepared, b32, N, K, isa, cfg.act_int8, is4)

        if M <= sm:
            y = small(x32)
        elif cfg.prefill == "dequant" or M > PREFILL_CHUNKS_MAX_M or sm == 0:
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
