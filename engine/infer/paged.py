"""The paged KV cache: K/V in blocks of `block_size` positions, read and written through block tables.

Layout: k, v [layers, num_blocks, kv_heads, block_size, head_dim]; `table` [slots, max_blocks]
int32, row s the blocks of the sequence in slot s (engine/infer/blocks.py decides which). Position p
of slot s lives in block table[s, p // block_size] at offset p % block_size. The fused C++ step and
the CUDA decode kernel read the same table; the PyTorch path below gathers a sequence's blocks.

KV precision (`kv_dtype`, independent of the weights'):
- the compute dtype ("auto"), or fp32/bf16/fp16;
- int8: symmetric, fp16 scales per head and per block of values, as llama.cpp's q8_0 blocks: a K
  vector (one token, one KV head) has one scale per 32 values (keys have outlier channels), a V
  vector one. The scales belong to one token: a block written a token at a time never needs
  rescaling, and a value never depends on what was written after it. Queries are quantized the way
  keys are (`queries`), so q.k is an integer dot product per 32 values, as llama.cpp's q8_0 x q8_0;
- fp8 (e4m3): a cast with a per-tensor scale of 1, as vLLM stores it without calibrated scales;
  CUDA only (a GPU with fp8: compute capability 8.9 or newer).
Bytes per block come from engine.common.formulas.kv_pair_bytes, the planner's formula.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.common.errors import UserError
from engine.common.formulas import INT8_K_GROUP, kv_pair_bytes, sequence_blocks
from engine.common.vocab import KV_DTYPES
from engine.infer.blocks import BlockManager

BLOCK_SIZE = 64  # positions per block by default: one key tile of the fused attention
_TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8,
          "fp8": torch.float8_e4m3fn}
_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
INT8_MAX = 127.0


def kv_dtype_name(kv_dtype: str, compute_dtype: torch.dtype) -> str:
    """The stored precision's name: 'auto' is the compute dtype's."""
    return _NAME[compute_dtype] if kv_dtype == "auto" else kv_dtype


def check_kv_dtype(kv_dtype: str, device) -> str:
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"unknown KV-cache dtype '{kv_dtype}'", f"use one of: {', '.join(KV_DTYPES)}")
    if kv_dtype == "fp8":
        dev = torch.device(device)
        if dev.type != "cuda" or torch.cuda.get_device_capability(dev) < (8, 9):
            raise UserError("an fp8 KV cache needs a GPU with fp8 (compute capability 8.9 or newer: Ada, Hopper)",
                            "use --kv-dtype int8 here (per-vector scales, on CPU and GPU)")
    return kv_dtype


def block_bytes(cfg, block_size: int, kv_name: str) -> float:
    """Bytes one block holds across all layers: layers * kv_heads * block_size * (K + V bytes of a position)."""
    return cfg.num_layers * cfg.num_kv_heads * block_size * kv_pair_bytes(cfg.head_dim, kv_name)


def window_reach(cfg) -> int:
    """How far back any layer reads keys when every layer attends within a sliding window (the largest
    window), else 0: then a sequence's blocks behind it can go back (engine/infer/blocks.py trim)."""
    windows = [cfg.window(i) for i in range(cfg.num_layers)]
    return max(windows) if all(windows) else 0


