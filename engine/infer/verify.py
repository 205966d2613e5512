"""Verification of draft tokens by the target: greedy, or lossless rejection sampling.

The one verifier of the engine (the batch calls it per sequence). Greedy is the argmax-prefix rule. Sampling draws
the uniforms here, from the run's generator, and hands them to engine.ops.verify_drafts: the rejection rule
written once (vectorised torch on CPU and as the GPU fallback, the fused CUDA kernel on CUDA).
"""
from __future__ import annotations

import torch

from engine.infer.sampling import SamplingParams
from engine.ops.verify import verify_drafts


def verify(p: torch.Tensor, q: torch.Tensor | None, d: torch.Tensor, sp: SamplingParams, gen):
    """Accepted counts [B] and the target's token after them [B], per sequence.

    p [B, g+1, V]: target probabilities (greedy reads only their argmax, so logits serve as well);
    q [B, g, V] or None for a deterministic draft (q = 1 on d);
    d [B, g]: draft tokens. Greedy: accept while d equals the target's argmax, then the argmax.
    Sampling: accept d_i with probability min(1, p/q); at the first rejection sample from
    normalize(max(0, p - q)); after g acceptances sample the bonus from p_{g+1}. One uniform per
    draft token and one for the token after them: u [B, g+1] from `gen`.
    """
    b, g = d.shape
    if sp.greedy:
        best = p.argmax(-1)  # [B, g+1]
        ok = (best[:, :g] == d).int()
        acc = ok.cumprod(1).sum(1)
        return acc, best.gather(1, acc[:, None]).squeeze(1)
    u = torch.rand((b, g + 1), generator=gen, device=p.device)
    return verify_drafts(p, q, d, u)
