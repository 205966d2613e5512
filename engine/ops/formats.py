"""The canonical quantized formats: the one definition of int8 and int4 weights (pure torch).

int8: ``qweight`` int8 [N, K], ``scale`` float32 [N];  w[n, k] = qweight[n, k] * scale[n]
(per-output-channel symmetric, |q| <= 127; an all-zero row gets scale 1).

int4: group size gs in {32, 64, 128}, G = ceil(K / gs); ``packed`` uint8 [N, G*gs//2];
byte j of row n holds q[n, 2j] in the low nibble and q[n, 2j+1] in the high nibble,
q in 0..15, q = 0 for padding positions k >= K; ``scales`` / ``mins`` float16 [N, G];
w[n, k] = float(scales[n, k//gs]) * q[n, k] + float(mins[n, k//gs]).

engine.quant calls these; the kernels' packed layouts (engine.ops.prepared) are made from them.
"""
from __future__ import annotations

import torch

from engine.common.vocab import GROUP_SIZES

__all__ = ["quantize_int8", "dequantize_int8", "quantize_int4", "dequantize_int4", "unpack_int4",
           "check_group_size"]


def check_group_size(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be 32, 64 or 128, got {group_size}")


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


def quantize_int4(w: torch.Tensor, group_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise asymmetric int4 (min/max per group, scale = (max-min)/15).

    Returns (packed uint8 [N, G*gs//2], scales fp16 [N, G], mins fp16 [N, G]).
    q is computed against the fp16-rounded scale/min, so dequantization with the
    stored values is exactly what the quantizer intended.  Padding k >= K: q = 0.
    """
    check_group_size(group_size)
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    N, K = w.shape
    gs = group_size
    G = (K + gs - 1) // gs
    Kp = G * gs
    w32 = w.detach().to(torch.float32)
    if Kp == K:  # every group whole (all catalog shapes): no padding, no masks (a model's load is mostly this)
        wg = w32.reshape(N, G, gs)
        wmin, wmax = torch.aminmax(wg, dim=2)
    else:
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
    q = (wg - m32).div_(s32).round_().clamp_(0, 15).to(torch.uint8)
    if Kp != K:
        q = torch.where(vg, q, torch.zeros_like(q))
    q = q.view(N, Kp)
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
