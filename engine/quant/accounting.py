"""Exact byte accounting of a converted model: bytes by layer type, and the quantized layers against fp32."""
from __future__ import annotations

from typing import Mapping

from torch import nn

from engine.quant.layers import Fp8Linear, Int4Linear, Int8Linear, bnb_nbytes, is_bnb

__all__ = ["weight_breakdown", "quantized_fraction", "state_dict_param_count", "state_dict_bytes"]


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
        if is_bnb(mod) and isinstance(mod, nn.Linear):
            add(_kind(name), bnb_nbytes(mod))
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
    return hasattr(mod, "weight_nbytes") or (is_bnb(mod) and isinstance(mod, nn.Linear))


def quantized_fraction(model) -> dict[str, float]:
    """Bytes of quantized layers now, and what the same layers held in fp32: for the 1/4, 1/7 checks."""
    now, fp32 = 0, 0
    for _, mod in model.named_modules():
        if isinstance(mod, (Int8Linear, Int4Linear, Fp8Linear)) or (is_bnb(mod) and isinstance(mod, nn.Linear)):
            now += mod.weight_nbytes() if hasattr(mod, "weight_nbytes") else bnb_nbytes(mod)
            fp32 += mod.out_features * mod.in_features * 4
    return {"quantized_bytes": now, "fp32_bytes": fp32, "ratio": (now / fp32) if fp32 else 1.0}


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
