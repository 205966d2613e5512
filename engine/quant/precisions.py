"""Precisions: converting a model's weights, the quantized layers, and exact byte accounting.

Every precision is a real conversion of the weights. An unsupported combination is refused with
a UserError; nothing is ever silently replaced by another precision.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

from engine.ops import kernels
from engine.common.errors import UserError

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4", "llm.int8", "nf4", "fp8")
GROUP_SIZES = (32, 64, 128)
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


@dataclass(frozen=True)
class QuantSpec:
    precision: str = "fp32"
    group_size: int = 64
    quantize_embeddings: bool = False
    quantize_head: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        s = self.precision + (f"-g{self.group_size}" if self.precision == "int4" else "")
        return s


def parse_precision(p: str) -> str:
    q = (p or "").strip().lower().replace("_", ".")
    aliases = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "int8.bnb": "llm.int8",
               "bnb-int8": "llm.int8", "llmint8": "llm.int8", "bnb-nf4": "nf4", "w8": "int8", "w4": "int4"}
    q = aliases.get(q, q)
    if q not in PRECISIONS:
        raise UserError(f"unknown precision '{p}'", f"choose one of: {', '.join(PRECISIONS)}")
    return q


def check_supported(spec: QuantSpec, device: str) -> None:
    """Refuse precisions the device cannot run, with the reason and the alternative."""
    dev = torch.device(device)
    if spec.precision == "int4" and spec.group_size not in GROUP_SIZES:
        raise UserError(f"int4 group size {spec.group_size} is not supported", f"use one of {GROUP_SIZES}")
    if spec.precision == "fp8":
        if dev.type != "cuda":
            raise UserError("fp8 needs an NVIDIA GPU with fp8 support (compute capability 8.9+, e.g. H100/H200/L40S); "
                            f"this run is on {dev.type}", "pick int8 or int4 on this machine, or run on a Hopper/Ada GPU")
        cap = torch.cuda.get_device_capability(dev)
        if cap < (8, 9):
            raise UserError(f"fp8 needs compute capability 8.9+, this GPU has {cap[0]}.{cap[1]}", "use int8 or int4")
    if spec.precision in ("llm.int8", "nf4"):
        try:
            import bitsandbytes  # noqa: F401
        except Exception as e:
            raise UserError(f"{spec.precision} needs bitsandbytes, which failed to import ({e})",
                            "pip install bitsandbytes, or use int8/int4") from None
    if spec.precision == "fp16" and dev.type == "cpu":
        pass  # allowed, just slow; the record shows it


# ---------------------------------------------------------------- quantized layers

class Int8Linear(nn.Module):
    """Weight-only int8 linear; the kernel reads int8 weights and dequantizes in registers."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, s = kernels.quantize_int8(weight.float())
        self.prepared = kernels.prepare_int8(q, s)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x):
        return kernels.int8_linear(x, self.prepared, self.bias)

    def weight_nbytes(self) -> int:
        return self.prepared.nbytes()


class Int4Linear(nn.Module):
    """Weight-only int4 linear, group-wise asymmetric (scale and min per group, fp16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group_size = group_size
        packed, scales, mins = kernels.quantize_int4(weight.float(), group_size)
        self.prepared = kernels.prepare_int4(packed, scales, mins, self.in_features, group_size)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x):
        return kernels.int4_linear(x, self.prepared, self.bias)

    def weight_nbytes(self) -> int:
        return self.prepared.nbytes()


class Fp8Linear(nn.Module):
    """fp8 e4m3 weight with a per-output-channel fp32 scale; activations stay bf16."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        w = weight.float()
        scale = (w.abs().amax(dim=1).clamp(min=1e-12) / 448.0)
        self.register_buffer("weight", (w / scale[:, None]).to(torch.float8_e4m3fn))
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias.to(torch.bfloat16), requires_grad=False)

    def forward(self, x):
        w = self.weight.to(x.dtype) * self.scale[:, None].to(x.dtype)
        return torch.nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def weight_nbytes(self) -> int:
        return self.weight.numel() + self.scale.numel() * 4


