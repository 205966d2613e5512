"""Model architecture shapes and the byte arithmetic derived from them.

Nothing here loads weights. Parameter counts, weight bytes per precision and KV-cache bytes per
token are all *computed* from a few architecture numbers (data/models.json), so every figure the
planner shows can be traced back to a formula. Two checks against real checkpoints are provided:
`state_dict_param_count` / `state_dict_bytes` (sum a real state dict) and `gguf_tensor_shapes`
(read tensor shapes from a GGUF header without reading the weights).

Byte formats per quantized linear of shape (out, in), n = out*in weights:
  fp32 4n | bf16/fp16 2n
  fp8       n + 4*out          e4m3 weight, fp32 scale per output channel (engine/quant/layers.py Fp8Linear)
  int8      n + 4*out          symmetric, fp32 scale per output channel (our kernels)
  llm.int8  n + 4*out          bitsandbytes Int8Params: int8 CB + fp32 SCB per row
  int4      n/2 + 4*out*ceil(in/g)   two weights a byte, fp16 scale + fp16 min per group of g inputs
  nf4       n/2 + 4*ceil(n/64)       bitsandbytes NF4, blocksize 64, fp32 absmax per block;
            with double quantization the absmax is int8 (1 byte/block) + fp32 per 256 blocks + fp32 offset
Norms, biases, routers and whatever is not quantized stay in the base dtype (counted).
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Iterable, Mapping

from engine.common.formulas import kv_bytes_per_token as _kv_base_bytes
from engine.common.paths import DATA
from engine.common.vocab import PRECISIONS, canonical_model_name

MODELS_PATH = DATA / "models.json"

FLOAT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
NF4_BLOCKSIZE = 64          # bitsandbytes default blocksize for 4-bit (Params4bit)
NF4_DQ_BLOCKSIZE = 256      # bitsandbytes blocksize of the second-level (double) quantization


class ShapeError(ValueError):
    """A model shape or precision name that cannot be used."""


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a Llama/Qwen2/Mistral-style decoder (optionally MoE)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    max_context: int
    qkv_bias: bool = False
    qk_norm: bool = False            # Qwen3: RMSNorm of head_dim on q and k in every layer
    experts: int = 0                 # 0 = dense MLP
    active_experts: int = 0          # experts each token is routed to
    extra_linear_params: int = 0     # e.g. EAGLE's fc layer: linear weights outside the usual blocks
    hf_id: str = ""
    family: str = ""
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ catalog

def _shape_from_dict(d: Mapping) -> ModelShape:
    known = {f.name for f in fields(ModelShape)}
    kw = {k: v for k, v in d.items() if k in known}
    if "head_dim" not in kw and "hidden" in kw and "heads" in kw:
        kw["head_dim"] = kw["hidden"] // kw["heads"]
    missing = [f.name for f in fields(ModelShape) if f.name not in kw and f.default is MISSING]
    if missing:
        raise ShapeError(f"model '{d.get('name', '?')}' lacks fields: {', '.join(missing)}")
    return ModelShape(**kw)


def load_models(path: str | Path | None = None) -> dict[str, ModelShape]:
    """Read data/models.json (or `path`): {name: ModelShape}, in file order."""
    p = Path(path) if path else MODELS_PATH
    raw = json.loads(p.read_text())
    items = raw["models"] if isinstance(raw, dict) else raw
    out: dict[str, ModelShape] = {}
    for d in items:
        m = _shape_from_dict(d)
        out[m.name] = m
    return out


def get_model(name: str | ModelShape, models: Mapping[str, ModelShape] | None = None) -> ModelShape:
    """Look a model up by catalog name (case-insensitive; 'default' aliases work)."""
    if isinstance(name, ModelShape):
        return name
    models = models if models is not None else load_models()
    n = canonical_model_name(name)
    for k, m in models.items():
        if k.lower() == n or m.hf_id.lower() == n or m.hf_id.lower().split("/")[-1] == n:
            return m
    raise ShapeError(f"unknown model '{name}'; known: {', '.join(models)}")


def shape_from_hf_config(cfg: Mapping, name: str = "custom", **extra) -> ModelShape:
    """Build a shape from a Hugging Face config.json dict (Llama, Qwen2, Qwen3, Mistral, Mixtral)."""
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    arch = " ".join(cfg.get("architectures") or []) + " " + str(cfg.get("model_type", ""))
    is_qwen2 = "qwen2" in arch.lower() and "moe" not in arch.lower()
    return ModelShape(
        name=name,
        layers=int(cfg["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_context=int(cfg.get("max_position_embeddings", 0)),
        qkv_bias=bool(cfg.get("attention_bias", is_qwen2)),
        qk_norm="qwen3" in arch.lower(),
        experts=int(cfg.get("num_local_experts") or 0),
        active_experts=int(cfg.get("num_experts_per_tok") or 0),
        **extra,
    )


# ------------------------------------------------------------------ parameter counts

@dataclass(frozen=True)
class Linear:
    """One weight matrix: `count` copies of an (out, in) matrix, of a named kind."""

    kind: str        # attention | mlp | expert | extra | embedding | head
    out: int
    inp: int
    count: int = 1

    @property
    def params(self) -> int:
        return self.out * self.inp * self.count


def block_linears(m: ModelShape) -> list[Linear]:
    """The linear layers inside the transformer blocks (all layers), the ones a precision quantizes."""
    L = m.layers
    lin = [
        Linear("attention", m.q_dim, m.hidden, L),      # q_proj
        Linear("attention", m.kv_dim, m.hidden, 2 * L),  # k_proj, v_proj
        Linear("attention", m.hidden, m.q_dim, L),      # o_proj
    ]
    if m.is_moe:
        lin += [Linear("expert", m.intermediate, m.hidden, 2 * L * m.experts),   # w1 (gate), w3 (up)
                Linear("expert", m.hidden, m.intermediate, L * m.experts)]      # w2 (down)
    else:
        lin += [Linear("mlp", m.intermediate, m.hidden, 2 * L),                  # gate_proj, up_proj
                Linear("mlp", m.hidden, m.intermediate, L)]                      # down_proj
    if m.extra_linear_params:
        lin.append(Linear("extra", m.extra_linear_params, 1, 1))
    return lin


@dataclass(frozen=True)
class ParamBreakdown:
    embedding: int
    head: int            # 0 when tied (the embedding matrix is the head)
    attention: int
    mlp: int             # dense MLP, or all experts for MoE
    extra: int
    router: int
    biases: int
    norms: int

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
    biases = m.layers * (m.q_dim + 2 * m.kv_dim) if m.qkv_bias else 0
    norms = m.layers * 2 * m.hidden + m.hidden            # input + post-attention RMSNorm, final norm
    if m.qk_norm:
        norms += m.layers * 2 * m.head_dim
    router = m.layers * m.hidden * m.experts if m.is_moe else 0
    return ParamBreakdown(
        embedding=m.vocab * m.hidden,
        head=0 if m.tied_embeddings else m.vocab * m.hidden,
        attention=by["attention"],
        mlp=by["mlp"] + by["expert"],
        extra=by["extra"],
        router=router,
        biases=biases,
        norms=norms,
    )


def param_count(m: ModelShape, active: bool = False) -> int:
    """Total parameters; with active=True, those one token uses (MoE: active experts only)."""
    b = param_breakdown(m)
    if not active or not m.is_moe:
        return b.total
    inactive = b.mlp * (m.experts - m.active_experts) // m.experts
    return b.total - inactive


def matmul_params_per_token(m: ModelShape, include_head: bool = True) -> int:
    """Weights a token multiplies with (2 FLOPs each): active block linears + head. No embedding."""
    b = param_breakdown(m)
    mlp = b.mlp * m.active_experts // m.experts if m.is_moe else b.mlp
    n = b.attention + mlp + b.extra + b.router
    if include_head:
        n += m.vocab * m.hidden
    return n


# ------------------------------------------------------------------ bytes

def _check_precision(precision: str) -> str:
    p = (precision or "").strip().lower()
    if p not in PRECISIONS:
        raise ShapeError(f"unknown precision '{precision}'; choose one of {', '.join(PRECISIONS)}")
    return p


def default_base_dtype(precision: str) -> str:
    """dtype of what a precision does not quantize (norms, biases, embedding): fp32 stays fp32,
    fp16 stays fp16, everything else is served in bf16. On CPU the lab keeps fp32 (pass it)."""
    return {"fp32": "fp32", "fp16": "fp16"}.get(precision, "bf16")


def linear_bytes(out: int, inp: int, precision: str, group_size: int = 64, double_quant: bool = False,
                 count: int = 1) -> int:
    """Bytes of `count` (out, in) weight matrices stored in `precision` (formats: module docstring)."""
    p = _check_precision(precision)
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
    base = base_dtype or default_base_dtype(p)
    if base not in FLOAT_BYTES:
        raise ShapeError(f"base_dtype must be one of {', '.join(FLOAT_BYTES)}, got '{base}'")
    quantized = p not in FLOAT_BYTES
    # A float precision stores everything in itself; a quantized one keeps the rest in `base`.
    bb = FLOAT_BYTES[base] if quantized else FLOAT_BYTES[p]
    blocks = experts = 0
    for li in block_linears(m):
        b = linear_bytes(li.out, li.inp, p, group_size, double_quant, li.count)
        blocks += b
        if li.kind == "expert":
            experts += b
    pb = param_breakdown(m)
    bias_b = FLOAT_BYTES[bias_dtype] if bias_dtype else bb
    small = pb.norms * bb + pb.router * bb + pb.biases * bias_b
    emb_float = m.vocab * m.hidden * bb
    head_q = linear_bytes(m.vocab, m.hidden, p, group_size, double_quant) if quantized else emb_float
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
    only experts some token is routed to are read: with uniform routing of T tokens to k of E
    experts, the expected fraction touched is 1 - (1 - k/E)^T.
    """
    wb = weight_bytes_breakdown(model, precision, quantize_embeddings, quantize_head, group_size, **kw)
    head = wb.head if not wb.head_shares_embedding else wb.embedding
    row_bytes = wb.embedding / model.vocab
    dense = wb.blocks - wb.experts
    experts = wb.experts
    if model.is_moe and experts:
        frac = 1.0 - (1.0 - model.active_experts / model.experts) ** max(1, tokens_in_step)
        experts = experts * frac
    return dense + experts + head + wb.small + min(tokens_in_step, model.vocab) * row_bytes


