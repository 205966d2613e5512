"""Verification of draft tokens by the target: greedy, or lossless rejection sampling."""
from __future__ import annotations

import torch

from engine.infer.sampling import SamplingParams


def verify(p: torch.Tensor, q: torch.Tensor | None, d: torch.Tensor, sp: SamplingParams, gen):
    """Accepted counts [B] and the target's token after them [B], per sequence.

    p [B, g+1, V]: target probabilities; q [B, g, V] or None for a deterministic draft (q = 1 on d);
    d [B, g]: draft tokens. Greedy: accept while d equals the target's argmax, then the argmax.
    Sampling: accept d_i with probability min(1, p/q); at the first rejection sample from
    normalize(max(0, p - q)); after g acceptances sample the bonus from p_{g+1}.
    """
    b, g = d.shape
    if sp.greedy:
        best = p.argmax(-1)  # [B, g+1]
        ok = (best[:, :g] == d).int()
        acc = ok.cumprod(1).sum(1)
        return acc, best.gather(1, acc[:, None]).squeeze(1)
    pd = p[:, :g].gather(2, d[:, :, None]).squeeze(2)
    qd = torch.ones_like(pd) if q is None else q.gather(2, d[:, :, None]).squeeze(2)
    u = torch.rand(pd.shape, generator=gen, device=p.device)
    ok = (u * qd <= pd).int()  # u <= p/q without dividing by a zero q
    acc = ok.cumprod(1).sum(1)
    nxt = torch.empty(b, dtype=torch.long, device=p.device)
    for i in range(b):
        k = int(acc[i])
        if k == g:
            dist = p[i, g]
        else:
            qk = torch.nn.functional.one_hot(d[i, k], p.shape[-1]).float() if q is None else q[i, k]
            dist = (p[i, k] - qk).clamp(min=0)
            if float(dist.sum()) <= 0:  # p == q exactly: any rejection is measure-zero; fall back to p
                dist = p[i, k]
        nxt[i] = torch.multinomial(dist / dist.sum(), 1, generator=gen)
    return acc, nxt


