"""The paged KV cache: K/V in blocks of `block_size` positions, read and written through block tables.

Layout: k, v [layers, num_blocks, kv_heads, block_size, head_dim]; `table` [slots, max_blocks]
int32, row s the blocks of the sequence in slot s (engine/infer/blocks.py decides which). Position p
of slot s lives in block table[s, p // block_size] at offset p % block_size. The fused C++ step and
the CUDA decode kernel read the same table; the PyTorch path below gathers a sequence's blocks. On CPU
the tensors are stored head-major ([layers, kv_heads, num_blocks, ...] behind that view), so a sequence
whose blocks run in order (blocks.py takes them so) is read as one stream per head, as a slot is.

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

Windowed layers beside full ones (Gemma 2/3, Qwen2 with max_window_layers): with `window_blocks`, the
windowed layers keep their K/V in a second pool (wk, wv [windowed layers, window_blocks, ...], its own
table `wtable` and block manager), whose blocks behind the window go back (blocks.TwoPools); k, v and
`table` then hold the full layers. Each pool keeps its layers in layer order (`pool_of`).
"""
from __future__ import annotations

import torch
from torch import nn

from engine.common.errors import UserError
from engine.common.formulas import INT8_K_GROUP, kv_pair_bytes, sequence_blocks
from engine.common.vocab import KV_DTYPES
from engine.infer.blocks import BlockManager, TwoPools

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


def block_bytes(cfg, block_size: int, kv_name: str, layers: int | None = None) -> float:
    """Bytes one block holds across all layers (or `layers` of them): layers * kv_heads * block_size * (K + V
    bytes of a position)."""
    n = cfg.num_layers if layers is None else layers
    return n * cfg.num_kv_heads * block_size * kv_pair_bytes(cfg.head_dim, kv_name)


def windowed_layers(cfg) -> tuple[int, ...]:
    """The windowed layers of a model with full layers beside them (a second pool holds them), else ()."""
    w = tuple(i for i in range(cfg.num_layers) if cfg.window(i))
    return w if len(w) < cfg.num_layers else ()


def window_reach(cfg, second_pool: bool = False) -> int:
    """How far back the layers whose blocks can go back read keys (engine/infer/blocks.py trim): every layer
    when all attend within a sliding window, or with `second_pool` the windowed layers beside full ones (the
    largest window); else 0."""
    windows = [cfg.window(i) for i in range(cfg.num_layers)]
    return max(windows) if all(windows) or second_pool else 0


def held_blocks(cfg, positions: int, block_size: int, reach: int, step_rows: int) -> tuple[int, int]:
    """(blocks, windowed layers' blocks in a second pool) one sequence of `positions` holds at most when the
    blocks `reach` positions behind its next step go back (window_reach; 0: none do): every layer's window
    (Mistral), or every position in the full layers' pool and the window in the other (Gemma), or all (no
    window: (all, 0)). engine.common.formulas.sequence_blocks counts them."""
    windowed = sequence_blocks(positions, block_size, reach, step_rows)
    if reach and windowed_layers(cfg):
        return sequence_blocks(positions, block_size), windowed
    return windowed, 0


def windows_pay(cfg, positions: int, step_rows: int, block_size: int = BLOCK_SIZE) -> bool:
    """Whether a paged cache that gives back the blocks behind a sliding window holds fewer bytes for a sequence
    of `positions` than a slot of that many positions (a static batch takes it then: engine/infer/generate.py)."""
    reach = window_reach(cfg, second_pool=True)
    if not reach:
        return False
    one, window_one = held_blocks(cfg, positions, block_size, reach, step_rows)
    return sequence_bytes(cfg, block_size, "fp32", one, window_one) < positions * block_bytes(cfg, 1, "fp32")


def sequence_bytes(cfg, block_size: int, kv_name: str, one: int, window_one: int = 0) -> float:
    """The K/V bytes of one sequence holding `one` blocks, and `window_one` more in a second pool for its windowed
    layers (beside full ones) when given."""
    wl = len(windowed_layers(cfg)) if window_one else 0
    return one * block_bytes(cfg, block_size, kv_name, cfg.num_layers - wl) + \
        (window_one * block_bytes(cfg, block_size, kv_name, wl) if wl else 0.0)


