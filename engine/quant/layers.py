"""The quantized layers: our int8 / int4 (engine.ops kernels), fp8 weight-only, bitsandbytes, and int8 embeddings.

Each layer answers `weight_nbytes()` with the exact bytes it holds (engine.quant.accounting).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from engine import ops

__all__ = ["Int8Linear", "Int4Linear", "Fp8Linear", "QuantEmbedding", "bnb_linear", "bnb_nbytes", "is_bnb"]


class Int8Linear(nn.Module):
    """Weight-only int8 linear; the kernel reads int8 weights and dequantizes in registers."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, s = ops.quantize_int8_at_load(weight)
        self.prepared = ops.prepare_int8(q, s)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x):
        return ops.int8_linear(x, self.prepared, self.bias)

    def weight_nbytes(self) -> int:
        return self.prepared.nbytes()


class Int4Linear(nn.Module):
    """Weight-only int4 linear, group-wise asymmetric (scale and min per group, fp16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int, codes=None,
                 in_perm: torch.Tensor | None = None):
        """Round-to-nearest from `weight`, or exactly `codes` = (packed, scales, mins) in the canonical format
        (engine.ops.formats): a calibrated method's result for this weight. `in_perm`: the codes' input order
        (an act-order checkpoint's, engine/quant/checkpoints.py): x[..., in_perm] is what they multiply."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group_size = group_size
        packed, scales, mins = codes if codes is not None else ops.quantize_int4_at_load(weight, group_size)
        self.prepared = ops.prepare_int4(packed, scales, mins, self.in_features, group_size)
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        self.register_buffer("in_perm", None if in_perm is None else in_perm.to(torch.int32).contiguous())

    def forward(self, x):
        if self.in_perm is not None:
            x = x.index_select(-1, self.in_perm)
        return ops.int4_linear(x, self.prepared, self.bias)

    def weight_nbytes(self) -> int:
        return self.prepared.nbytes() + (0 if self.in_perm is None else self.in_perm.numel() * 4)


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


def bnb_linear(weight: torch.Tensor, bias: torch.Tensor | None, precision: str, device) -> nn.Module:
    """A bitsandbytes layer: Linear4bit NF4 ("nf4") or Linear8bitLt LLM.int8 ("llm.int8")."""
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


def bnb_nbytes(layer: nn.Module) -> int:
    """Bytes a bitsandbytes layer's weight holds: the packed weight, absmax (and nested state), SCB."""
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


def is_bnb(mod) -> bool:
    return type(mod).__module__.startswith("bitsandbytes")


class HalfEmbedding(nn.Module):
    """An embedding held in the half precision a checkpoint stores it in (bf16 or fp16); a lookup widens the
    rows it reads to fp32, exactly. Tied to a dense head, both read one Parameter."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight

    def forward(self, tokens):
        return nn.functional.embedding(tokens, self.weight).float()


class QuantEmbedding(nn.Module):
    """int8 rows with per-row scales: a lookup dequantizes only the rows it reads."""

    def __init__(self, weight: torch.Tensor, out_dtype):
        super().__init__()
        q, s = ops.quantize_int8_at_load(weight)
        self.register_buffer("q", q)
        self.register_buffer("s", s)
        self.out_dtype = out_dtype

    def forward(self, tokens):
        return (self.q[tokens].float() * self.s[tokens, None]).to(self.out_dtype)

    def weight_nbytes(self) -> int:
        return self.q.numel() + self.s.numel() * 4
