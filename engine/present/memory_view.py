"""Memory for the Precision page: weights by layer type, the KV cache for a context x batch grid, activations."""
from __future__ import annotations

from typing import Mapping, Sequence

from engine.common.errors import UserError
from engine.common.formulas import kv_bytes_per_token
from engine.present.columns import MB


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, context: int, batch: int,
                   bytes_per_value: int = 4) -> int:
    """K and V for every layer, kv head and slot: 2 * layers * kv_heads * head_dim * context * batch * bytes."""
    for name, v in (("context", context), ("batch", batch)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"{name} {v!r} is not a positive whole number", f"enter a {name} of at least 1")
    return int(kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_value) * context * batch)


def kv_grid(num_layers: int, num_kv_heads: int, head_dim: int, contexts: Sequence[int], batches: Sequence[int],
            bytes_per_value: int = 4) -> list[dict]:
    """One row per (context, batch) with the KV cache size in bytes and MB."""
    rows = []
    for c in contexts:
        for b in batches:
            n = kv_cache_bytes(num_layers, num_kv_heads, head_dim, int(c), int(b), bytes_per_value)
            rows.append({"context": int(c), "batch": int(b), "kv_bytes": n, "kv_MB": round(n / MB, 2)})
    return rows


def activation_bytes(hidden: int, intermediate: int, vocab: int, num_heads: int, context: int, batch: int,
                     bytes_per_value: int = 4) -> int:
    """Estimated activation workspace of a prefill over `context` tokens (the overhead bar).

    hidden states and projections (4*hidden + 3*intermediate per token), the attention weights of
    one layer (heads * context^2, CPU attention materialises them with a mask) and the last
    position's fp32 logits. An estimate, labelled as such in the UI.
    """
    per_token = (4 * hidden + 3 * intermediate) * bytes_per_value
    attn = num_heads * context * context * bytes_per_value
    logits = vocab * 4
    return batch * (context * per_token + attn + logits)


LAYER_ORDER = ("embedding", "attention", "mlp", "norm", "head")


def memory_breakdown(weights: Mapping[str, int], kv_bytes: int, overhead_bytes: int) -> list[dict]:
    """Rows for the stacked memory bar: weights by layer type, then KV cache, then overhead."""
    rows = []
    keys = [k for k in LAYER_ORDER if k in weights] + sorted(k for k in weights if k not in LAYER_ORDER)
    total = sum(int(v) for v in weights.values()) + int(kv_bytes) + int(overhead_bytes)
    for k in keys:
        rows.append({"part": f"weights: {k}", "group": "weights", "bytes": int(weights[k])})
    rows.append({"part": "KV cache", "group": "kv cache", "bytes": int(kv_bytes)})
    rows.append({"part": "activations (estimate)", "group": "overhead", "bytes": int(overhead_bytes)})
    for r in rows:
        r["MB"] = round(r["bytes"] / MB, 2)
        r["share"] = (r["bytes"] / total) if total else 0.0
    return rows