def _bnb_linear(weight: torch.Tensor, bias: torch.Tensor | None, precision: str, device) -> nn.Module:
    import bitsandbytes as bnb

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    n, k = weight.shape
    if precision == "nf4":
        layer = bnb.nn.Linear4bit(k, n, bias=bias is not None, quant_type="nf4", compute_dtype=torch.float32
                                  if torch.device(device).type == "cpu" else torch.bfloat16)
        layer.weight = bnb.nn.Params4bit(weight.float().contiguous(), requires_grad=False, quant_type="nf4")
    else:
        layer = bnb.nn.Linear8bitLt(k, n, bias=bias is not None, has_fp16_weights=False, threshold=6.0)
        layer.weight = bnb.nn.Int8Params(weight.float().contiguous(), requires_grad=False, has_fp16_weights=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias.float(), requires_grad=False)
    return layer.to(device)


def _bnb_nbytes(layer: nn.Module) -> int:
    w = layer.weight
    total = w.numel() * w.element_size()
    qs = getattr(w, "quant_state", None)
    if qs is not None:
        total += qs.absmax.numel() * qs.absmax.element_size()
        if getattr(qs, "state2", None) is not None:
            total += qs.state2.absmax.numel() * qs.state2.absmax.element_size() + qs.state2.code.numel() * 4
    scb = getattr(w, "SCB", None)
    if scb is not None:
        total += scb.numel() * scb.element_size()
    return total


class QuantEmbedding(nn.Module):
    """int8 rows with per-row scales: a lookup dequantizes only the rows it reads."""

    def __init__(self, weight: torch.Tensor, out_dtype):
        super().__init__()
        q, s = kernels.quantize_int8(weight.float())
        self.register_buffer("q", q)
        self.register_buffer("s", s)
        self.out_dtype = out_dtype

    def forward(self, tokens):
        return (self.q[tokens].float() * self.s[tokens, None]).to(self.out_dtype)

    def weight_nbytes(self) -> int:
        return self.q.numel() + self.s.numel() * 4


# ---------------------------------------------------------------- conversion

def compute_dtype_for(spec: QuantSpec, device) -> torch.dtype:
    if spec.precision in FLOAT_DTYPES:
        return FLOAT_DTYPES[spec.precision]
    # Quantized weights: fp32 activations on CPU (no fast bf16 there), bf16 on GPU.
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def _make_linear(lin: nn.Linear, spec: QuantSpec, device) -> nn.Module:
    w, b = lin.weight.data, None if lin.bias is None else lin.bias.data
    p = spec.precision
    if p == "int8":
        return Int8Linear(w, b)
    if p == "int4":
        return Int4Linear(w, b, spec.group_size)
    if p == "fp8":
        return Fp8Linear(w, b)
    if p in ("llm.int8", "nf4"):
        return _bnb_linear(w, b, p, device)
    raise AssertionError(p)


def quantize_model(model, spec: QuantSpec, device="cpu"):
    """Convert an fp32 model in place to `spec`; returns it. Norms and biases stay in float."""
    check_supported(spec, device)
    p = spec.precision
    cdtype = compute_dtype_for(spec, device)
    if p in FLOAT_DTYPES:
        return model.to(device=device, dtype=cdtype)
    tied = model.cfg.tie_embeddings
    if p in ("int8", "int4") and os.environ.get("SCL_FUSE", "1") != "0":  # SCL_FUSE=0: A/B benchmarks
        fuse_projections(model)
    for blk in model.model.layers:
        for parent in (blk.self_attn, blk.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, _make_linear(child.to(device), spec, device))
    if spec.quantize_head:
        # A tied head gets its own quantized copy; the embedding keeps its precision unless asked.
        model.lm_head = _make_linear(model.lm_head.to(device), spec, device)
    elif tied:
        model.lm_head = nn.Linear(model.cfg.hidden_size, model.cfg.vocab_size, bias=False)
        model.lm_head.weight = model.model.embed_tokens.weight
    if spec.quantize_embeddings:
        model.model.embed_tokens = QuantEmbedding(model.model.embed_tokens.weight.data, cdtype)
    # Remaining float parameters (norms, biases, unquantized embedding/head) in the compute dtype.
    for mod in model.modules():
        if isinstance(mod, (nn.Embedding, nn.Linear)) and not _is_bnb(mod):
            mod.to(device=device, dtype=cdtype)
        elif mod.__class__.__name__ == "RMSNorm":
            mod.to(device=device, dtype=cdtype)
    for mod in model.modules():
        if isinstance(mod, (Int8Linear, Int4Linear)) and mod.bias is not None:
            mod.bias.data = mod.bias.data.to(device)
    return model


