"""GPTQ onto our int4 format, and the group grid it rounds to (pure torch).

Frantar et al. (2022): a layer's columns are rounded one at a time, and each column's rounding error
is spread over the columns not yet rounded, weighted by the inverse Hessian H = E[x xᵀ] of the
layer's calibration inputs, so the layer's *output* error stays small rather than each weight's.

What we fix, and why:
- The result must be our kernels' format exactly (engine.ops.formats: q in 0..15, an fp16 scale and
  an fp16 min per group of consecutive input columns). So each group's scale and min are chosen
  *before* the sweep, from the original weights ("static groups"), rounded to fp16, and every column
  is rounded against those stored values: dequantizing what we store is what GPTQ optimised.
- Act-order (columns with the largest Hessian diagonal first) then reorders only the sweep, not the
  groups, so no g_idx and no activation gather at run time.
- A group's scale and min are searched, not min/max: the clip ratio with the least squared error
  weighted by the Hessian diagonal (what llama.cpp's importance matrix weighs by) among GRID ratios.
- H is estimated from a few thousand calibration tokens (calibrate.DEFAULT_TOKENS, sized for the time
  target), fewer than down_proj's inputs (8,960 on the 1.5B): there H is rank-deficient and plain GPTQ
  (damping 1%) fits the calibration text. On the 1.5B's off-grid reference it cut layer 14's down_proj
  output error 4x on the calibration inputs and doubled it on held-out text against the searched grid
  alone (docs/runs/2026-12-07/session37-permuted/experiments). So H is shrunk toward its diagonal
  (SHRINK) and damped by DAMP of its mean diagonal: measured there, the held-out error of each of six linears
  is then below plain GPTQ's (o_proj: 0.3% above) and no higher than the searched grid's.
"""
from __future__ import annotations

import torch

__all__ = ["group_grid", "gptq_quantize", "rtn_codes", "pack_codes", "dequantize_codes", "GRID"]

GRID = torch.linspace(1.0, 0.70, 16).tolist()  # clip ratios tried per group (1.0 = min/max)
SHRINK = 0.25  # H <- (1 - SHRINK) H + SHRINK diag(H): the off-diagonal terms few tokens estimate poorly, damped
DAMP = 0.1  # then DAMP * mean(diag H) added to the diagonal (GPTQ's paper: 0.01, with 128 x 2,048 tokens)
SUB_BLOCK = 16  # columns of the sweep updated one by one; the rest of a block of 128 by matrix products


def group_grid(w: torch.Tensor, group_size: int, importance: torch.Tensor | None = None,
               symmetric: bool = False, ratios=GRID) -> tuple[torch.Tensor, torch.Tensor]:
    """fp16 (scales, mins) [N, G] for w [N, K] (K a multiple of group_size): per group, the clip ratio of
    `ratios` (GRID) whose round-to-nearest has the least squared error, weighted per input column by `importance`
    (the Hessian diagonal; None weighs every column alike). Symmetric: min = -8 * scale (exact in fp16)."""
    N, K = w.shape
    G = K // group_size
    wg = w.float().view(N, G, group_size)
    imp = (importance.float().view(1, G, group_size) if importance is not None
           else torch.ones(1, G, group_size, device=w.device))
    best_err = torch.full(wg.shape[:2], float("inf"), device=wg.device)
    best_s = torch.ones(wg.shape[:2], dtype=torch.float16, device=wg.device)
    best_m = torch.zeros_like(best_s)
    lo, hi = wg.amin(dim=2), wg.amax(dim=2)
    dq = torch.empty_like(wg)  # one scratch for every ratio, updated in place (the search reads memory, not math)
    for r in ratios:
        if symmetric:
            s = (torch.maximum(-lo, hi) * r / 7.5).to(torch.float16)
            s = torch.where(s > 0, s, torch.ones_like(s))
            m = (-8 * s.float()).to(torch.float16)
        else:
            s = ((hi - lo) * r / 15.0).to(torch.float16)
            s = torch.where(s > 0, s, torch.ones_like(s))
            # the clipped range keeps its centre: min moves in as far as max does
            m = (lo + (hi - lo) * (1 - r) / 2).to(torch.float16)
        s32, m32 = s.float()[..., None], m.float()[..., None]
        torch.sub(wg, m32, out=dq).div_(s32).round_().clamp_(0, 15).mul_(s32).add_(m32)
        err = dq.sub_(wg).square_().mul_(imp).sum(dim=2)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_s = torch.where(better, s, best_s)
        best_m = torch.where(better, m, best_m)
    return best_s.contiguous(), best_m.contiguous()


