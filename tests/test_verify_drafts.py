"""Draft verification (engine/ops/verify.py, ops.verify_drafts): the kernel against a Python transcription of
the documented rule, batched rows against single ones, edge cases and the output distribution."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import ops  # noqa: E402


# ------------------------------------------------------- verification ----

def _verify_loop(tp, dp, toks, u):
    """Straightforward python transcription of the documented rule (engine/ops/verify.py);
    dp None: a deterministic draft (q one-hot on the drafted token)."""
    gamma = toks.shape[0]
    V = tp.shape[-1]
    tpl = tp.double().tolist()
    dpl = dp.double().tolist() if dp is not None else [[1.0 if j == int(toks[i]) else 0.0 for j in range(V)]
                                                       for i in range(gamma)]
    ul = u.double().tolist()
    n = 0
    while n < gamma:
        t = int(toks[n])
        if 0 <= t < V and ul[n] * dpl[n][t] <= tpl[n][t]:
            n += 1
        else:
            break
    if n < gamma:
        r = [max(0.0, a - b) for a, b in zip(tpl[n], dpl[n])]
    else:
        r = list(tpl[gamma])
    if sum(r) <= 0:
        r = list(tpl[n])
    total = 0.0
    cdf = []
    for v in r:
        total += v
        cdf.append(total)
    target = ul[gamma] * total
    for j, c in enumerate(cdf):
        if c > target:
            return n, j
    return n, max((j for j, v in enumerate(r) if v > 0), default=V - 1)


def _rand_probs(shape, g, temp=1.0):
    return torch.softmax(torch.randn(*shape, generator=g) * 3 / temp, dim=-1)


def _one(tp, dp, toks, u):
    n, nxt = ops.verify_drafts(tp[None], None if dp is None else dp[None], toks[None], u[None])
    assert n.dtype == nxt.dtype == torch.int64 and n.shape == nxt.shape == (1,)
    return int(n[0]), int(nxt[0])


def test_verify_drafts_matches_loop():
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        gamma = trial % 6
        V = [5, 17, 100][trial % 3]
        tp = _rand_probs((gamma + 1, V), g)
        # draft close to target half the time so that acceptances happen
        dp = _rand_probs((gamma, V), g) if trial % 2 else 0.7 * tp[:gamma] + 0.3 * _rand_probs((gamma, V), g)
        toks = torch.multinomial(dp, 1, generator=g).squeeze(-1) if gamma else torch.zeros(0, dtype=torch.int64)
        u = torch.rand(gamma + 1, generator=g)
        assert _one(tp, dp, toks, u) == _verify_loop(tp, dp, toks, u), trial
        # deterministic draft: the same tokens with q = one-hot on them
        assert _one(tp, None, toks, u) == _verify_loop(tp, None, toks, u), trial


def test_verify_drafts_batched_equals_rows_and_one_hot_equals_none():
    g = torch.Generator().manual_seed(1)
    B, gamma, V = 64, 4, 50
    tp = _rand_probs((B, gamma + 1, V), g, temp=2.0)
    dp = 0.5 * tp[:, :gamma] + 0.5 * _rand_probs((B, gamma, V), g)
    toks = torch.multinomial(dp.reshape(-1, V), 1, generator=g).view(B, gamma)
    u = torch.rand(B, gamma + 1, generator=g)
    n, nxt = ops.verify_drafts(tp, dp, toks, u)
    assert [(int(a), int(b)) for a, b in zip(n, nxt)] == [_one(tp[i], dp[i], toks[i], u[i]) for i in range(B)]
    one_hot = torch.nn.functional.one_hot(toks, V).to(tp.dtype)
    n1, x1 = ops.verify_drafts(tp, one_hot, toks, u)
    n0, x0 = ops.verify_drafts(tp, None, toks, u)
    assert torch.equal(n1, n0) and torch.equal(x1, x0)
    assert 0 < int(n0.sum()) < B * gamma                    # both accepts and rejections happened
    # the dispatcher and the torch implementation are one rule (on CPU they are the same code)
    assert all(torch.equal(a, b) for a, b in zip(ops.verify_drafts_torch(tp, dp, toks, u), (n, nxt)))


def test_verify_drafts_edge_cases():
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    t = torch.tensor([2])
    # identical distributions: always accept, bonus from p_1 (inverse CDF with u=0.6 -> index 2)
    assert _one(p, q, t, torch.tensor([0.999, 0.6])) == (1, 2)
    # q puts zero mass on the drafted token -> accept
    q0 = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    assert _one(p, q0, t, torch.tensor([0.999, 0.0]))[0] == 1
    # certain rejection: p[t] = 0 -> resample from max(0, p - q) which is only token 3
    p2 = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.25] * 4])
    q2 = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    assert _one(p2, q2, t, torch.tensor([0.5, 0.99])) == (0, 3)
    # u -> 1: last token with positive residual mass
    assert _one(p2, q2, t, torch.tensor([0.5, 1.0])) == (0, 3)
    # deterministic draft rejected: the residual is p without the drafted token
    p3 = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.25] * 4])
    assert _one(p3, None, torch.tensor([2]), torch.tensor([0.6, 0.0])) == (0, 0)
    assert _one(p3, None, torch.tensor([2]), torch.tensor([0.4, 0.0])) == (1, 0)
    # a token outside the vocabulary is rejected, with and without draft probabilities
    assert _one(p, q, torch.tensor([7]), torch.tensor([0.0, 0.0]))[0] == 0
    assert _one(p, None, torch.tensor([-1]), torch.tensor([0.0, 0.99])) == (0, 3)
    # p = q = 0 on the drafted token: accepted
    p4 = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.25] * 4])
    q4 = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    assert _one(p4, q4, torch.tensor([0]), torch.tensor([0.5, 0.3])) == (1, 1)
    # a rejection with max(0, p - q) = 0 everywhere: the degenerate residual falls back to p_n
    assert _one(p4, q4 * 2, torch.tensor([1]), torch.tensor([0.9, 0.3])) == (0, 1)
    with pytest.raises(ValueError):
        ops.verify_drafts(p[None], q[None], t[None], torch.tensor([[0.5]]))


def test_verify_drafts_statistics():
    """Speculative sampling must reproduce the target distribution exactly.

    Emitted tokens: the first emitted token is t_0 if accepted else the resample;
    its distribution must be p_0.  Also P(accept t_0) = sum_x min(p_0, q_0).
    A wrong residual (e.g. resampling from p instead of max(0, p - q)) fails this.
    """
    g = torch.Generator().manual_seed(123)
    V, gamma, B = 6, 2, 40000
    p = torch.tensor([[0.05, 0.30, 0.10, 0.25, 0.20, 0.10],
                      [0.40, 0.10, 0.10, 0.10, 0.20, 0.10],
                      [0.10, 0.10, 0.20, 0.20, 0.20, 0.20]])
    q = torch.tensor([[0.30, 0.05, 0.25, 0.10, 0.20, 0.10],
                      [0.10, 0.40, 0.10, 0.20, 0.10, 0.10]])
    toks = torch.stack([torch.multinomial(q[i], B, replacement=True, generator=g) for i in range(gamma)], 1)
    u = torch.rand(B, gamma + 1, generator=g)
    n, nxt = ops.verify_drafts(p.expand(B, -1, -1), q.expand(B, -1, -1), toks, u)
    first = torch.where(n > 0, toks[:, 0], nxt)
    counts = torch.bincount(first, minlength=V).double()
    expected = p[0].double() * B
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 25.0, f"first-token distribution differs from p_0: chi2={chi2:.1f} (5 dof)"
    acc_rate = float((n > 0).double().mean())
    theory = float(torch.minimum(p[0], q[0]).sum())
    assert abs(acc_rate - theory) < 0.01, (acc_rate, theory)
    # second emitted token, given the first draft was accepted, must follow p_1
    sel = n > 0
    second = torch.where(n[sel] > 1, toks[sel, 1], nxt[sel])
    c2 = torch.bincount(second, minlength=V).double()
    e2 = p[1].double() * int(sel.sum())
    chi2b = float(((c2 - e2) ** 2 / e2).sum())
    assert chi2b < 25.0, f"second-token distribution differs from p_1: chi2={chi2b:.1f}"