def _stack(linears: list[nn.Linear]) -> nn.Linear:
    w = torch.cat([m.weight.data for m in linears], 0)
    has_bias = any(m.bias is not None for m in linears)
    out = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device="meta")
    out.weight = nn.Parameter(w, requires_grad=False)
    if has_bias:
        out.bias = nn.Parameter(torch.cat([m.bias.data if m.bias is not None else
                                           torch.zeros(m.out_features, dtype=w.dtype) for m in linears]),
                                requires_grad=False)
    return out


def fuse_projections(model) -> None:
    """q/k/v into one linear and gate/up into one, before quantization.

    Both our int formats quantize each output row on its own, so the fused weight holds exactly
    the rows the separate ones would: the same numbers, in fewer and larger kernel calls (a
    decode step's k and v calls were dominated by per-call overhead).
    """
    for blk in model.model.layers:
        a, m = blk.self_attn, blk.mlp
        a.qkv_proj = _stack([a.q_proj, a.k_proj, a.v_proj])
        a.q_proj = a.k_proj = a.v_proj = None
        m.gate_up_proj = _stack([m.gate_proj, m.up_proj])
        m.gate_proj = m.up_proj = None


def _is_bnb(mod) -> bool:
    return type(mod).__module__.startswith("bitsandbytes")


def _kind(name: str) -> str:
    if "embed_tokens" in name:
        return "embedding"
    if name.startswith("lm_head"):
        return "head"
    if "self_attn" in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    if "norm" in name:
        return "norm"
    return "other"


def weight_breakdown(model) -> dict[str, int]:
    """Bytes held by weights, by layer type; shared (tied) storage is counted once."""
    out: dict[str, int] = {}
    seen: set[int] = set()

    def add(kind, n):
        out[kind] = out.get(kind, 0) + n

    for name, mod in model.named_modules():
        if hasattr(mod, "weight_nbytes"):
            add(_kind(name), mod.weight_nbytes())
            if getattr(mod, "bias", None) is not None:
                add(_kind(name), mod.bias.numel() * mod.bias.element_size())
            continue
        if _is_bnb(mod) and isinstance(mod, nn.Linear):
            add(_kind(name), _bnb_nbytes(mod))
            if mod.bias is not None:
                add(_kind(name), mod.bias.numel() * mod.bias.element_size())
            continue
        if _inside_quantized(name, model):
            continue
        for pname, p in mod.named_parameters(recurse=False):
            key = p.untyped_storage().data_ptr()
            if key in seen:
                continue
            seen.add(key)
            add(_kind(f"{name}.{pname}"), p.numel() * p.element_size())
    return out


def _inside_quantized(name: str, model) -> bool:
    """Parameters of a quantized layer's children were already counted by the layer."""
    parent = name.rsplit(".", 1)[0] if "." in name else ""
    if not parent or parent == name:
        return False
    mod = model.get_submodule(parent)
    return hasattr(mod, "weight_nbytes") or (_is_bnb(mod) and isinstance(mod, nn.Linear))


def quantized_fraction(model) -> dict[str, float]:
    """Bytes of quantized layers now, and what the same layers held in fp32: for the 1/4, 1/7 checks."""
    now, fp32 = 0, 0
    for _, mod in model.named_modules():
        if isinstance(mod, (Int8Linear, Int4Linear, Fp8Linear)) or (_is_bnb(mod) and isinstance(mod, nn.Linear)):
            now += mod.weight_nbytes() if hasattr(mod, "weight_nbytes") else _bnb_nbytes(mod)
            fp32 += mod.out_features * mod.in_features * 4
    return {"quantized_bytes": now, "fp32_bytes": fp32, "ratio": (now / fp32) if fp32 else 1.0}