def blocks_in_budget(cfg, block_size: int, kv_name: str, gib: float, max_model_len: int, one: int = 0) -> int:
    """The blocks a budget of `gib` GiB holds; refused when it cannot hold one sequence of max_model_len
    (`one` blocks when given: engine.common.formulas.sequence_blocks)."""
    per = block_bytes(cfg, block_size, kv_name)
    n = int(gib * 2 ** 30 // per)
    full = sequence_blocks(max_model_len, block_size)
    one = one or full
    if n < one:
        fits = n * block_size
        held = f"{one} blocks, {one * per / 2 ** 30:.3f} GiB" + (
            "" if one == full else ": every layer is windowed, so a sequence holds its window and one step's rows")
        raise UserError(f"a KV-cache budget of {gib:g} GiB holds {n} blocks of {block_size} positions at {kv_name} "
                        f"({fits} positions), less than one sequence of max_model_len {max_model_len} ({held})",
                        f"raise --kv-cache-gib to at least {one * per / 2 ** 30:.3f}, or lower --max-model-len to "
                        f"{fits} or less" if fits and one == full
                        else f"raise --kv-cache-gib to at least {one * per / 2 ** 30:.3f}")
    return n


class PagedKVCache(nn.Module):
    """K/V of `num_blocks` blocks, and the block manager that hands them to `slots` sequences."""

    paged = True

    def __init__(self, cfg, slots: int, max_model_len: int, num_blocks: int, block_size: int, compute_dtype,
                 device, kv_dtype: str = "auto", prefix_caching: bool = False):
        super().__init__()
        self.kv_name = kv_dtype_name(kv_dtype, compute_dtype)
        self.compute_dtype, self.block_size = compute_dtype, block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.slots, self.capacity, self.num_blocks = slots, self.max_blocks * block_size, num_blocks
        shape = (cfg.num_layers, num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim)
        dt = _TORCH[self.kv_name]
        self.register_buffer("k", torch.zeros(shape, dtype=dt, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dt, device=device), persistent=False)
        self.quantized = self.kv_name == "int8"
        if self.quantized and cfg.head_dim % INT8_K_GROUP:
            raise UserError(f"an int8 KV cache scales keys per {INT8_K_GROUP} values; head_dim {cfg.head_dim} is not a "
                            "multiple", "use --kv-dtype auto for this model")
        self.groups = {"k": -(-cfg.head_dim // INT8_K_GROUP), "v": 1}  # int8 scales per K / V vector
        if self.quantized:  # fp16 scales per (layer, block, kv head, position, group)
            for n in ("k", "v"):
                self.register_buffer(f"{n}_scale", torch.zeros(shape[:-1] + (self.groups[n],), dtype=torch.float16,
                                                               device=device), persistent=False)
        self.table = torch.zeros((slots, self.max_blocks), dtype=torch.int32, device=device)
        self.blocks = BlockManager(num_blocks, block_size, prefix_caching)
        self._where: tuple | None = None  # (rows, block per row, offset per row) of the current forward

    def nbytes(self) -> int:
        n = self.k.numel() * self.k.element_size() * 2
        if self.quantized:
            n += (self.k_scale.numel() + self.v_scale.numel()) * 2
        return n

    def sync(self, slot: int) -> None:
        """Copy the slot's block list into the table the kernels read."""
        blocks = self.blocks.tables.get(slot, [])
        if blocks:
            self.table[slot, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)

    # ------------------------------------------------------------ the PyTorch path

    def _rows_where(self, rows):
        if self._where is None or self._where[0] is not rows:
            pos = rows.pos
            blk = self.table[rows.slot, pos // self.block_size].long()
            self._where = (rows, blk, pos % self.block_size)
        return self._where[1], self._where[2]

    def write(self, layer: int, rows, k: torch.Tensor, v: torch.Tensor) -> None:
        """Row r's K/V [N, KV, D] at its slot's block and offset."""
        blk, off = self._rows_where(rows)
        for cache, scale, x in ((self.k, "k_scale", k), (self.v, "v_scale", v)):
            if self.quantized:
                q, s = quantize_int8(x, self.groups[scale[0]])
                cache[layer, blk, :, off] = q
                getattr(self, scale)[layer, blk, :, off] = s
            else:
                cache[layer, blk, :, off] = x.to(cache.dtype)

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        """q [N, H, D] as attention over this cache reads it: at int8, quantized per 32 values as the keys are,
        so q.k is the fused step's integer dot product (kernels/cpu/fused_simd_body.h scores_q8)."""
        if not self.quantized:
            return q
        qq, s = quantize_int8(q, self.groups["k"])
        return dequantize_int8(qq, s).to(q.dtype)

    def read(self, layer: int, slot: int, k0: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot's K and V at positions [k0, end): [KV, end - k0, D] in the compute dtype."""
        bs = self.block_size
        b0, b1 = k0 // bs, -(-end // bs)
        idx = self.table[slot, b0:b1].long()
        out = []
        for cache, scale in ((self.k, "k_scale"), (self.v, "v_scale")):
            x = cache[layer, idx]  # [nb, KV, bs, D]
            if self.quantized:
                x = dequantize_int8(x, getattr(self, scale)[layer, idx])
            x = x.to(self.compute_dtype).transpose(0, 1).reshape(x.shape[1], -1, x.shape[-1])
            out.append(x[:, k0 - b0 * bs:end - b0 * bs])
        return out[0], out[1]


def one_sequence_cache(model, positions: int, kv_dtype: str) -> PagedKVCache:
    """A paged cache holding exactly one sequence (slot 0) of `positions` positions at kv_dtype: what a
    quality measurement of a KV precision runs on."""
    bs = BLOCK_SIZE
    n = sequence_blocks(positions, bs)
    cache = PagedKVCache(model.cfg, 1, positions, n, bs, model.compute_dtype, model.device, kv_dtype)
    cache.blocks.admit(0, [], positions, 0)
    cache.sync(0)
    return cache


def quantize_int8(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> int8 values [..., D] and fp16 scales [..., groups] (amax / 127 of each group of
    D / groups values, rounded to fp16 first, so the values are quantized with the scale that is stored)."""
    xf = x.float().unflatten(-1, (groups, -1))
    s = (xf.abs().amax(-1) / INT8_MAX).to(torch.float16)
    sf = s.float()[..., None]
    q = torch.where(sf > 0, xf / sf.clamp_min(1e-30), torch.zeros_like(xf))
    return q.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8).flatten(-2), s


def dequantize_int8(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """int8 values [..., D] and fp16 scales [..., groups] -> fp32 [..., D]."""
    return (q.float().unflatten(-1, (s.shape[-1], -1)) * s.float()[..., None]).flatten(-2)
