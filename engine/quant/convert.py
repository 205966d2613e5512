"""Converting a model to a precision: the spec, what the device can run, and the conversion itself.

Every precision is a real conversion of the weights. An unsupported combination is refused with
a UserError; nothing is ever silently replaced by another precision.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from engine import ops
from engine.common.errors import UserError
from engine.common.vocab import (BNB_PRECISIONS, GROUP_SIZES, METHOD_GROUP, QUANT_METHODS, parse_precision_spec,
                                 precision_token)
from engine.quant.layers import Fp8Linear, HalfEmbedding, Int4Linear, Int8Linear, QuantEmbedding, bnb_linear, is_bnb

__all__ = ["FLOAT_DTYPES", "QuantSpec", "make_spec", "check_supported", "compute_dtype_for", "quantize_model",
           "hold_floats_as_stored", "fuse_projections"]

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class QuantSpec:
    precision: str = "fp32"
    group_size: int = 64
    quantize_embeddings: bool = False
    quantize_head: bool = True
    method: str = "rtn"  # int4 only: rtn | gptq | awq | gptq-mixed | checkpoint | gguf (vocab.QUANT_METHODS)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        """'int4-g64' (round-to-nearest, as records have always said), 'int4-gptq-g64', 'int8'."""
        return precision_token(self.precision, self.method, self.group_size)

    @property
    def calibrated(self) -> bool:
        """int4 codes that are not this process's round-to-nearest: calibrated, or read from a checkpoint or GGUF."""
        return self.precision == "int4" and self.method != "rtn"


def make_spec(precision: str = "fp32", group_size: int = 64, quantize_embeddings: bool = False,
              quantize_head: bool = True, method: str = "rtn") -> QuantSpec:
    """A QuantSpec from user input: the precision may be an alias or carry its method and group ('int4-gptq-g32')."""
    p, m, g = parse_precision_spec(precision, int(group_size))
    if m == "rtn" and method != "rtn":
        if method not in QUANT_METHODS:
            raise UserError(f"unknown quantization method {method!r}", f"use one of: {', '.join(QUANT_METHODS)}")
        m = method
    return QuantSpec(p, int(g), bool(quantize_embeddings), bool(quantize_head), m if p == "int4" else "rtn")


def check_supported(spec: QuantSpec, device: str) -> None:
    """Refuse precisions the device cannot run, with the reason and the alternative."""
    dev = torch.device(device)
    if spec.method not in QUANT_METHODS or (spec.method != "rtn" and spec.precision != "int4"):
        raise UserError(f"quantization method {spec.method!r} with {spec.precision}",
                        f"use int4 with one of: {', '.join(QUANT_METHODS)}")
    if spec.precision == "int4" and spec.group_size not in GROUP_SIZES:
        raise UserError(f"int4 group size {spec.group_size} is not supported", f"use one of {GROUP_SIZES}")
    own = METHOD_GROUP.get(spec.method)
    if spec.precision == "int4" and own and spec.group_size != own:
        raise UserError(f"int4-{spec.method} holds groups of {own} (the format's own blocks); group size "
                        f"{spec.group_size} was asked", f"use int4-{spec.method}-g{own} (or int4-{spec.method})")
    if spec.precision == "fp8":
        if dev.type != "cuda":
            raise UserError("fp8 needs an NVIDIA GPU with fp8 support (compute capability 8.9+, e.g. H100/H200/L40S); "
                            f"this run is on {dev.type}",
                            "pick int8 or int4 on this machine, or run on a Hopper/Ada GPU")
        cap = torch.cuda.get_device_capability(dev)
        if cap < (8, 9):
            raise UserError(f"fp8 needs compute capability 8.9+, this GPU has {cap[0]}.{cap[1]}", "use int8 or int4")
    if spec.precision in BNB_PRECISIONS:
        try:
            import bitsandbytes  # noqa: F401
        except Exception as e:
            raise UserError(f"{spec.precision} needs bitsandbytes, which failed to import ({e})",
                            "pip install bitsandbytes, or use int8/int4") from None
    if spec.precision == "fp16" and dev.type == "cpu":
        pass  # allowed, just slow; the record shows it


