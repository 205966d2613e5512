"""The GPU decode step as one CUDA graph (torch.cuda.CUDAGraph; no torch.compile, no Triton).

``decode_step(model, tokens, slots, pos, cache)`` is one decode row per sequence (B sequences, each
its own cache slot and position) written so that nothing in it depends on host values: RoPE from
the device positions, the K/V write by index tensors, attention over each sequence's own length
(kernels/cuda/decode_attention.cu, lengths read on the device), residual + RMSNorm fused
(kernels/cuda/rmsnorm_residual.cu), the projections through the model's own layers (our int8/int4
CUDA kernels, or torch). Without the CUDA extension (or on CPU) it runs the same sequence in torch
(a masked SDPA, the model's RMSNorm), which the CPU tests check against ``forward_rows``.

``GraphedDecode(model, cache, B)`` captures it once for B rows and replays it per step:
``fused_forward_rows`` uses it on CUDA when ``KernelConfig.cuda_graph`` is on (``SCL_CUDA_GRAPH=1``;
off by default until bench/gpu_kernels.sh has checked it on a GPU) and every sequence of the step
has one row (plain decode). Prefill and verification steps run the model's eager path.

Both KV caches work: the slot cache (engine/infer/model.py KVCache, k/v [layers, slots, KV, cap, D])
and the paged cache (engine/infer/paged.py, k/v [layers, blocks, KV, block_size, D] and the int32
block table [slots, blocks per slot] on the device). The paged step finds each row's block through
the table on the device (the K/V write by index tensors, the kernel reads the table itself), so a
captured graph sees the scheduler's in-place table updates. int8 / fp8 caches (quantized K/V) are
not covered: ``cache_supported`` says why.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F

from engine.ops import build as _build

__all__ = ["decode_step", "GraphedDecode", "graphed_forward", "graph_supported", "cache_supported"]

_graphs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # cache -> {(id(model), B): GraphedDecode}


def _rope(x, cos, sin):
    """The model's rotary embedding (engine/infer/model.py apply_rope: rot = [-x2, x1])."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos.to(x.dtype)) + (rot * sin.to(x.dtype))


def _paged(cache) -> bool:
    return bool(getattr(cache, "paged", False))


def _attention(ext, q, k, v, slots, lens, scale, table=None):
    """q [B, H, D]; k/v [slots, KV, cap, D]: row b over positions < lens[b] of slot slots[b].
    With table (int32 [slots, blocks per slot]): k/v [blocks, KV, block_size, D], a paged cache."""
    if ext is not None and q.is_cuda:
        return ext.decode_attention(q.contiguous(), k, v, slots, lens, scale,
                                    torch.cuda.current_stream(q.device).cuda_stream, None, table)
    if table is None:
        ks, vs = k[slots], v[slots]                                # [B, KV, cap, D]
    else:                                                          # gather each row's blocks in order
        idx = table[slots].long()                                  # [B, nb]
        B, nb = idx.shape
        KV, bs, D = k.shape[1], k.shape[2], k.shape[3]
        ks = k[idx].transpose(1, 2).reshape(B, KV, nb * bs, D)     # [B, nb, KV, bs, D] -> [B, KV, cap, D]
        vs = v[idx].transpose(1, 2).reshape(B, KV, nb * bs, D)
    keep = torch.arange(ks.shape[2], device=q.device)[None] < lens[:, None]   # [B, cap]
    o = F.scaled_dot_product_attention(q[:, :, None], ks.to(q.dtype), vs.to(q.dtype),
                                       attn_mask=keep[:, None, None], scale=scale, enable_gqa=True)
    return o[:, :, 0]


def _norm_residual(ext, x, res, norm):
    """(res + x, rmsnorm(res + x)) with the model's RMSNorm semantics; x None: (res, rmsnorm(res))."""
    if ext is not None and res.is_cuda:
        stream = torch.cuda.current_stream(res.device).cuda_stream
        h = ext.rmsnorm_residual(x, res, norm.weight, float(norm.eps), stream)   # res updated in place
        return res, h
    if x is not None:
        res = res + x
    return res, norm(res)


