"""The graph-capturable decode step (engine/ops/cuda_graph.py) on a paged KV cache, in its torch form
on CPU: the same logits and K/V writes as on a slot cache holding the same K/V, with the blocks of
each sequence permuted across the cache and ragged lengths. The CUDA kernel's paged addressing
(kernels/cuda/decode_attention.cu) is checked on a GPU by bench/gpu_kernels.sh part 2."""
from __future__ import annotations

import pytest
import torch

import tests.tiny as tiny
from engine import ops
from engine.infer.model import Rows
from engine.infer.paged import PagedKVCache
from engine.ops import cuda_graph
from engine.ops.cuda_graph import cache_supported, decode_step, scratch_write

BS, NB, S = 64, 4, 4   # block size, blocks per slot, slots: capacity 256


@pytest.fixture(scope="module")
def lm():
    return tiny.tiny_model(3, vocab=48, layers=2, hidden=128)   # head_dim 32: int8 K groups fit


def _pair(m, seed=0, extra=5):
    """A slot cache with random K/V and a paged cache holding the same K/V in permuted blocks; the
    table entries past a sequence's blocks point at other sequences' blocks (masked, never read)."""
    g = torch.Generator().manual_seed(seed)
    cfg = m.cfg
    slot = m.new_cache(S, NB * BS)
    slot.k.copy_(torch.randn(slot.k.shape, generator=g))
    slot.v.copy_(torch.randn(slot.v.shape, generator=g))
    paged = PagedKVCache(cfg, S, NB * BS, S * NB + extra, BS, torch.float32, "cpu")
    assert paged.capacity == slot.capacity
    paged.k.copy_(torch.randn(paged.k.shape, generator=g) * 3)   # garbage in blocks no slot maps
    paged.v.copy_(torch.randn(paged.v.shape, generator=g) * 3)
    perm = torch.randperm(S * NB + extra, generator=g)[:S * NB].view(S, NB)
    paged.table.copy_(perm.to(torch.int32))
    for s in range(S):
        for i in range(NB):
            b = int(perm[s, i])
            paged.k[:, b] = slot.k[:, s, :, i * BS:(i + 1) * BS]
            paged.v[:, b] = slot.v[:, s, :, i * BS:(i + 1) * BS]
    return slot, paged


def _gather(paged, slot_idx):
    """A slot's K and V [layers, KV, cap, D] read through the table."""
    idx = paged.table[slot_idx].long()
    out = []
    for c in (paged.k, paged.v):
        x = c[:, idx]                          # [L, nb, KV, bs, D]
        out.append(x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1, x.shape[-1]))
    return out


def test_paged_decode_step_matches_slot_cache(lm):
    m = lm.model
    slot, paged = _pair(m)
    g = torch.Generator().manual_seed(1)
    # ragged: first position, last of a block, first of the next block, deep in the cache
    slots = torch.tensor([2, 0, 3, 1])
    pos = torch.tensor([0, 63, 64, 200])
    for step in range(3):   # later steps read what the earlier ones wrote
        toks = torch.randint(2, m.cfg.vocab_size, (4,), generator=g)
        with torch.inference_mode(), ops.using(fused=False, cuda_graph=False):
            want = decode_step(m, toks, slots, pos, slot, use_kernels=False)
            got = decode_step(m, toks, slots, pos, paged, use_kernels=False)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"step {step}")
        pos = pos + 1
    for s in range(S):
        k, v = _gather(paged, s)
        torch.testing.assert_close(k, slot.k[:, s], rtol=0, atol=0)
        torch.testing.assert_close(v, slot.v[:, s], rtol=0, atol=0)


def test_paged_decode_step_matches_forward_rows(lm):
    """On one paged cache: the graph step's torch form equals the model's own paged path."""
    m = lm.model
    _, c1 = _pair(m, seed=2)
    c2 = PagedKVCache(m.cfg, S, NB * BS, c1.num_blocks, BS, torch.float32, "cpu")
    for name in ("k", "v", "table"):
        getattr(c2, name).copy_(getattr(c1, name))
    toks = torch.tensor([5, 9, 11])
    slots, pos = torch.tensor([1, 3, 0]), torch.tensor([130, 0, 191])
    with torch.inference_mode(), ops.using(fused=False, cuda_graph=False):
        ref = m.forward_rows(toks, Rows.of([(int(s), int(p), 1) for s, p in zip(slots, pos)], "cpu"), c1)
        got = decode_step(m, toks, slots, pos, c2, use_kernels=False)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(c2.k, c1.k, rtol=0, atol=1e-5)
    torch.testing.assert_close(c2.v, c1.v, rtol=0, atol=1e-5)


def test_table_updates_are_read_in_place(lm):
    """The step reads the table tensor itself: remapping a block in place changes what it attends to."""
    m = lm.model
    slot, paged = _pair(m, seed=4)
    toks, slots, pos = torch.tensor([7]), torch.tensor([1]), torch.tensor([100])
    with torch.inference_mode():
        a = decode_step(m, toks, slots, pos, paged, use_kernels=False)
        old = int(paged.table[1, 0])
        paged.table[1, 0] = int(paged.table[2, 0])          # block 0 of slot 1 now slot 2's
        slot.k[:, 1, :, :BS] = slot.k[:, 2, :, :BS]
        slot.v[:, 1, :, :BS] = slot.v[:, 2, :, :BS]
        b = decode_step(m, toks, slots, pos, paged, use_kernels=False)
        want = decode_step(m, toks, slots, pos, slot, use_kernels=False)
    assert old != int(paged.table[1, 0])
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["slot", "paged", "paged_bad_entry"])
def test_scratch_write_restores_the_cache(lm, kind):
    """GraphedDecode's warm-up/capture target: written, then every tensor as before."""
    m = lm.model
    slot, paged = _pair(m, seed=5)
    cache = slot if kind == "slot" else paged
    if kind == "paged_bad_entry":
        paged.table[0, -1] = -1     # an unused entry that is not a block: made valid for the capture
    before = {n: getattr(cache, n).clone() for n in ("k", "v", "table") if hasattr(cache, n)}
    with torch.inference_mode():
        with scratch_write(cache) as (s, p):
            assert (s, p) == (0, cache.capacity - 1)
            decode_step(m, torch.tensor([3, 4]), torch.tensor([s, s]), torch.tensor([p, p]), cache,
                        use_kernels=False)
            changed = not (torch.equal(cache.k, before["k"]) and torch.equal(cache.v, before["v"]))
        assert changed
        for n, t in before.items():
            assert torch.equal(getattr(cache, n), t), n


def test_quantized_caches_are_declined(lm):
    m = lm.model
    q = PagedKVCache(m.cfg, 2, 128, 4, 64, torch.float32, "cpu", "int8")
    assert "int8" in cache_supported(m, q)
    with pytest.raises(ValueError, match="int8"):
        decode_step(m, torch.tensor([1]), torch.tensor([0]), torch.tensor([0]), q, use_kernels=False)
    half = PagedKVCache(m.cfg, 2, 128, 4, 64, torch.float32, "cpu", "bf16")
    assert "dtype" in cache_supported(m, half)
    assert cache_supported(m, PagedKVCache(m.cfg, 2, 128, 4, 64, torch.float32, "cpu")) is None
    assert cache_supported(m, m.new_cache(2, 128)) is None
    assert "cache_supported" in cuda_graph.__all__