def compute_dtype_for(spec: QuantSpec, device) -> torch.dtype:
    if spec.precision in FLOAT_DTYPES:
        return FLOAT_DTYPES[spec.precision]
    # Quantized weights: fp32 activations on CPU (no fast bf16 there), bf16 on GPU.
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def _make_linear(lin: nn.Linear, spec: QuantSpec, device, name: str = "") -> nn.Module:
    w, b = lin.weight.data, None if lin.bias is None else lin.bias.data
    p = spec.precision
    if p == "int8":
        return Int8Linear(w, b)
    if p == "int4" and getattr(lin, "keep_int8", False):
        return Int8Linear(w, b)
    if p == "int4":
        codes = getattr(lin, "codes", None)
        if spec.calibrated and codes is None:  # never silently round-to-nearest under a calibrated label
            raise UserError(f"{spec.label}: layer {name or '?'} has no calibrated weights",
                            "recalibrate: remove this model's entry under the cache's quantized/ folder")
        perm = getattr(lin, "in_perm", None)
        return Int4Linear(w, b, spec.group_size, codes, None if perm is None else perm.to(device))
    if p == "fp8":
        return Fp8Linear(w, b)
    if p in BNB_PRECISIONS:
        return bnb_linear(w, b, p, device)
    raise AssertionError(p)


def quantize_model(model, spec: QuantSpec, device="cpu", codes: dict | None = None, keep_int8=()):
    """Convert an fp32 model in place to `spec`; returns it. Norms and biases stay in float.

    `codes`: a calibrated method's int4 result per linear, {name: (packed, scales, mins)}, by the checkpoint's
    (unfused) names; fusing q/k/v and gate/up stacks them row-wise, which is exact (rows are independent).
    `keep_int8`: linears of a mixed-precision int4 model kept at int8 (a fused group fuses only when its
    members agree).

    At fp32/bf16/fp16 on CPU every linear becomes an ops.DenseLinear on the same parameters: decode-sized
    M runs the C++ dense kernel (bf16, fp32; fp16 stays on torch). Quantized models keep their float
    leftovers (an unquantized head, an MoE router) as plain nn.Linear."""
    check_supported(spec, device)
    if spec.calibrated and not codes:
        raise UserError(f"{spec.label} needs its calibrated weights", "load it through engine.infer.loader.load")
    for name, c in (codes or {}).items():
        lin = model.get_submodule(name)
        lin.codes = c[:3]
        if len(c) > 3:  # an act-order checkpoint's input order (engine/quant/checkpoints.py)
            lin.in_perm = c[3]
    for name in keep_int8:
        model.get_submodule(name).keep_int8 = True
    model = _convert(model, spec, device)
    if spec.precision in FLOAT_DTYPES and torch.device(device).type == "cpu":
        ops.adopt_dense_linears(model)
    return model


def _convert(model, spec: QuantSpec, device):
    p = spec.precision
    cdtype = compute_dtype_for(spec, device)
    if p in FLOAT_DTYPES:
        return model.to(device=device, dtype=cdtype)
    tied = model.cfg.tie_embeddings
    if p in ("int8", "int4") and ops.kernel_config().fuse:  # fuse=False (SCL_FUSE=0): A/B benchmarks
        fuse_projections(model)
    for blk in model.model.layers:
        for parent in (blk.self_attn, *_dense_mlps(blk)):  # an MoE block's router stays float
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, _make_linear(child.to(device), spec, device, name))
    if spec.quantize_head:
        # A tied head gets its own quantized copy; the embedding keeps its precision unless asked.
        model.lm_head = _make_linear(model.lm_head.to(device), spec, device, "lm_head")
    elif tied:
        model.lm_head = nn.Linear(model.cfg.hidden_size, model.cfg.vocab_size, bias=False)
        model.lm_head.weight = model.model.embed_tokens.weight
    if spec.quantize_embeddings:
        model.model.embed_tokens = QuantEmbedding(model.model.embed_tokens.weight.data, cdtype)
    # Remaining float parameters (norms, biases, unquantized embedding/head) in the compute dtype.
    for mod in model.modules():
        if isinstance(mod, (nn.Embedding, nn.Linear)) and not is_bnb(mod):
            mod.to(device=device, dtype=cdtype)
        elif mod.__class__.__name__ == "RMSNorm":
            mod.to(device=device, dtype=cdtype)
    for mod in model.modules():
        if isinstance(mod, (Int8Linear, Int4Linear)) and mod.bias is not None:
            mod.bias.data = mod.bias.data.to(device)
    return model


