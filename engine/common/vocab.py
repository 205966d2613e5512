"""The lab's shared names: precisions (with the aliases accepted on input), model aliases, draft kinds.

One vocabulary for the live engine, the planner, the peers and the pages. Input may use an alias
(`bnb-nf4`, `bfloat16`, `w4`); everything stored and printed uses the canonical name.
"""
from __future__ import annotations

import re

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
    "int4": "int4 weight-only, group-wise asymmetric, two per byte (our kernels); the method says how the grid "
            "was chosen (QUANT_METHODS)",
    "llm.int8": "bitsandbytes LLM.int8 (int8 with fp16 outliers)",
    "nf4": "bitsandbytes NF4 4-bit",
    "fp8": "fp8 e4m3 weight-only with per-channel scales (Hopper/Ada GPUs)",
}
PRECISION_ALIASES = {
    "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "int8.bnb": "llm.int8",
    "bnb-int8": "llm.int8", "bnb.int8": "llm.int8", "llmint8": "llm.int8", "bnb-nf4": "nf4", "bnb.nf4": "nf4",
    "w8": "int8", "w4": "int4",
}

# How int4 weights are chosen (all land on the same kernel format: q in 0..15, an fp16 scale and min per group).
# A setup's precision may name one: `int4-gptq`, `int4-gptq-g32`, `int4-awq-g128`; `int4` alone (or `int4-rtn`) is rtn.
QUANT_METHODS = ("rtn", "gptq", "awq", "gptq-mixed", "gptq-llmc", "checkpoint", "gguf")
METHOD_DESCRIPTIONS = {
    "rtn": "round-to-nearest: min/max per group, no calibration (as llama.cpp's Q4_1 rounds)",
    "gptq": "GPTQ: each column rounded in turn, its error spread over the columns not yet rounded through the inverse "
            "Hessian of calibration activations (act-order, per-group scale and min searched for least error)",
    "awq": "AWQ: per-input-channel scales from calibration activations, searched per layer for least output error "
           "and folded into the preceding norm or linear, then round-to-nearest with searched clipping",
    "gptq-mixed": "GPTQ, with the linears whose int4 output error (measured on the calibration text) is largest "
                  "kept at int8, within a byte budget (llama.cpp's Q4_K_M keeps attn_v, half of ffn_down and the "
                  "head at 6 bits by a fixed rule)",
    "gptq-llmc": "GPTQ by llm-compressor's oneshot (the ecosystem's tool, in its own venv: `make llmc`), on the same "
                 "calibration text, asymmetric groups with act-order, its other settings at their defaults; the "
                 "compressed-tensors checkpoint it saves is kept in the cache and its codes run as stored",
    "checkpoint": "the int4 codes of your already-quantized checkpoint (compressed-tensors pack-quantized W4A16, as "
                  "llm-compressor saves GPTQ and AWQ; GPTQ as AutoGPTQ/GPTQModel save it; AWQ GEMM as AutoAWQ "
                  "saves it), read into our kernels' format, not requantized",
    "gguf": "the int4 codes of the model's own llama.cpp GGUF (the catalog's shipped Q4_K_M): its Q4_K/Q4_0/Q4_1 "
            "blocks read into our kernels' format, not requantized; its 5-8-bit tensors (Q4_K_M's Q6_K attn_v, half "
            "of ffn_down and the head) kept at int8. The same weights llama.cpp runs from that file",
}
# Methods whose group size is the format's own: int4-gguf is llama.cpp's 32-weight blocks.
METHOD_GROUP = {"gguf": 32}
# Methods that read calibration text (engine/infer/calibrate.py).
CALIBRATED_METHODS = ("gptq", "awq", "gptq-mixed", "gptq-llmc")
# Each calibration algorithm's version. Bump one when its result changes: cached entries of older versions are not
# reused, and a record measured with an older one (or before records kept it) is labelled so (record_setup).
CALIBRATION_VERSIONS = {"gptq": 3, "awq": 2,  # gptq 3: H shrunk toward its diagonal, damped 10% (engine/quant/gptq.py)
                        "gptq-llmc": 1}  # the recipe engine/quant/llmc_driver.py gives llm-compressor

MODEL_ALIASES = {"default": "qwen2.5-coder-1.5b", "default-draft": "qwen2.5-coder-0.5b"}

