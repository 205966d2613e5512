"""The closed-form formulas every layer shares; each is defined here once and called everywhere else.

- usd_per_million_tokens: $ / 1M tokens for a machine at $/hour producing tokens/s.
- usd_per_thousand_solved: $ per 1,000 solved problems, from the tokens a run generated at its speed.
- expected_length: tokens per target pass under i.i.d. acceptance (speculative decoding).
- kv_bytes_per_token: bytes one token's K and V take in the cache.
"""
from __future__ import annotations

import math

from engine.common.errors import UserError

HOURS_PER_MONTH = 730.0  # 365 * 24 / 12
DEFAULT_USD_PER_HOUR = 0.10  # this machine's price until the user types one (a small cloud VM)
SECONDS_PER_HOUR = 3600.0


def check_price(usd_per_hour: float) -> float:
    if isinstance(usd_per_hour, bool) or not isinstance(usd_per_hour, (int, float)) or math.isnan(usd_per_hour) \
            or math.isinf(usd_per_hour) or usd_per_hour <= 0:
        raise UserError(f"price {usd_per_hour!r} $/hour is not a positive number", "enter a price above 0")
    return float(usd_per_hour)


def usd_per_million_tokens(tokens_per_s: float | None, usd_per_hour: float) -> float | None:
    """$ per 1M tokens for a machine at usd_per_hour producing tokens_per_s (None if unknown)."""
    check_price(usd_per_hour)
    if not tokens_per_s or tokens_per_s <= 0:
        return None
    return usd_per_hour / (tokens_per_s * SECONDS_PER_HOUR) * 1e6


def usd_per_thousand_solved(tokens_per_s: float | None, tokens: int, solved: int, usd_per_hour: float) -> float | None:
    """$ per 1,000 solved problems: the $/1M-token price of generating `tokens` at tokens_per_s, spread over
    `solved` (None when nothing was solved or the speed is unknown)."""
    per_m = usd_per_million_tokens(tokens_per_s, usd_per_hour)
    if per_m is None or solved <= 0:
        return None
    return per_m * tokens / 1e6 / solved * 1000


def acceptance_rate(accepted: float, drafted: float) -> float | None:
    """vLLM's acceptance rate: accepted / draft tokens (None when nothing was drafted)."""
    return accepted / drafted if drafted else None


def mean_acceptance_length(accepted: float, rounds: float) -> float | None:
    """vLLM's mean acceptance length: 1 + accepted / drafting rounds, the bonus token counted (None: no round)."""
    return 1 + accepted / rounds if rounds else None


def expected_length(a: float | None, gamma: float | None) -> float | None:
    """(1 - a^(g+1)) / (1 - a): tokens one verification pass emits when each of g draft tokens is
    accepted independently with probability a, counting the bonus/resample token (g + 1 at a = 1).
    """
    if a is None or gamma is None or isinstance(a, bool) or not math.isfinite(a):
        return None
    if not 0.0 <= a <= 1.0:
        raise UserError(f"acceptance rate {a} is outside [0, 1]", "give a share of accepted draft tokens")
    if a >= 1.0 - 1e-12:
        return gamma + 1.0
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_value: float) -> float:
    """2 (K and V) * layers * kv_heads * head_dim * bytes per value."""
    return 2.0 * num_layers * num_kv_heads * head_dim * bytes_per_value


# KV-cache precisions: bytes per cached value, and the scales. int8 (the engine's, engine/infer/paged.py)
# keeps an fp16 scale per INT8_K_GROUP values of a K vector (keys have outlier channels: one scale per
# vector costs Qwen2.5 a KL of 0.008, per 32 values 0.003) and one per V vector; int4 a scale and a zero
# point per vector; fp8 (e4m3) is cast with a per-tensor scale of 1, as vLLM stores it without calibrated
# scales. The planner and the engine both read these.
KV_VALUE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
KV_SCALE_BYTES = {"int8": 2, "int4": 4}  # per scaled vector (an MLA latent, a V vector)
INT8_K_GROUP = 32


def sequence_blocks(positions: int, block_size: int, window: int = 0, step_rows: int = 0) -> int:
    """The most KV blocks one sequence of `positions` positions holds at once: whole blocks of all of them,
    or when every layer attends within a sliding window (the engine gives back the blocks behind it) those
    from the window's first key to the end of a step's rows (a prefill chunk or a decode round), one more
    where the two ends fall mid-block:  min(ceil(P / bs), ceil((W - 1 + rows) / bs) + 1)."""
    full = -(-int(positions) // int(block_size))
    return min(full, -(-(int(window) - 1 + int(step_rows)) // int(block_size)) + 1) if window else full


def sequences_in_blocks(blocks: int, block_size: int, positions: int, per_sequence: int = 0) -> int:
    """Whole sequences of `positions` positions that `blocks` KV blocks of `block_size` positions hold
    (a sequence takes whole blocks; `per_sequence` when known: sequence_blocks, a windowed model's)."""
    return int(blocks) // (per_sequence or sequence_blocks(positions, block_size))


def kv_pair_bytes(head_dim: int, kv_dtype: str) -> float:
    """Bytes one token's K and V of one KV head occupy at kv_dtype, scales included."""
    base = 2 * head_dim * KV_VALUE_BYTES[kv_dtype]
    if kv_dtype == "int8":
        return base + 2 * -(-head_dim // INT8_K_GROUP) + KV_SCALE_BYTES["int8"]
    return base + 2 * KV_SCALE_BYTES.get(kv_dtype, 0)
