"""AWQ's scale search onto our int4 format (pure torch).

Lin et al. (2023): a few input channels carry most of a layer's activation magnitude, and rounding
the weights that multiply them costs the most. Scaling those weight columns up by s (and the inputs
down by s, folded into the operation that produces them: a norm's weight, or the rows of the linear
before) leaves the float layer unchanged while giving the salient weights more of the grid. s is
mean|x|^α per channel, α searched per layer group for the least output error on calibration inputs.

The rounding after scaling is gptq.group_grid's searched clip (weighted by the scaled inputs' energy)
and round-to-nearest: AWQ's own clip search does the same job. The search's cost is one product per
candidate: of the sampled rows with its weights, or where the input is narrower than the sample (q/k/v,
gate/up, the head) of its weight error with the rows' Gram matrix; each candidate's rounding is one pass
over memory in scratch made once.
"""
from __future__ import annotations

import torch

from engine.quant.gptq import GRID, group_grid, rtn_codes

__all__ = ["ALPHAS", "search_scale", "quantize_scaled"]

ALPHAS = [i / 20 for i in range(20)]  # 0 (no scaling) .. 0.95


def quantize_scaled(w: torch.Tensor, s: torch.Tensor, H_diag: torch.Tensor, group_size: int, ratios=GRID):
    """(q, scales, mins) of w * s (columns scaled), the clip searched among `ratios` with the scaled inputs' energy
    H_kk / s_k²."""
    ws = w.float() * s[None, :]
    sc, mn = group_grid(ws, group_size, importance=H_diag / (s * s), ratios=ratios)
    return rtn_codes(ws, sc, mn), sc, mn


@torch.no_grad()
def search_scale(weights: list[torch.Tensor], x: torch.Tensor, x_abs_mean: torch.Tensor, H_diag: torch.Tensor,
                 group_size: int) -> tuple[torch.Tensor, float]:
    """(s [K], α) for linears that share the input rows `x` [T, K]: the α of ALPHAS whose scaled int4 weights
    give the least squared output error on x, summed over the linears (α = 0 is s = 1: plain rounding). Each
    candidate is rounded by min/max (as AWQ searches); the clip search runs once, on the chosen scales."""
    w = torch.cat([t.float() for t in weights], 0)
    (T, K), N = x.shape, w.shape[0]
    # the error mean((x Δᵀ)²) over T rows and N outputs, Δ = rounded - w: as sum((Δ G) ⊙ Δ) / (T N) with the Gram
    # matrix G = xᵀx when K < T (K² N multiply-adds a candidate instead of T K N)
    gram = x.T @ x if K < T else None
    ref = x @ w.T if gram is None else None
    base = x_abs_mean.float().clamp(min=1e-8)
    best = (float("inf"), torch.ones_like(base), 0.0)
    scratch = torch.empty_like(w)  # the head's is 0.9 GB, and so is `out`: made once
    out = torch.empty_like(w) if gram is not None else torch.empty_like(ref)
    for a in ALPHAS:
        s = base.pow(a)
        s = (s / (s.max() * s.min()).sqrt()).clamp(min=1e-4)
        rounded = _minmax_roundtrip(w, s, group_size, scratch)
        if gram is None:
            err = float(torch.matmul(x, rounded.T, out=out).sub_(ref).square_().mean())
        else:
            d = rounded.sub_(w)
            err = float(torch.matmul(d, gram, out=out).mul_(d).sum()) / (T * N)
        if err < best[0]:
            best = (err, s, a)
    return best[1], best[2]


def _minmax_roundtrip(w: torch.Tensor, s: torch.Tensor, group_size: int, scratch: torch.Tensor) -> torch.Tensor:
    """(w * s) rounded to int4 by min/max per group, dequantized and divided by s again, in `scratch`: the values
    quantize_scaled(w, s, ..., ratios=(1.0,)) and dequantize_codes give, in one pass over memory instead of six."""
    N, K = w.shape
    ws = torch.mul(w, s[None, :], out=scratch).view(N, K // group_size, group_size)
    lo, hi = ws.amin(dim=2), ws.amax(dim=2)
    sc = ((hi - lo) / 15.0).to(torch.float16)
    sc = torch.where(sc > 0, sc, torch.ones_like(sc)).float()[..., None]
    mn = lo.to(torch.float16).float()[..., None]
    return ws.sub_(mn).div_(sc).round_().clamp_(0, 15).mul_(sc).add_(mn).view(N, K).div_(s[None, :])
