"""The block manager of the paged KV cache: which blocks each sequence holds, and the prefix cache.

The cache is `num_blocks` blocks of `block_size` positions. A sequence (its slot) holds a block
table: block i holds its positions [i * block_size, (i + 1) * block_size). Blocks are taken as the
sequence grows and given back when it ends or is preempted.

Automatic prefix caching (vLLM's): a block whose positions are all committed tokens is full; its
key is a hash of its tokens and of the key of the block before it, so equal keys mean equal
prefixes, hence equal K/V (one model, one cache). A new sequence takes every cached block its
prompt starts with and prefills only the rest. A block is shared by reference count; one no
sequence holds stays cached, and is evicted least recently freed first when a block is needed.
Sliding windows: when every layer of the model attends within a window, a sequence's blocks wholly
behind its window are given back as it moves on (`trim`); their table entries become RELEASED, which
no kernel reads (the fused step and the PyTorch path read keys from the window's start on). A model
with full layers beside windowed ones (Gemma 2/3, Qwen2 with max_window_layers) keeps its windowed
layers in blocks of their own (`TwoPools`): those go back behind the window, the full layers' stay.
Which free block a sequence takes: the one after its last, when free, so its blocks run in order through memory
(a head's consecutive blocks are one run on CPU: paged.py; attention reads a run as fast as a slot, blocks out of
order 1.34x slower); else the first of the longest free run, or its middle when a sequence could grow into its
first, so sequences growing side by side keep runs of their own.
Pure Python: the tensors live in engine/infer/paged.py.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

_ROOT = b"scl-kv-prefix"
RELEASED = -1  # a table entry behind the window: its block went back


def block_key(parent: bytes, tokens: list[int]) -> bytes:
    """The key of a full block: sha256 of its parent's key and its tokens (collisions: never in practice)."""
    h = hashlib.sha256(parent)
    h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in tokens))
    return h.digest()


