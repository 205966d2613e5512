"""The lab's shared names: precisions (with the aliases accepted on input), model aliases, draft kinds.

One vocabulary for the live engine, the planner, the peers and the pages. Input may use an alias
(`bnb-nf4`, `bfloat16`, `w4`); everything stored and printed uses the canonical name.
"""
from __future__ import annotations

from engine.common.errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4", "llm.int8", "nf4", "fp8")
FLOAT_PRECISIONS = ("fp32", "bf16", "fp16")
BNB_PRECISIONS = ("llm.int8", "nf4")  # bitsandbytes' formats, in our engine and as a transformers peer
# Bits a weight takes at each precision (scales aside): what makes one precision cheaper than another.
WEIGHT_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "int8": 8, "llm.int8": 8, "fp8": 8, "int4": 4, "nf4": 4}
GROUP_SIZES = (32, 64, 128)  # int4 group sizes our kernels support
DESCRIPTIONS = {
    "fp32": "32-bit float (the reference)",
    "bf16": "bfloat16 weights and activations",
    "fp16": "float16 weights and activations",
    "int8": "int8 weight-only, per-output-channel symmetric scales (our kernels)",
    "int4": "int4 weight-only, group-wise asymmetric, two per byte (our kernels)",
    "llm.int8": "bitsandbytes LLM.int8 (int8 with fp16 outliers)",
    "nf4": "bitsandbytes NF4 4-bit",
    "fp8": "fp8 e4m3 weight-only with per-channel scales (Hopper/Ada GPUs)",
}
PRECISION_ALIASES = {
    "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "int8.bnb": "llm.int8",
    "bnb-int8": "llm.int8", "bnb.int8": "llm.int8", "llmint8": "llm.int8", "bnb-nf4": "nf4", "bnb.nf4": "nf4",
    "w8": "int8", "w4": "int4",
}

MODEL_ALIASES = {"default": "qwen2.5-coder-1.5b", "default-draft": "qwen2.5-coder-0.5b"}

DRAFT_KINDS = ("none", "model", "self", "ngram")
MAX_GAMMA = 16  # draft tokens per round, at most
KV_CACHES = ("slots", "paged")  # max_model_len reserved per sequence up front | blocks admitted as needed
# The engine's KV-cache precisions (auto: the compute dtype); fp8 needs a GPU of compute capability 8.9+.
KV_DTYPES = ("auto", "fp32", "bf16", "fp16", "int8", "fp8")
QUANTIZED_KV = ("int8", "fp8")  # the KV dtypes that quantize: priced against an unquantized cache


def kv_words(kv_cache: str | None = "paged", kv_dtype: str | None = "auto", kv_cache_gib: float | None = 0.0) -> str:
    """How a label says our server's KV cache where it is not the default (paged, the compute dtype, a budget
    of slots x context): ', KV int8 in 0.25 GiB', ', slot KV cache', or ''."""
    if kv_cache == "slots":
        return ", slot KV cache"
    if (kv_dtype or "auto") == "auto" and not kv_cache_gib:
        return ""
    return f", KV {kv_dtype or 'auto'}" + (f" in {kv_cache_gib:g} GiB" if kv_cache_gib else "")


def parse_precision(p: str) -> str:
    """The canonical precision for a name or alias; a UserError names the choices."""
    q = (p or "").strip().lower().replace("_", ".")
    q = PRECISION_ALIASES.get(q, q)
    if q not in PRECISIONS:
        raise UserError(f"unknown precision '{p}'", f"choose one of: {', '.join(PRECISIONS)}")
    return q


def canonical_model_name(name: str) -> str:
    """'default' and 'default-draft' resolve to catalog names; other names are lower-cased and trimmed."""
    n = (name or "").strip().lower()
    return MODEL_ALIASES.get(n, n)


def check_draft_kind(kind: str) -> str:
    if kind not in DRAFT_KINDS:
        raise UserError(f"unknown draft kind '{kind}'", f"use one of: {', '.join(DRAFT_KINDS)}")
    return kind