DRAFT_KINDS = ("none", "model", "self", "ngram", "suffix")
# What a stored record is (engine.measure.records), and the kinds a measured generation (a RunConfig's run) is stored
# as: a benchmark run, `python -m engine generate`, a run of the Speculative playground.
OUR_SYSTEMS = (None, "engine", "serving-cost-lab")  # a record's config.system for our engine, as each kind writes it
RECORD_KINDS = ("generate", "bench", "quality", "peer", "load", "playground", "accuracy")
RUN_KINDS = ("bench", "generate", "playground")
MAX_GAMMA = 16  # draft tokens per round, at most
# How a server picks each step's draft length (engine/infer/spec_policy.py): always gamma, the best by the
# step-cost model and the running acceptance (0 included), or no speculation at all.
SPEC_POLICIES = ("fixed", "adaptive", "off")
KLD_STATS = ("mean", "median", "p99")  # the statistics of per-position KL a quality budget may limit
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


def parse_precision_spec(token: str, group_size: int | None = None) -> tuple[str, str, int | None]:
    """'int4-gptq-g32' -> ('int4', 'gptq', 32); 'int4' -> ('int4', 'rtn', group_size); 'bf16' -> ('bf16', 'rtn', ...).

    The grammar is PRECISION[-METHOD][-gGROUP]; a method or a group size is for int4 only. A UserError names
    the part it cannot read and the choices."""
    raw = (token or "").strip()
    parts = raw.lower().split("-")
    group = group_size
    if len(parts) > 1 and re.fullmatch(r"g\d+", parts[-1]):
        group = int(parts.pop()[1:])
        if group not in GROUP_SIZES:
            raise UserError(f"precision {raw!r}: int4 group size {group} is not supported",
                            f"use -g{', -g'.join(map(str, GROUP_SIZES))}")
    elif len(parts) > 1 and re.fullmatch(r"g(\d.*)?", parts[-1]):
        raise UserError(f"precision {raw!r} has no group size after -g", "write int4-g32, int4-g64 or int4-g128")
    method = "rtn"
    if len(parts) > 1 and "-".join(parts[1:]) in QUANT_METHODS:
        method, parts = "-".join(parts[1:]), parts[:1]
    elif len(parts) > 1 and parts[0] == "int4":
        raise UserError(f"precision {raw!r}: unknown quantization method '{'-'.join(parts[1:])}'",
                        f"write int4-METHOD[-gGROUP] with METHOD one of: {', '.join(QUANT_METHODS)} "
                        "(e.g. int4-gptq-g128)")
    if method in METHOD_GROUP and not re.search(r"-g\d+$", raw.lower()):
        group = METHOD_GROUP[method]
    precision = parse_precision("-".join(parts)) if parts != [""] else parse_precision(raw)
    if precision != "int4" and (method != "rtn" or group != group_size):
        raise UserError(f"precision {raw!r}: a quantization method or group size is for int4 only",
                        f"write {precision}, or int4-gptq, int4-awq, int4-g32")
    return precision, method, group


def precision_token(precision: str, method: str = "rtn", group_size: int = 64) -> str:
    """parse_precision_spec's inverse: 'int4-gptq-g32', 'int4-g64' (round-to-nearest, as records have always
    said), 'int8'."""
    if precision != "int4":
        return precision
    return "int4" + (f"-{method}" if method and method != "rtn" else "") + f"-g{group_size}"


def method_words(precision: str, method: str | None) -> str:
    """How a label says the method: '' for round-to-nearest (the labels records have always had), else ' gptq'."""
    return f" {method}" if precision == "int4" and method and method != "rtn" else ""


def canonical_model_name(name: str) -> str:
    """'default' and 'default-draft' resolve to catalog names; other names are lower-cased and trimmed."""
    n = (name or "").strip().lower()
    return MODEL_ALIASES.get(n, n)


def check_spec_policy(name: str) -> str:
    if name not in SPEC_POLICIES:
        raise UserError(f"unknown speculation policy {name!r}", f"use one of: {', '.join(SPEC_POLICIES)}")
    return name


def check_draft_kind(kind: str) -> str:
    if kind not in DRAFT_KINDS:
        raise UserError(f"unknown draft kind '{kind}'", f"use one of: {', '.join(DRAFT_KINDS)}")
    return kind