def blocks_in_budget(cfg, block_size: int, kv_name: str, gib: float, max_model_len: int, one: int = 0,
                     window_one: int = 0) -> tuple[int, int]:
    """(blocks, windowed layers' blocks) a budget of `gib` GiB holds: with `window_one` (the blocks one sequence
    holds in a second pool for the windowed layers, beside full ones) the budget is shared between the pools as
    one sequence's blocks are, else (n, 0). Refused when it cannot hold one sequence of max_model_len (`one`
    blocks when given: engine.common.formulas.sequence_blocks)."""
    full = sequence_blocks(max_model_len, block_size)
    one = one or full
    wl = len(windowed_layers(cfg)) if window_one else 0
    per = block_bytes(cfg, block_size, kv_name, cfg.num_layers - wl)
    wper = block_bytes(cfg, block_size, kv_name, wl) if wl else 0.0
    need = sequence_bytes(cfg, block_size, kv_name, one, window_one)
    n = int(gib * 2 ** 30 * (one * per / need) // per)
    wn = int(gib * 2 ** 30 * (window_one * wper / need) // wper) if wl else 0
    if n < one or wn < window_one:
        fits = n * block_size
        held = f"{one} blocks, {need / 2 ** 30:.3f} GiB" + (
            f": its {wl} windowed layers hold their window and one step's rows in {window_one} blocks more" if wl
            else "" if one == full else ": every layer is windowed, so a sequence holds its window and one step's rows")
        raise UserError(f"a KV-cache budget of {gib:g} GiB holds {n} blocks of {block_size} positions at {kv_name} "
                        f"({fits} positions), less than one sequence of max_model_len {max_model_len} ({held})",
                        f"raise --kv-cache-gib to at least {need / 2 ** 30:.3f}, or lower --max-model-len to "
                        f"{fits} or less" if fits and one == full and not wl
                        else f"raise --kv-cache-gib to at least {need / 2 ** 30:.3f}")
    return n, wn


class PagedKVCache(nn.Module):
    """K/V of `num_blocks` blocks, and the block manager that hands them to `slots` sequences."""

    paged = True

    def __init__(self, cfg, slots: int, max_model_len: int, num_blocks: int, block_size: int, compute_dtype,
                 device, kv_dtype: str = "auto", prefix_caching: bool = False, window_blocks: int = 0):
        super().__init__()
        self.kv_name = kv_dtype_name(kv_dtype, compute_dtype)
        self.compute_dtype, self.block_size = compute_dtype, block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.slots, self.capacity, self.num_blocks = slots, self.max_blocks * block_size, num_blocks
        self.quantized = self.kv_name == "int8"
        if self.quantized and cfg.head_dim % INT8_K_GROUP:
            raise UserError(f"an int8 KV cache scales keys per {INT8_K_GROUP} values; head_dim {cfg.head_dim} is not a "
                            "multiple", "use --kv-dtype auto for this model")
        self.groups = {"k": -(-cfg.head_dim // INT8_K_GROUP), "v": 1}  # int8 scales per K / V vector
        windowed = windowed_layers(cfg) if window_blocks else ()
        if window_blocks and not windowed:
            raise ValueError("a second pool is for a model with windowed layers beside full ones")
        self.window_blocks = window_blocks
        full = [i for i in range(cfg.num_layers) if i not in windowed]
        self.pool_of = {layer: (0, j) for j, layer in enumerate(full)}  # layer -> (pool, its index there)
        self.pool_of |= {layer: (1, j) for j, layer in enumerate(windowed)}
        self._pool("", cfg, len(full), num_blocks, device)
        managers = [BlockManager(num_blocks, block_size, prefix_caching)]
        if windowed:
            self._pool("w", cfg, len(windowed), window_blocks, device)
            managers.append(BlockManager(window_blocks, block_size, prefix_caching))
        self.blocks = TwoPools(*managers) if windowed else managers[0]
        self._where: dict = {}  # pool -> (rows, block per row, offset per row) of the current forward

    def _pool(self, p: str, cfg, layers: int, blocks: int, device) -> None:
        """A pool's K/V [layers, blocks, KV, block_size, D] (and int8 scales), and its block table. On CPU that is a
        view of [layers, KV, blocks, block_size, D]: one head's blocks b, b + 1 are then one run of memory, which the
        fused step's attention reads as fast as a slot's (a block-major pool 1.17x slower: BENCHMARKS.md, session
        34). CUDA's decode kernel reads the block-major layout itself."""
        head_major = torch.device(device).type == "cpu"

        def zeros(last: int, dt) -> torch.Tensor:
            if head_major:
                return torch.zeros((layers, cfg.num_kv_heads, blocks, self.block_size, last), dtype=dt,
                                   device=device).transpose(1, 2)
            return torch.zeros((layers, blocks, cfg.num_kv_heads, self.block_size, last), dtype=dt, device=device)

        dt = _TORCH[self.kv_name]
        self.register_buffer(f"{p}k", zeros(cfg.head_dim, dt), persistent=False)
        self.register_buffer(f"{p}v", zeros(cfg.head_dim, dt), persistent=False)
        if self.quantized:  # fp16 scales per (layer, block, kv head, position, group), laid out as the values
            for n in ("k", "v"):
                self.register_buffer(f"{p}{n}_scale", zeros(self.groups[n], torch.float16), persistent=False)
        setattr(self, f"{p}table", torch.zeros((self.slots, self.max_blocks), dtype=torch.int32, device=device))

    def _tensors(self, pool: int) -> tuple:
        """(k, v, k scales, v scales, table) of pool 0 (the full layers, or all) or 1 (the windowed layers)."""
        p = "w" if pool else ""
        return tuple(getattr(self, f"{p}{n}", None) for n in ("k", "v", "k_scale", "v_scale", "table"))

    def block_nbytes(self, pool: int = 0) -> int:
        """Bytes one block of a pool holds across its layers (int8 scales included)."""
        return sum(t[:, 0].numel() * t.element_size() for t in self._tensors(pool)[:4] if t is not None)

    def held_nbytes(self, slot: int) -> int:
        """The K/V bytes the slot's sequence holds now: its blocks in each pool."""
        b = self.blocks
        if not self.two_pools:
            return b.held(slot) * self.block_nbytes(0)
        return b.full.held(slot) * self.block_nbytes(0) + b.window.held(slot) * self.block_nbytes(1)

    @property
    def two_pools(self) -> bool:
        return bool(self.window_blocks)

    def nbytes(self) -> int:
        n = 0
        for pool in range(1 + self.two_pools):
            k, v, ks, vs, _ = self._tensors(pool)
            n += k.numel() * k.element_size() * 2
            if self.quantized:
                n += (ks.numel() + vs.numel()) * 2
        return n

    def sync(self, slot: int) -> None:
        """Copy the slot's block lists into the tables the kernels read."""
        pools = [(self.blocks.full, self.table), (self.blocks.window, self.wtable)] if self.two_pools \
            else [(self.blocks, self.table)]
        for manager, table in pools:
            blocks = manager.tables.get(slot, [])
            if blocks:
                table[slot, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)

    # ------------------------------------------------------------ the PyTorch path

    def _rows_where(self, pool: int, rows):
        where = self._where.get(pool)
        if where is None or where[0] is not rows:
            pos = rows.pos
            blk = self._tensors(pool)[4][rows.slot, pos // self.block_size].long()
            if bool((blk < 0).any()):  # as the fused step checks: no row writes into a block that went back
                raise RuntimeError("a row's block went back behind the window (RELEASED): it was not reserved")
            where = self._where[pool] = (rows, blk, pos % self.block_size)
        return where[1], where[2]

    def write(self, layer: int, rows, k: torch.Tensor, v: torch.Tensor) -> None:
        """Row r's K/V [N, KV, D] at its slot's block and offset."""
        pool, j = self.pool_of[layer]
        blk, off = self._rows_where(pool, rows)
        kc, vc, ks, vs, _ = self._tensors(pool)
        for cache, scale, g, x in ((kc, ks, "k", k), (vc, vs, "v", v)):
            if self.quantized:
                q, s = quantize_int8(x, self.groups[g])
                cache[j, blk, :, off] = q
                scale[j, blk, :, off] = s
            else:
                cache[j, blk, :, off] = x.to(cache.dtype)

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        """q [N, H, D] as attention over this cache reads it: at int8, quantized per 32 values as the keys are,
        so q.k is the fused step's integer dot product (kernels/cpu/fused_simd_body.h scores_q8)."""
        if not self.quantized:
            return q
        qq, s = quantize_int8(q, self.groups["k"])
        return dequantize_int8(qq, s).to(q.dtype)

    def read(self, layer: int, slot: int, k0: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot's K and V at positions [k0, end): [KV, end - k0, D] in the compute dtype: each head's blocks
        gathered straight into that layout, or sliced where they run in order (on CPU's head-major pool a view,
        as a slot's keys are)."""
        bs = self.block_size
        b0, b1 = k0 // bs, -(-end // bs)
        pool, j = self.pool_of[layer]
        kc, vc, ks, vs, table = self._tensors(pool)
        idx = table[slot, b0:b1].long()
        pick = slice(int(idx[0]), int(idx[0]) + b1 - b0) if bool((idx.diff() == 1).all()) else idx
        out = []
        for cache, scale in ((kc, ks), (vc, vs)):
            x = cache[j].transpose(0, 1)[:, pick]  # [KV, nb, bs, D]
            if self.quantized:
                x = dequantize_int8(x, scale[j].transpose(0, 1)[:, pick])
            out.append(x.to(self.compute_dtype).reshape(x.shape[0], -1, x.shape[-1])[:, k0 - b0 * bs:end - b0 * bs])
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
