"""Speculative-sampling verification (Leviathan et al. 2023): the rejection rule, once, in torch and as a CUDA kernel.

Shapes: ``target_probs`` [B, g+1, V]; ``draft_probs`` [B, g, V], or None for a deterministic
draft (n-gram lookup: q is one-hot on the drafted token); ``draft_tokens`` [B, g] int64;
``uniforms`` [B, g+1] float32 in [0, 1). ``uniforms[:, i]`` (i < g) is the acceptance test of
draft token i; ``uniforms[:, g]`` is the one extra draw, used either for the residual resample at
the first rejection or for the bonus token after g acceptances (only one of them happens).

Arithmetic (the torch implementation and kernels/cuda/fused_verify.cu do exactly this):
  p_i = target_probs[i, t_i], q_i = draft_probs[i, t_i] (q_i = 1 without draft_probs), as float64
  accept i  <=>  t_i in [0, V) and u_i * q_i <= p_i   (== u_i <= min(1, p_i/q_i); q_i = 0 accepts)
  n = number of leading accepted tokens
  n < g:  r = max(0, p_n - q_n) (float64; q_n one-hot on t_n without draft_probs);  n == g: r = p_g
  if sum(r) <= 0: r = p_n   (p == q exactly: a rejection has probability zero)
  next = smallest j with cumsum(r)[j] > u_g * sum(r)   (inverse CDF); if rounding leaves none,
         the last j with r[j] > 0 (V - 1 if there is none).
The CUDA kernel sums in a different order, so it can differ only when u_g * sum(r) lies within
float64 rounding of a CDF boundary.
"""
from __future__ import annotations

from typing import Optional

import torch

from engine.ops import build as _build

__all__ = ["verify_drafts", "verify_drafts_torch"]

_PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(tp: torch.Tensor, dp: Optional[torch.Tensor], t: torch.Tensor, u: torch.Tensor) -> None:
    if tp.dim() != 3:
        raise ValueError(f"target_probs must be [B, g+1, V], got {tuple(tp.shape)}")
    B, g1, V = tp.shape
    g = g1 - 1
    if g < 0:
        raise ValueError("target_probs needs at least one position (g + 1 >= 1)")
    if dp is not None and tuple(dp.shape) != (B, g, V):
        raise ValueError(f"draft_probs must be [B, g, V] = {(B, g, V)}, got {tuple(dp.shape)}")
    if tuple(t.shape) != (B, g) or tuple(u.shape) != (B, g1):
        raise ValueError(f"draft_tokens must be [B, g] = {(B, g)} and uniforms [B, g+1] = {(B, g1)}; "
                         f"got {tuple(t.shape)} and {tuple(u.shape)}")


def verify_drafts(target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor],
                  draft_tokens: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted counts [B] and the token after them [B] (int64, on the inputs' device).

    CUDA tensors run the fused kernel (one block per sequence, the residual never materialised)
    when the extension is built and the kernels are enabled; everything else runs
    `verify_drafts_torch`, the same rule in vectorised torch.
    """
    _check(target_probs, draft_probs, draft_tokens, uniforms)
    if target_probs.is_cuda:
        ext = _build.cuda_extension()
        if ext is not None:
            tp = target_probs if target_probs.dtype in _PROB_DTYPES else target_probs.float()
            dp = None if draft_probs is None else draft_probs.to(tp.dtype).contiguous()
            n, nxt = ext.fused_verify(tp.contiguous(), dp, draft_tokens.to(torch.int64).contiguous(),
                                      uniforms.to(torch.float32).contiguous(),
                                      torch.cuda.current_stream(tp.device).cuda_stream)
            return n, nxt
    return verify_drafts_torch(target_probs, draft_probs, draft_tokens, uniforms)


def _inverse_cdf(r: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """r float64 [B, V] non-negative, u float64 [B] -> int64 [B]."""
    cdf = torch.cumsum(r, dim=-1)
    target = u[:, None] * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    V = r.shape[-1]
    last_nz = V - 1 - torch.argmax((r > 0).to(torch.int64).flip(-1), dim=-1)
    return torch.where(idx >= V, last_nz, idx)


def verify_drafts_torch(target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor],
                        draft_tokens: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule of the module docstring in vectorised torch (any device): the CPU path and the GPU fallback."""
    _check(target_probs, draft_probs, draft_tokens, uniforms)
    # the same input precision as the CUDA kernel: probabilities fp32/fp16/bf16, uniforms fp32
    tp = target_probs if target_probs.dtype in _PROB_DTYPES else target_probs.float()
    dp = None if draft_probs is None else draft_probs.to(tp.dtype)
    u = uniforms.to(torch.float32).double()
    B, g1, V = tp.shape
    g = g1 - 1
    dev = tp.device
    bidx = torch.arange(B, device=dev)
    n = torch.zeros(B, dtype=torch.int64, device=dev)
    if g > 0:
        t = draft_tokens.to(torch.int64)
        valid = (t >= 0) & (t < V)
        tc = t.clamp(0, V - 1)
        p_sel = tp[:, :g].gather(2, tc[..., None]).squeeze(-1).double()
        q_sel = torch.ones_like(p_sel) if dp is None else dp.gather(2, tc[..., None]).squeeze(-1).double()
        rej = (~(valid & (u[:, :g] * q_sel <= p_sel))).to(torch.int64)
        n = torch.where(rej.any(dim=1), torch.argmax(rej, dim=1), torch.full_like(n, g))
    p_n = tp[bidx, n].double()                                   # [B, V]
    rejected = n < g
    if g > 0:
        m = n.clamp(max=g - 1)                                   # the rejected position (any where n == g)
        if dp is None:                                           # q_n one-hot on t_n
            q_n = torch.zeros_like(p_n)
            q_n[bidx, tc[bidx, m]] = valid[bidx, m].double()
        else:
            q_n = dp[bidx, m].double()
        r = torch.where(rejected[:, None], torch.clamp(p_n - q_n, min=0.0), p_n)
    else:
        r = p_n
    r = torch.where((r.sum(dim=-1) <= 0)[:, None], p_n, r)
    return n, _inverse_cdf(r, u[:, g])