@dataclass
class PrefixStats:
    """Counters in tokens, as vLLM's vllm:prefix_cache_queries / vllm:prefix_cache_hits count them."""

    queries: int = 0  # prompt tokens looked up at admission
    hits: int = 0  # of those, tokens found cached (not prefilled)

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries else None


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool):
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.free = np.ones(num_blocks, dtype=bool)  # blocks holding nothing worth keeping
        self.n_free = num_blocks
        self.ref = [0] * num_blocks
        self.key: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # key -> block
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks no sequence holds, first evicted first
        self.tables: dict[int, list[int]] = {}  # slot -> its blocks
        self.chain: dict[int, list[bytes]] = {}  # slot -> keys of its full blocks, in order
        self.trimmed: dict[int, int] = {}  # slot -> its leading entries given back behind a window
        self.stats = PrefixStats()
        self.evictions = 0
        self.peak = 0  # the most blocks held at once since built (or reset)

    def reset(self) -> None:
        """Empty, as built: every block free, nothing cached, counters zero (no sequence may hold a block)."""
        assert not any(self.tables.values()), "reset with blocks held"
        self.__init__(self.num_blocks, self.block_size, self.prefix_caching)

    # ------------------------------------------------------------ capacity

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def available(self) -> int:
        """Blocks a sequence could take now: the free ones and the cached ones nobody holds."""
        return self.n_free + len(self.lru)

    def used(self) -> int:
        """Blocks some sequence holds (vLLM's KV-cache usage counts these)."""
        return self.num_blocks - self.available()

    def held(self, slot: int) -> int:
        """Blocks the slot's sequence holds now (its entries behind a window went back)."""
        return len(self.tables.get(slot, [])) - self.trimmed.get(slot, 0)

    def entries(self, slot: int) -> int:
        """The slot's table entries (held or given back): when they change, the kernels' table must follow."""
        return len(self.tables.get(slot, []))

    # ------------------------------------------------------------ sequences

    def match(self, tokens: list[int], limit: int) -> list[int]:
        """The cached blocks `tokens` starts with, whole blocks within its first `limit` positions."""
        if not self.prefix_caching:
            return []
        out, parent = [], _ROOT
        for i in range(min(limit, len(tokens)) // self.block_size):
            parent = block_key(parent, tokens[i * self.block_size:(i + 1) * self.block_size])
            b = self.cached.get(parent)
            if b is None:
                break
            out.append(b)
        return out

    def admit(self, slot: int, tokens: list[int], positions: int, reuse_limit: int, first=None) -> int | None:
        """Give `slot` blocks for its first `positions` positions, reusing the cached blocks its tokens start
        with (within reuse_limit positions); `first(reused, positions)` may ask for fewer now (a windowed
        model's first chunk). Returns the positions reused, or None (nothing taken) if the blocks are not there."""
        hits = self.match(tokens, reuse_limit)
        asked = positions
        if first is not None:
            positions = first(len(hits) * self.block_size, positions)
        need = self.blocks_for(positions) - len(hits)
        idle_hits = sum(1 for b in hits if self.ref[b] == 0)  # taking these removes them from the LRU
        if need > self.available() - idle_hits:
            return None
        for b in hits:
            self._hold(b)
        self.tables[slot] = self._extend(list(hits), need)
        self.trimmed[slot] = 0
        self.chain[slot] = [self.key[b] for b in hits]
        self.peak = max(self.peak, self.used())
        if self.prefix_caching and reuse_limit > 0:
            self.stats.queries += asked
            self.stats.hits += len(hits) * self.block_size
        return len(hits) * self.block_size

    def grow(self, slot: int, positions: int) -> bool:
        """Extend slot's table to hold `positions` positions; False (nothing taken) if blocks run out."""
        table = self.tables[slot]
        need = self.blocks_for(positions) - len(table)
        if need > self.available():
            return False
        self._extend(table, need)
        self.peak = max(self.peak, self.used())
        return True

    def trim(self, slot: int, below: int) -> bool:
        """Give back the slot's blocks wholly before position `below` (keys no later query reads: behind every
        layer's window); keyed ones stay in the prefix cache. True if any went back."""
        table, first = self.tables[slot], self.trimmed[slot]
        last = min(max(0, below) // self.block_size, len(table))
        for i in range(first, last):
            self.release_block(table[i])
            table[i] = RELEASED
        self.trimmed[slot] = max(first, last)
        return last > first

    def share(self, src: int, dst: int, n_blocks: int) -> None:
        """dst's first n_blocks become src's (an n-choice request's prompt): held twice, computed once.
        src must still hold them (none trimmed)."""
        assert not self.trimmed[src] and not self.trimmed[dst], "sharing blocks given back behind a window"
        table = self.tables[dst]
        for i in range(n_blocks):
            if i < len(table):
                self.release_block(table[i])
                table[i] = self.tables[src][i]
            else:  # dst was admitted with the blocks of its first chunk only (a windowed model)
                table.append(self.tables[src][i])
            self._hold(table[i])
        self.chain[dst] = list(self.chain[src][:n_blocks])

    def register(self, slot: int, tokens: list[int], valid: int) -> None:
        """Key the slot's blocks that are full of committed K/V (positions < valid) into the prefix cache."""
        if not self.prefix_caching:
            return
        chain, table, bs = self.chain[slot], self.tables[slot], self.block_size
        for i in range(len(chain), min(valid // bs, len(table))):
            k = block_key(chain[-1] if chain else _ROOT, tokens[i * bs:(i + 1) * bs])
            chain.append(k)
            b = table[i]
            # a twin computed at the same time stays unkeyed
            if b != RELEASED and k not in self.cached and self.key[b] is None:
                self.cached[k], self.key[b] = b, k

    def release(self, slot: int) -> None:
        """The slot's sequence ended (or was preempted): its blocks go back, the keyed ones stay cached.
        Its last blocks are freed first, so they are evicted before the prefix that others may share."""
        for b in reversed(self.tables.pop(slot, [])):
            if b != RELEASED:
                self.release_block(b)
        self.chain.pop(slot, None)
        self.trimmed.pop(slot, None)

    # ------------------------------------------------------------ blocks

    def release_block(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] == 0:
            if self.key[b] is not None:
                self.lru[b] = None
            else:
                self.free[b] = True
                self.n_free += 1

    def _hold(self, b: int) -> None:
        if self.ref[b] == 0:
            self.lru.pop(b, None)
        self.ref[b] += 1

    def _extend(self, table: list[int], need: int) -> list[int]:
        """table with `need` blocks more, each taken after the one before it."""
        for _ in range(max(0, need)):
            table.append(self._take(table[-1] if table and table[-1] != RELEASED else None))
        return table

    def _first_free(self) -> int:
        """The first block of the longest free run, or its middle when that run follows a sequence's last block
        (which may grow into it)."""
        edges = np.flatnonzero(np.diff(np.concatenate(([False], self.free, [False])).astype(np.int8)))
        starts, ends = edges[0::2], edges[1::2]
        i = int(np.argmax(ends - starts))
        s, e = int(starts[i]), int(ends[i])
        tails = {t[-1] for t in self.tables.values() if t}
        return s if s == 0 or s - 1 not in tails else (s + e) // 2

    def _take(self, after: int | None = None) -> int:
        if self.n_free:
            b = after + 1 if after is not None and after + 1 < self.num_blocks and self.free[after + 1] \
                else self._first_free()
            self.free[b] = False
            self.n_free -= 1
        else:  # the least recently freed cached block
            b, _ = self.lru.popitem(last=False)
            del self.cached[self.key[b]]
            self.key[b] = None
            self.evictions += 1
        self.ref[b] = 1
        return b


class TwoPools:
    """The block managers of a cache whose windowed layers keep blocks of their own: `full` holds each sequence's
    every position (its layers read from position 0), `window` the positions its windowed layers can still read
    (trim gives back the blocks behind the window). A sequence takes and gives back blocks in both at once; a
    prompt reuses cached blocks as far as both pools hold them (blocks behind the window that went back stay
    cached while not evicted, as in a one-pool windowed cache). The prefix statistics are the pair's."""

    def __init__(self, full: BlockManager, window: BlockManager):
        self.full, self.window = full, window
        self.block_size, self.prefix_caching = full.block_size, full.prefix_caching
        self.stats = PrefixStats()

    def reset(self) -> None:
        self.full.reset()
        self.window.reset()
        self.stats = PrefixStats()

    @property
    def trimmed(self) -> dict[int, int]:
        return self.window.trimmed

    @property
    def peak(self) -> int:
        return self.full.peak

    @property
    def evictions(self) -> int:
        return self.full.evictions + self.window.evictions

    def used(self) -> int:
        """The full layers' blocks in use (the window pool's: window.used())."""
        return self.full.used()

    def held(self, slot: int) -> int:
        """Blocks of both pools the slot's sequence holds now."""
        return self.full.held(slot) + self.window.held(slot)

    def entries(self, slot: int) -> int:
        return self.full.entries(slot) + self.window.entries(slot)

    def admit(self, slot: int, tokens: list[int], positions: int, reuse_limit: int, first=None) -> int | None:
        """As BlockManager.admit: the full pool takes every position now, the window pool what `first` asks."""
        hits = min(len(self.full.match(tokens, reuse_limit)), len(self.window.match(tokens, reuse_limit)))
        reuse = hits * self.block_size
        got = self.window.admit(slot, tokens, positions, reuse, first)
        if got is None:
            return None
        if self.full.admit(slot, tokens, positions, reuse) is None:
            self.window.release(slot)
            return None
        if self.prefix_caching and reuse_limit > 0:
            self.stats.queries += positions
            self.stats.hits += got
        return got

    def grow(self, slot: int, positions: int) -> bool:
        return self.full.grow(slot, positions) and self.window.grow(slot, positions)

    def trim(self, slot: int, below: int) -> bool:
        return self.window.trim(slot, below)

    def share(self, src: int, dst: int, n_blocks: int) -> None:
        self.full.share(src, dst, n_blocks)
        self.window.share(src, dst, n_blocks)

    def register(self, slot: int, tokens: list[int], valid: int) -> None:
        self.full.register(slot, tokens, valid)
        self.window.register(slot, tokens, valid)

    def release(self, slot: int) -> None:
        self.full.release(slot)
        self.window.release(slot)