def hold_floats_as_stored(model, head_dtype: torch.dtype | None, embed_dtype: torch.dtype | None = None) -> list[str]:
    """A quantized checkpoint's dense fp32 head and embedding held in the half precision its checkpoint stores them
    in (bf16 or fp16) instead of fp32: half the bytes, the same values (they were widened from it; checked). The head
    runs as ops.dense_linear's fp32 linear of those values, a lookup widens the rows it reads. A tied pair stays one
    tensor. Returns what it held: "head", "embedding"."""
    held = []
    head, emb = model.lm_head, model.model.embed_tokens
    tied = type(emb) is nn.Embedding and head.weight is emb.weight
    w = _as_stored(head.weight.data, head_dtype) if type(head) is nn.Linear and head.bias is None else None
    if w is not None:
        model.lm_head = ops.DenseLinear(head.in_features, head.out_features, bias=False, device="meta")
        model.lm_head.weight = nn.Parameter(w, requires_grad=False)
        held.append("head")
        if tied:
            model.model.embed_tokens = HalfEmbedding(model.lm_head.weight)
            held.append("embedding")
    if not tied and type(emb) is nn.Embedding:
        w = _as_stored(emb.weight.data, embed_dtype)
        if w is not None:
            model.model.embed_tokens = HalfEmbedding(nn.Parameter(w, requires_grad=False))
            held.append("embedding")
    return held


def _as_stored(w: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor | None:
    """w (fp32 on CPU) in a half-precision dtype when that holds exactly its values; else None."""
    if dtype not in ops.dense.HALF_WEIGHTS or w.dtype != torch.float32 or w.device.type != "cpu":
        return None
    half = w.to(dtype)
    return half if torch.equal(half.float(), w) else None  # never silently rounded: not the checkpoint's values


def _dense_mlps(blk) -> list:
    """The plain MLPs of a block: its MLP, or each expert of a mixture of experts (engine/infer/moe.py,
    read by duck typing: quant does not import infer). The MoE router (`mlp.gate`) is not among them: it
    stays float, so routing does not move with the weights' rounding."""
    experts = getattr(blk.mlp, "experts", None)
    return list(experts) if experts is not None else [blk.mlp]


def _stack(linears: list[nn.Linear]) -> nn.Linear:
    w = torch.cat([m.weight.data for m in linears], 0)
    has_bias = any(m.bias is not None for m in linears)
    out = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device="meta")
    out.weight = nn.Parameter(w, requires_grad=False)
    if getattr(linears[0], "keep_int8", False):
        out.keep_int8 = True
    parts = [getattr(m, "codes", None) for m in linears]
    if all(c is not None for c in parts):  # calibrated int4 codes stack as the rows do
        out.codes = tuple(torch.cat(t, 0) for t in zip(*parts))
    if getattr(linears[0], "in_perm", None) is not None:  # one input order (_agree)
        out.in_perm = linears[0].in_perm
    if has_bias:
        out.bias = nn.Parameter(torch.cat([m.bias.data if m.bias is not None else
                                           torch.zeros(m.out_features, dtype=w.dtype) for m in linears]),
                                requires_grad=False)
    return out


def fuse_projections(model) -> None:
    """q/k/v into one linear and gate/up into one (per expert in an MoE block), before quantization.

    Both our int formats quantize each output row on its own, so the fused weight holds exactly
    the rows the separate ones would: the same numbers, in fewer and larger kernel calls (a
    decode step's k and v calls were dominated by per-call overhead).
    """
    for blk in model.model.layers:
        a = blk.self_attn
        if _agree([a.q_proj, a.k_proj, a.v_proj]):
            a.qkv_proj = _stack([a.q_proj, a.k_proj, a.v_proj])
            a.q_proj = a.k_proj = a.v_proj = None
        for m in _dense_mlps(blk):  # every expert of an MoE block, like a dense MLP
            if _agree([m.gate_proj, m.up_proj]):
                m.gate_up_proj = _stack([m.gate_proj, m.up_proj])
                m.gate_proj = m.up_proj = None


def _agree(linears: list[nn.Linear]) -> bool:
    """Linears fuse only into one format (all kept at int8, mixed precision, or none) and one input order (an
    act-order checkpoint's q/k/v read one Hessian, so one order, unless its diagonal ties were broken apart)."""
    perms = [getattr(m, "in_perm", None) for m in linears]
    same_order = all(p is None for p in perms) or all(p is not None and torch.equal(p, perms[0]) for p in perms)
    return len({bool(getattr(m, "keep_int8", False)) for m in linears}) == 1 and same_order