_KV_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def kv_bytes_per_token(model: ModelShape, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes one token occupies: 2 (K and V) * layers * kv_heads * head_dim * bytes.

    int8/int4 KV caches also hold one fp16 scale (int4: scale and zero point) per token, layer and
    KV head; fp8 uses per-tensor scales (negligible).
    """
    k = (kv_dtype or "").strip().lower()
    if k not in _KV_BYTES:
        raise ShapeError(f"unknown KV dtype '{kv_dtype}'; choose one of {', '.join(KV_DTYPES)}")
    b = _kv_base_bytes(model.layers, model.kv_heads, model.head_dim, _KV_BYTES[k])
    per = 2 * model.layers * model.kv_heads       # K and V scale entries per token (one per layer and head)
    if k == "int8":
        b += per * 2
    elif k == "int4":
        b += per * 4
    return b


def flops_per_token(model: ModelShape, context: float, include_head: bool = True) -> float:
    """Forward FLOPs of one token attending to `context` earlier tokens:
    2 * (matmul params) + 4 * layers * q_dim * context (QK^T and AV)."""
    return 2.0 * matmul_params_per_token(model, include_head) + 4.0 * model.layers * model.q_dim * context


def prefill_flops(model: ModelShape, tokens: int, past: int = 0) -> float:
    """FLOPs to prefill `tokens` prompt tokens (causal): linears for every token, the head only for
    the last one, attention 4*layers*q_dim*sum(context) with sum(context) = tokens*(past + (tokens+1)/2)."""
    lin = 2.0 * matmul_params_per_token(model, include_head=False) * tokens
    head = 2.0 * model.vocab * model.hidden
    attn = 4.0 * model.layers * model.q_dim * tokens * (past + (tokens + 1) / 2.0)
    return lin + head + attn


# ------------------------------------------------------------------ real checkpoints

def state_dict_param_count(state_dict: Mapping) -> int:
    """Elements in a real state dict (name -> tensor); a storage shared by two names (tied
    embeddings) is counted once. Non-tensor entries are ignored."""
    return _sum_state_dict(state_dict, lambda t: t.numel())


def state_dict_bytes(state_dict: Mapping) -> int:
    """Bytes held by a real state dict's tensors (numel * element_size), shared storage once."""
    return _sum_state_dict(state_dict, lambda t: t.numel() * t.element_size())


def _sum_state_dict(sd: Mapping, f) -> int:
    seen: set = set()
    total = 0
    for t in sd.values():
        if not hasattr(t, "numel"):
            continue
        try:
            ptr = t.untyped_storage().data_ptr()
            # Meta tensors (and empty storages) all report pointer 0: never dedupe those.
            key = (ptr, t.storage_offset(), tuple(t.shape), str(t.dtype)) if ptr else ("id", id(t))
        except Exception:  # not a torch tensor (e.g. numpy): count it
            key = ("id", id(t))
        if key in seen:
            continue
        seen.add(key)
        total += int(f(t))
    return total


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a GGUF file's header (only the header is read, so the first
    chunk of a split file is enough). GGUF lists dimensions innermost first, as stored."""
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))

        def rstr():
            (n,) = rd("Q")
            return f.read(n).decode("utf-8", "replace")

        def skip_value(t):
            if t == 8:
                rstr()
            elif t == 9:
                (et,) = rd("I")
                (n,) = rd("Q")
                if et in _GGUF_SCALARS:
                    f.seek(n * struct.calcsize(_GGUF_SCALARS[et]), 1)
                else:
                    for _ in range(n):
                        skip_value(et)
            else:
                rd(_GGUF_SCALARS[t])

        if f.read(4) != b"GGUF":
            raise ShapeError(f"{path} is not a GGUF file")
        (version,) = rd("I")
        if version < 2:
            raise ShapeError(f"GGUF version {version} is too old")
        (n_tensors,) = rd("Q")
        (n_kv,) = rd("Q")
        for _ in range(n_kv):
            rstr()
            (t,) = rd("I")
            skip_value(t)
        shapes: dict[str, tuple[int, ...]] = {}
        for _ in range(n_tensors):
            name = rstr()
            (nd,) = rd("I")
            dims = rd("Q" * nd)
            rd("I")  # ggml type
            rd("Q")  # data offset
            shapes[name] = tuple(int(d) for d in dims)
        return shapes


def gguf_param_count(path: str | Path) -> int:
    return sum(math.prod(s) for s in gguf_tensor_shapes(path).values())


def describe(m: ModelShape, precisions: Iterable[str] = PRECISIONS, **kw) -> list[dict]:
    """One row per precision: parameters, weight GB and KV bytes/token, for tables."""
    rows = []
    for p in precisions:
        rows.append({"model": m.name, "precision": p, "params": param_count(m),
                     "active_params": param_count(m, active=True),
                     "weight_gb": weight_bytes(m, p, **kw) / 1e9,
                     "kv_bytes_per_token_bf16": kv_bytes_per_token(m, "bf16")})
    return rows