def rtn_codes(w: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] of w rounded to nearest on the given grid."""
    N, K = w.shape
    gs = K // scales.shape[1]
    s = scales.float().repeat_interleave(gs, dim=1)
    m = mins.float().repeat_interleave(gs, dim=1)
    return torch.round((w.float() - m) / s).clamp_(0, 15).to(torch.uint8)


def dequantize_codes(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    gs = q.shape[1] // scales.shape[1]
    return q.float() * scales.float().repeat_interleave(gs, dim=1) + mins.float().repeat_interleave(gs, dim=1)


def pack_codes(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] -> the canonical packed uint8 [N, K/2] (low nibble: the even column)."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


@torch.no_grad()
def gptq_quantize(w: torch.Tensor, H: torch.Tensor, group_size: int, act_order: bool = True,
                  damp: float = DAMP, shrink: float = SHRINK, block: int = 128, symmetric: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 [N, K], scales fp16 [N, G], mins fp16 [N, G]) for w [N, K] and H [K, K] = mean of x xᵀ.

    K must be a multiple of group_size. Input columns that calibration never saw (H's diagonal 0) are
    rounded to nearest: nothing is known of what they multiply."""
    N, K = w.shape
    if K % group_size:
        raise ValueError(f"{K} input columns are not a whole number of groups of {group_size}")
    W = w.detach().float().clone()
    H = H.detach().float().clone()
    diag = H.diagonal()
    dead = diag == 0
    H[dead, dead] = 1.0
    scales, mins = group_grid(W, group_size, importance=torch.where(dead, torch.ones_like(diag), diag),
                              symmetric=symmetric)
    perm = torch.argsort(H.diagonal(), descending=True) if act_order else torch.arange(K, device=W.device)
    H = H[perm][:, perm]
    diag = H.diagonal().clone()
    H.mul_(1 - shrink).diagonal().add_(shrink * diag)  # off-diagonal terms shrunk, the diagonal kept
    # The sweep works on Wᵀ [K, N]: each column of W is a contiguous row here, so every per-column step reads and
    # writes contiguous memory (on CPU this is most of the sweep's time).
    Wt = W[:, perm].T.contiguous()
    group_of = perm // group_size
    st = scales.float().T[group_of].contiguous()  # [K, N] in sweep order
    mt = mins.float().T[group_of].contiguous()
    H.diagonal().add_(damp * H.diagonal().mean())
    U = _inverse_cholesky_upper(H)
    Qt = torch.empty(K, N, dtype=torch.uint8, device=W.device)
    # Each column's error reaches the columns after it in three steps, all the same sum: one by one within a sub-block
    # of SUB_BLOCK columns, by one product per sub-block within the block, by one product per block beyond it. Only
    # the first is a per-column update, and it touches SUB_BLOCK rows of Wᵀ instead of the whole block.
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        W1, U1 = Wt[i1:i2].clone(), U[i1:i2, i1:i2]
        E1 = torch.empty_like(W1)
        for j1 in range(0, i2 - i1, SUB_BLOCK):
            j2 = min(j1 + SUB_BLOCK, i2 - i1)
            for i in range(j1, j2):
                row, s, m = W1[i], st[i1 + i], mt[i1 + i]
                q = torch.round((row - m) / s).clamp_(0, 15)
                Qt[i1 + i] = q.to(torch.uint8)
                E1[i] = err = (row - (q * s + m)) / U1[i, i]
                W1[i + 1:j2].addr_(U1[i, i + 1:j2], err, alpha=-1)
            W1[j2:].sub_(U1[j1:j2, j2:].T @ E1[j1:j2])
        Wt[i2:].sub_(U[i1:i2, i2:].T @ E1)
    inv = torch.argsort(perm)
    return Qt.T[:, inv].contiguous(), scales, mins


def _inverse_cholesky_upper(H: torch.Tensor) -> torch.Tensor:
    """The upper Cholesky factor U of H⁻¹ (UᵀU = H⁻¹), adding damping until H factors (a rank-poor Hessian from
    a short calibration set can fail the first time).

    Without forming H⁻¹: factor H with its indices reversed, J H J = L Lᵀ; then H = R Rᵀ with R = J L J upper
    triangular, so H⁻¹ = R⁻ᵀR⁻¹ and U = R⁻¹. One Cholesky and one triangular inverse, against a Cholesky, an
    inverse from it and a second Cholesky (a third of the work on down_proj's 8,960 columns)."""
    extra = 0.0
    for _ in range(6):
        Hd = H + extra * torch.eye(H.shape[0], device=H.device) if extra else H
        L, info = torch.linalg.cholesky_ex(Hd.flip(0, 1))
        if int(info) == 0:
            return _upper_triangular_inverse(L.flip(0, 1))
        extra = (extra * 10) or 0.01 * float(H.diagonal().mean())
    raise RuntimeError("the calibration Hessian is not positive definite even with damping")


def _upper_triangular_inverse(R: torch.Tensor, leaf: int = 256) -> torch.Tensor:
    """R⁻¹ for upper triangular R, by halves: [[A, B], [0, C]]⁻¹ = [[A⁻¹, -A⁻¹ B C⁻¹], [0, C⁻¹]], so nearly all
    the work is matrix products."""
    n = R.shape[0]
    if n <= leaf:
        return torch.linalg.solve_triangular(R, torch.eye(n, dtype=R.dtype, device=R.device), upper=True)
    h = n // 2
    Ai, Ci = _upper_triangular_inverse(R[:h, :h], leaf), _upper_triangular_inverse(R[h:, h:], leaf)
    out = torch.zeros_like(R)
    out[:h, :h], out[h:, h:] = Ai, Ci
    out[:h, h:] = -(Ai @ R[:h, h:]) @ Ci
    return out
