"""What a model shape costs: its parameters, bytes (weights per precision, a decode step's reads, the KV cache)
and FLOPs (a token's matmuls and attention, a prefill), each computed from the shape's few numbers
(engine/planner/shapes.py). One home for each formula: roofline, calibration, search and the pages call these.
The checks against real checkpoints live beside their readers: engine/quant/accounting.py sums a real state dict,
engine/peers/gguf_tools.py counts a GGUF header's tensors.

Byte formats per quantized linear of shape (out, in), n = out*in weights:
  fp32 4n | bf16/fp16 2n
  fp8       n + 4*out          e4m3 weight, fp32 scale per output channel (engine/quant/layers.py Fp8Linear)
  int8      n + 4*out          symmetric, fp32 scale per output channel (our kernels)
  llm.int8  n + 4*out          bitsandbytes Int8Params: int8 CB + fp32 SCB per row
  int4      n/2 + 4*out*ceil(in/g)   two weights a byte, fp16 scale + fp16 min per group of g inputs
  nf4       n/2 + 4*ceil(n/64)       bitsandbytes NF4, blocksize 64, fp32 absmax per block;
            with double quantization the absmax is int8 (1 byte/block) + fp32 per 256 blocks + fp32 offset
  int4-mixed  int4, except v_proj and down_proj in as many layers as llama.cpp's Q4_K_M rule gives more
            bits (use_more_bits: the first and last eighth and every third between, half the layers) and the
            head, which are int8: the lab's int4-gguf of the catalog's Q4_K_M files holds this many (their
            Q6_K tensors at int8; the files picked other layers than the rule, the same number)
  fp4       n/2 + ceil(n/16)   NVFP4 (planner only, no lab kernel): e2m1 weights, one fp8 e4m3 scale per
            16 = 4.5 bits a weight (MXFP4, one 8-bit scale per 32, is 4.25: 6% fewer bytes, not modelled)
Norms, biases, routers and whatever is not quantized stay in the base dtype (counted).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

from engine.common.formulas import KV_SCALE_BYTES, KV_VALUE_BYTES, kv_pair_bytes
from engine.planner.shapes import (INT4_MIXED, KV_DTYPES, PLAN_PRECISIONS, PRECISIONS, ModelShape, ShapeError,
                                   kernel_precision)

FLOAT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
FP4_GROUP = 16   # NVFP4: one fp8 scale per 16 weights
NF4_BLOCKSIZE = 64          # bitsandbytes default blocksize for 4-bit (Params4bit)
NF4_DQ_BLOCKSIZE = 256      # bitsandbytes blocksize of the second-level (double) quantization

# ------------------------------------------------------------------ parameter counts

@dataclass(frozen=True)
class Linear:
    """One weight matrix: `count` copies of an (out, in) matrix, of a named kind."""

    kind: str        # attention | mlp | expert | extra | embedding | head
    out: int
    inp: int
    count: int = 1
    role: str = ""   # v_proj, down_proj: the linears a mixed rule keeps at more bits in some layers

    @property
    def params(self) -> int:
        return self.out * self.inp * self.count


def block_linears(m: ModelShape) -> list[Linear]:
    """The linear layers inside the transformer blocks (all layers), the ones a precision quantizes.
    Fused checkpoints (Phi-3 qkv_proj / gate_up_proj, gpt-oss gate_up) hold the same weights."""
    L = m.layers
    if m.is_mla:
        qk = m.heads * m.head_dim
        lin = ([Linear("attention", m.q_lora_rank, m.hidden, L),                   # q_a_proj
                Linear("attention", qk, m.q_lora_rank, L)] if m.q_lora_rank        # q_b_proj
               else [Linear("attention", qk, m.hidden, L)])                       # q_proj
        lin += [Linear("attention", m.kv_lora_rank + m.qk_rope_head_dim, m.hidden, L),   # kv_a_proj_with_mqa
                Linear("attention", m.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, L),  # kv_b_proj
                Linear("attention", m.hidden, m.attn_out_dim, L)]                 # o_proj
    else:
        lin = [
            Linear("attention", m.q_dim, m.hidden, L),      # q_proj
            Linear("attention", m.kv_dim, m.hidden, L),     # k_proj
            Linear("attention", m.kv_dim, m.hidden, L, "v_proj"),
            Linear("attention", m.hidden, m.q_dim, L),      # o_proj
        ]
    dense = L - m.moe_layers
    if dense:
        lin += [Linear("mlp", m.intermediate, m.hidden, 2 * dense),              # gate_proj, up_proj
                Linear("mlp", m.hidden, m.intermediate, dense, "down_proj")]
    if m.is_moe:
        E, ie, M = m.experts, m.expert_intermediate, m.moe_layers
        lin += [Linear("expert", ie, m.hidden, 2 * M * E),                      # w1 (gate), w3 (up)
                Linear("expert", m.hidden, ie, M * E)]                          # w2 (down)
        if m.shared_expert_intermediate:
            si = m.shared_expert_intermediate
            lin += [Linear("mlp", si, m.hidden, 2 * M), Linear("mlp", m.hidden, si, M)]   # shared expert
    if m.extra_linear_params:
        lin.append(Linear("extra", m.extra_linear_params, 1, 1))
    return lin


@dataclass(frozen=True)
class ParamBreakdown:
    embedding: int
    head: int            # 0 when tied (the embedding matrix is the head)
    attention: int
    mlp: int             # dense MLP, shared experts and all routed experts
    extra: int
    router: int          # MoE router (+ its bias, + Qwen2-MoE's shared-expert gate)
    biases: int
    norms: int           # norms, and gpt-oss' attention sinks
    experts: int = 0     # the part of `mlp` + `biases` that belongs to routed experts

    @property
    def total(self) -> int:
        return (self.embedding + self.head + self.attention + self.mlp + self.extra + self.router
                + self.biases + self.norms)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


def param_breakdown(m: ModelShape) -> ParamBreakdown:
    """Parameters by kind, as a Hugging Face checkpoint of this shape would hold them."""
    by = {"attention": 0, "mlp": 0, "expert": 0, "extra": 0}
    for li in block_linears(m):
        by[li.kind] += li.params
    L, M = m.layers, m.moe_layers
    biases = L * (m.q_dim + 2 * m.kv_dim) if m.qkv_bias else 0
    biases += L * m.hidden if m.o_bias else 0
    expert_biases = 0
    if m.mlp_bias:
        dense = L - M
        biases += dense * (2 * m.intermediate + m.hidden)
        expert_biases = M * m.experts * (2 * m.expert_intermediate + m.hidden)
        if m.shared_expert_intermediate:
            biases += M * (2 * m.shared_expert_intermediate + m.hidden)
    norms = L * m.norms_per_layer * m.hidden + m.hidden     # per-block norms, final norm
    if m.qk_norm:
        norms += L * 2 * m.head_dim
    if m.is_mla:
        norms += L * (m.q_lora_rank + m.kv_lora_rank)       # q_a_layernorm, kv_a_layernorm
    if m.attention_sinks:
        norms += L * m.heads
    router = M * (m.hidden * m.experts + (m.experts if m.router_bias else 0)
                  + (m.hidden if m.shared_expert_gate else 0))
    return ParamBreakdown(
        embedding=m.vocab * m.hidden,
        head=0 if m.tied_embeddings else m.vocab * m.hidden,
        attention=by["attention"],
        mlp=by["mlp"] + by["expert"],
        extra=by["extra"],
        router=router,
        biases=biases + expert_biases,
        norms=norms,
        experts=by["expert"] + expert_biases,
    )


def param_count(m: ModelShape, active: bool = False) -> int:
    """Total parameters; with active=True, those one token uses (MoE: its active routed experts;
    the embedding counts, as Mixtral's, Qwen's and DeepSeek's published "active" figures do)."""
    b = param_breakdown(m)
    if not active or not m.is_moe:
        return b.total
    inactive = b.experts * (m.experts - m.active_experts) // m.experts
    return b.total - inactive


def matmul_params_per_token(m: ModelShape, include_head: bool = True) -> int:
    """Weights a token multiplies with (2 FLOPs each): active block linears + head. No embedding."""
    by = {"attention": 0, "mlp": 0, "expert": 0, "extra": 0}
    for li in block_linears(m):
        by[li.kind] += li.params
    experts = by["expert"] * m.active_experts // m.experts if m.is_moe else 0
    n = by["attention"] + by["mlp"] + experts + by["extra"] + param_breakdown(m).router
    if include_head:
        n += m.vocab * m.hidden
    return n


def expected_experts_touched(experts: int, active: int, tokens: float) -> float:
    """Expected distinct experts of one MoE layer that `tokens` tokens touch, each routed to
    `active` of `experts` uniformly and independently: E * (1 - (1 - k/E)^T). One token touches k;
    T -> infinity touches all E. Real routers are not uniform, so measured counts fall below this."""
    if experts <= 0 or not 0 < active <= experts:
        raise ShapeError(f"expected_experts_touched: need 0 < active ({active}) <= experts ({experts})")
    if tokens < 0:
        raise ShapeError(f"expected_experts_touched: tokens {tokens} is negative")
    return experts * (1.0 - (1.0 - active / experts) ** tokens)


# ------------------------------------------------------------------ bytes

def _check_precision(precision: str) -> str:
    p = (precision or "").strip().lower()
    if p not in PLAN_PRECISIONS:
        raise ShapeError(f"unknown precision '{precision}'; choose one of {', '.join(PLAN_PRECISIONS)}")
    return p


def default_base_dtype(precision: str) -> str:
    """dtype of what a precision does not quantize (norms, biases, embedding): fp32 stays fp32,
    fp16 stays fp16, everything else is served in bf16. On CPU the lab keeps fp32 (pass it)."""
    return {"fp32": "fp32", "fp16": "fp16"}.get(precision, "bf16")


def more_bits(i: int, layers: int) -> bool:
    """Whether llama.cpp's Q4_K_M rule gives layer `i` of `layers` more bits (its use_more_bits: the first
    and last eighth, and every third layer between)."""
    return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2


def more_bits_layers(layers: int) -> int:
    """How many layers get more bits: 12 of the 0.5B's 24, 14 of the 1.5B's 28."""
    return sum(more_bits(i, layers) for i in range(layers))


def _int8_copies(li: Linear, m: "ModelShape") -> int:
    """How many of `li`'s copies (one per layer) int4-mixed keeps at int8: v_proj and down_proj in the
    more-bits layers."""
    return more_bits_layers(m.layers) if li.role in ("v_proj", "down_proj") else 0


def linear_bytes(out: int, inp: int, precision: str, group_size: int = 64, double_quant: bool = False,
                 count: int = 1) -> int:
    """Bytes of `count` (out, in) weight matrices stored in `precision` (formats: module docstring; a
    linear on its own in int4-mixed is int4: which copies are int8 is the model's, weight_bytes_breakdown)."""
    p = kernel_precision(_check_precision(precision))
    n = out * inp
    if p in FLOAT_BYTES:
        b = FLOAT_BYTES[p] * n
    elif p in ("int8", "fp8", "llm.int8"):
        b = n + 4 * out
    elif p == "int4":
        if group_size <= 0:
            raise ShapeError("int4 group_size must be positive")
        b = (n + 1) // 2 + 4 * out * math.ceil(inp / group_size)
    elif p == "nf4":
        blocks = math.ceil(n / NF4_BLOCKSIZE)
        absmax = blocks + 4 * math.ceil(blocks / NF4_DQ_BLOCKSIZE) + 4 if double_quant else 4 * blocks
        b = (n + 1) // 2 + absmax
    elif p == "fp4":
        b = (n + 1) // 2 + math.ceil(n / FP4_GROUP)
    else:  # pragma: no cover - _check_precision guards
        raise AssertionError(p)
    return b * count


def _embedding_int8_rows_bytes(m: ModelShape) -> int:
    # engine/quant/layers.py QuantEmbedding: int8 rows + one fp32 scale per row, whatever the precision.
    return m.vocab * m.hidden + 4 * m.vocab


@dataclass(frozen=True)
class WeightBytes:
    """Bytes held by each part of the weights for one precision (tied storage counted once)."""

    precision: str
    blocks: int          # quantized block linears (attention + MLP/experts + extra)
    experts: int         # the part of `blocks` that is MoE experts
    embedding: int
    head: int            # 0 when the tied embedding doubles as the head
    head_shares_embedding: bool
    small: int           # norms, biases, router (base dtype)

    @property
    def total(self) -> int:
        return self.blocks + self.embedding + self.head + self.small

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


def weight_bytes_breakdown(m: ModelShape, precision: str, quantize_embeddings: bool = False,
                           quantize_head: bool = False, group_size: int = 64, *, double_quant: bool = False,
                           base_dtype: str | None = None, bias_dtype: str | None = None) -> WeightBytes:
    """Per-part weight bytes; see `weight_bytes` for the rules."""
    p = _check_precision(precision)
    if p == INT4_MIXED and (m.is_moe or m.is_mla):
        raise ShapeError(f"{INT4_MIXED} is modelled for dense attention models only, not {m.name} (mixture of "
                         "experts or MLA: llama.cpp's rule differs there)", "plan it at int4 or int8")
    base = base_dtype or default_base_dtype(p)
    if base not in FLOAT_BYTES:
        raise ShapeError(f"base_dtype must be one of {', '.join(FLOAT_BYTES)}, got '{base}'")
    quantized = p not in FLOAT_BYTES
    # A float precision stores everything in itself; a quantized one keeps the rest in `base`.
    bb = FLOAT_BYTES[base] if quantized else FLOAT_BYTES[p]
    blocks = experts = 0
    for li in block_linears(m):
        k8 = _int8_copies(li, m) if p == INT4_MIXED else 0
        b = linear_bytes(li.out, li.inp, p, group_size, double_quant, li.count - k8) \
            + linear_bytes(li.out, li.inp, "int8", count=k8)
        blocks += b
        if li.kind == "expert":
            experts += b
    pb = param_breakdown(m)
    bias_b = FLOAT_BYTES[bias_dtype] if bias_dtype else bb
    small = pb.norms * bb + pb.router * bb + pb.biases * bias_b
    emb_float = m.vocab * m.hidden * bb
    head_q = (linear_bytes(m.vocab, m.hidden, "int8" if p == INT4_MIXED else p, group_size, double_quant)
              if quantized else emb_float)
    embedding = _embedding_int8_rows_bytes(m) if (quantized and quantize_embeddings) else emb_float
    if not quantized:
        head, shares = (0, True) if m.tied_embeddings else (emb_float, False)
    elif m.tied_embeddings and not quantize_head:
        head, shares = 0, True           # the (float or int8-row) embedding is also the head
    else:
        head, shares = (head_q if quantize_head else emb_float), False
    return WeightBytes(p, blocks, experts, embedding, head, shares, small)


def weight_bytes(model: ModelShape, precision: str, quantize_embeddings: bool = False, quantize_head: bool = False,
                 group_size: int = 64, *, double_quant: bool = False, base_dtype: str | None = None,
                 bias_dtype: str | None = None) -> int:
    """Bytes held by the weights of `model` stored in `precision`.

    The block linears (q, k, v, o, MLP or experts) take the precision's format. The embedding is
    quantized only with quantize_embeddings (int8 rows + fp32 row scales, as engine/quant/layers.py does);
    the output head only with quantize_head. A tied head that is quantized gets its own copy (the
    embedding keeps its format), as the lab does. Norms, biases and the MoE router stay in
    `base_dtype` (default: fp32 for fp32, fp16 for fp16, bf16 otherwise; the lab's CPU runs keep
    fp32, pass base_dtype='fp32'). `bias_dtype` overrides the bias dtype (the lab's int8/int4 biases
    are fp32). nf4 uses bitsandbytes' blocksize 64 (fp32 absmax; `double_quant` = compress_statistics).
    """
    return weight_bytes_breakdown(model, precision, quantize_embeddings, quantize_head, group_size,
                                  double_quant=double_quant, base_dtype=base_dtype, bias_dtype=bias_dtype).total


def decode_read_bytes(model: ModelShape, precision: str, tokens_in_step: int = 1, quantize_embeddings: bool = False,
                      quantize_head: bool = False, group_size: int = 64, **kw) -> float:
    """Weight bytes one decode step reads from memory, for all `tokens_in_step` tokens together.

    Every block linear and the head are read once per step whatever the batch (that is why decode
    is memory-bound). The embedding table is not read, only the rows of the step's tokens. For MoE,
    only experts some token is routed to are read: expected_experts_touched(E, k, T) / E of them.
    """
    wb = weight_bytes_breakdown(model, precision, quantize_embeddings, quantize_head, group_size, **kw)
    head = wb.head if not wb.head_shares_embedding else wb.embedding
    row_bytes = wb.embedding / model.vocab
    dense = wb.blocks - wb.experts
    experts = wb.experts
    if model.is_moe and experts:
        touched = expected_experts_touched(model.experts, model.active_experts, max(1, tokens_in_step))
        experts = experts * touched / model.experts
    return dense + experts + head + wb.small + min(tokens_in_step, model.vocab) * row_bytes


def kv_layer_bytes(model: ModelShape, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes one token occupies in one layer.

    Ordinary attention: kv_heads * kv_pair_bytes (K and V, engine.common.formulas, which the engine's
    paged cache reads too).
    MLA (DeepSeek): one latent of kv_lora_rank + qk_rope_head_dim values, shared by all heads.
    int8 caches add fp16 scales (per 32 values of K, per V vector), int4 a scale and a zero point
    per cached vector (MLA: per latent); fp8 uses per-tensor scales (negligible).
    """
    k = (kv_dtype or "").strip().lower()
    if k not in KV_VALUE_BYTES:
        raise ShapeError(f"unknown KV dtype '{kv_dtype}'; choose one of {', '.join(KV_DTYPES)}")
    if model.is_mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * KV_VALUE_BYTES[k] + KV_SCALE_BYTES.get(k, 0)
    return model.kv_heads * kv_pair_bytes(model.head_dim, k)


def kv_cache_bytes(model: ModelShape, context: float, kv_dtype: str = "bf16") -> float:
    """KV bytes one sequence of `context` tokens holds: global layers keep every token, the
    `local_layers` with a sliding window keep the last min(context, sliding_window).
      = kv_layer_bytes * (global_layers * context + local_layers * min(context, sliding_window))"""
    held_local = min(context, model.sliding_window) if model.local_layers else 0.0
    return kv_layer_bytes(model, kv_dtype) * (model.global_layers * context + model.local_layers * held_local)


def kv_bytes_per_token(model: ModelShape, kv_dtype: str = "bf16", context: float | None = None) -> float:
    """KV-cache bytes per token: kv_cache_bytes(model, context) / context, the average over a
    sequence of `context` tokens. Without `context`, every layer keeps the token (for a model
    without sliding windows that is exact at any context; with windows it is the upper bound,
    reached while context <= sliding_window)."""
    if context is None or context <= 0:
        return kv_layer_bytes(model, kv_dtype) * model.layers
    return kv_cache_bytes(model, context, kv_dtype) / context


def attention_pair_flops(model: ModelShape, prefill: bool = False) -> float:
    """FLOPs one layer spends per (new token, cached token) pair: QK^T and AV.
    Ordinary attention 4 * heads * head_dim. MLA: decode runs on the latent (weights absorbed, as
    vLLM does): 2 * heads * (2 * kv_lora_rank + qk_rope_head_dim); prefill expands K and V:
    2 * heads * (qk_head_dim + v_head_dim)."""
    if not model.is_mla:
        return 4.0 * model.q_dim
    if prefill:
        return 2.0 * model.heads * (model.head_dim + model.v_head_dim)
    return 2.0 * model.heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim)


def attention_flops(model: ModelShape, context: float, prefill: bool = False) -> float:
    """Attention FLOPs of one token against `context` cached tokens, all layers; a local layer
    attends to at most sliding_window of them."""
    held_local = min(context, model.sliding_window) if model.local_layers else 0.0
    return attention_pair_flops(model, prefill) * (model.global_layers * context + model.local_layers * held_local)


def flops_per_token(model: ModelShape, context: float, include_head: bool = True) -> float:
    """Forward FLOPs of one token attending to `context` earlier tokens:
    2 * (matmul params) + attention_flops (4 * layers * q_dim * context without windows or MLA)."""
    return 2.0 * matmul_params_per_token(model, include_head) + attention_flops(model, context)


def _sum_min(past: float, tokens: float, window: float) -> float:
    """sum of min(past + i, window) for i = 1..tokens (window <= 0: no cap)."""
    a, b = past + 1, past + tokens
    if window <= 0 or b <= window:
        return tokens * (past + (tokens + 1) / 2.0)
    if a > window:
        return window * tokens
    return (a + window) * (window - a + 1) / 2.0 + window * (b - window)


def prefill_flops(model: ModelShape, tokens: int, past: int = 0) -> float:
    """FLOPs to prefill `tokens` prompt tokens (causal): linears for every token, the head only for
    the last one, attention attention_pair_flops(prefill) * sum(context) over layers, with
    sum(context) = tokens*(past + (tokens+1)/2) (a local layer's context capped at its window)."""
    lin = 2.0 * matmul_params_per_token(model, include_head=False) * tokens
    head = 2.0 * model.vocab * model.hidden
    pairs = model.global_layers * _sum_min(past, tokens, 0)
    if model.local_layers:
        pairs += model.local_layers * _sum_min(past, tokens, model.sliding_window)
    return lin + head + attention_pair_flops(model, prefill=True) * pairs


def describe(m: ModelShape, precisions: Iterable[str] = PRECISIONS, **kw) -> list[dict]:
    """One row per precision: parameters, weight GB and KV bytes/token, for tables."""
    rows = []
    for p in precisions:
        rows.append({"model": m.name, "precision": p, "params": param_count(m),
                     "active_params": param_count(m, active=True),
                     "weight_gb": weight_bytes(m, p, **kw) / 1e9,
                     "kv_bytes_per_token_bf16": kv_bytes_per_token(m, "bf16")})
    return rows