def decode_step(model, tokens: torch.Tensor, slots: torch.Tensor, pos: torch.Tensor, cache,
                use_kernels: bool = True) -> torch.Tensor:
    """fp32 logits [B, V] for one decode row per sequence; writes each row's K/V at (slot, pos)
    (a paged cache: at block table[slot, pos // block_size], offset pos % block_size)."""
    if getattr(cache, "quantized", False):
        raise ValueError("decode_step: " + cache_supported(model, cache))
    cfg = model.cfg
    H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ext = _build.cuda_extension() if (use_kernels and tokens.is_cuda) else None
    dt = model.model.norm.weight.dtype
    B = tokens.shape[0]
    res = model.model.embed_tokens(tokens).to(dt)
    inv = cfg.ropes[0].inv_freq().to(tokens.device)
    freqs = pos.float()[:, None] * inv[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    lens = pos + 1
    if _paged(cache):   # where each row's K/V goes: (block, offset), found on the device
        table = cache.table
        bs = cache.block_size
        where = (table[slots, pos // bs].long(), pos % bs)
    else:
        table, where = None, (slots, pos)
    layers = model.model.layers
    res, h = _norm_residual(ext, None, res, layers[0].input_layernorm)
    for i, blk in enumerate(layers):
        a, mlp = blk.self_attn, blk.mlp
        if a.qkv_proj is not None:
            q, k, v = a.qkv_proj(h).split([H * D, KV * D, KV * D], dim=-1)
        else:
            q, k, v = a.q_proj(h), a.k_proj(h), a.v_proj(h)
        q = _rope(q.reshape(B, H, D), cos, sin)
        k = _rope(k.reshape(B, KV, D), cos, sin)
        ck, cv = cache.k[i], cache.v[i]
        ck[where[0], :, where[1]] = k.to(ck.dtype)
        cv[where[0], :, where[1]] = v.reshape(B, KV, D).to(cv.dtype)
        o = _attention(ext, q, ck, cv, slots, lens, D ** -0.5, table)
        res, h = _norm_residual(ext, a.o_proj(o.reshape(B, H * D)), res, blk.post_attention_layernorm)
        if mlp.gate_up_proj is not None:
            g, u = mlp.gate_up_proj(h).chunk(2, dim=-1)
        else:
            g, u = mlp.gate_proj(h), mlp.up_proj(h)
        nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.model.norm
        res, h = _norm_residual(ext, mlp.down_proj(F.silu(g) * u), res, nxt)
    return model.lm_head(h).float()


def graph_supported(model) -> str | None:
    """None if the decode step of this model can be captured, else why not."""
    for mod in model.modules():
        if type(mod).__module__.startswith("bitsandbytes"):
            return "bitsandbytes layers are not captured in CUDA graphs"
    beyond = getattr(model.cfg, "features", lambda: ())()
    if beyond:
        return (f"{getattr(model.cfg, 'family', 'model')} uses {', '.join(beyond)} "
                "(the graphed step is plain Llama/Qwen2)")
    if model.cfg.head_dim not in (64, 128) or model.cfg.num_heads // model.cfg.num_kv_heads > 8:
        return "head_dim or GQA group not covered by the decode-attention kernel"
    return None


def cache_supported(model, cache) -> str | None:
    """None if decode_step (and its graph) can use this KV cache, else why not: int8 / fp8 K/V
    (engine/infer/paged.py kv_dtype) are not read by the decode-attention kernel."""
    if getattr(cache, "quantized", False):
        return "int8 KV cache (the graphed step reads K/V in the compute dtype)"
    if getattr(cache, "two_pools", False):
        return "windowed layers in a KV pool of their own (the graphed step reads one pool)"
    want = model.model.norm.weight.dtype
    if cache.k.dtype != want:
        return (f"KV cache dtype {str(cache.k.dtype).replace('torch.', '')} is not the compute dtype "
                f"{str(want).replace('torch.', '')} (fp8 / other KV dtypes are not graphed)")
    if _paged(cache) and (cache.table.dtype != torch.int32 or cache.table.device != cache.k.device):
        return "paged KV cache whose block table is not int32 on the cache's device"
    return None


@contextlib.contextmanager
def scratch_write(cache):
    """(slot 0, last position) for a warm-up / capture to write into, restored on exit: yields
    (slot, pos). A slot cache: its K/V there are kept and put back. A paged cache: the block
    table[0, last] points to (made a valid block id if it is not one) has its last row kept and put
    back, and the table entry too. Nothing else may run on the cache meanwhile."""
    pos = cache.capacity - 1
    if _paged(cache):
        nblocks = cache.k.shape[1]
        keep_entry = cache.table[0, -1].clone()
        blk = int(keep_entry)
        if not 0 <= blk < nblocks:
            blk = 0
            cache.table[0, -1] = 0
        at = (slice(None), blk, slice(None), cache.block_size - 1)
    else:
        keep_entry, at = None, (slice(None), 0, slice(None), pos)
    keep_k, keep_v = cache.k[at].clone(), cache.v[at].clone()
    try:
        yield 0, pos
    finally:
        cache.k[at] = keep_k
        cache.v[at] = keep_v
        if keep_entry is not None:
            cache.table[0, -1] = keep_entry


class GraphedDecode:
    """decode_step for B rows captured once; each call copies the inputs in and replays.

    The graph holds the cache's K/V and (paged) block-table tensors by address: the table is
    updated in place by the scheduler (never reallocated), and the kernel reads it on every replay."""

    def __init__(self, model, cache, batch: int):
        why = cache_supported(model, cache)
        if why is not None:
            raise ValueError(f"GraphedDecode: {why}")
        dev = cache.k.device
        self.tokens = torch.zeros(batch, dtype=torch.long, device=dev)
        # warm-up and capture write K/V at (slot 0, last position): keep and restore what is there
        with scratch_write(cache) as (slot, last):
            self.slots = torch.full((batch,), slot, dtype=torch.long, device=dev)
            self.pos = torch.full((batch,), last, dtype=torch.long, device=dev)
            side = torch.cuda.Stream(device=dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):
                    decode_step(model, self.tokens, self.slots, self.pos, cache)
            torch.cuda.current_stream(dev).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = decode_step(model, self.tokens, self.slots, self.pos, cache)
        self.batch = batch

    def __call__(self, tokens, slots, pos) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.slots.copy_(slots)
        self.pos.copy_(pos)
        self.graph.replay()
        return self.logits.clone()


def graphed_forward(model, tokens, rows, cache, logits_at=None):
    """Logits of a plain decode step (one row per sequence) from the captured graph for its size."""
    per_cache = _graphs.setdefault(cache, {})
    key = (id(model), rows.n)
    g = per_cache.get(key)
    if g is None:
        g = per_cache[key] = GraphedDecode(model, cache, rows.n)
    logits = g(tokens, rows.slot, rows.pos)
    return logits if logits_at is None else logits[logits_at]
