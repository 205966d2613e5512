"""An off-grid copy of a model: the same function with its hidden dimensions permuted.

The lab's only offline weights are shipped GGUFs, so its fp32 reference lies on their quantization's
grid (Q4_K_M: sub-blocks of 32 weights, each d*sc*q - dmin*m), and a quantizer that lands on that grid
copies the reference instead of approximating it (llama.cpp's requantization does for 91.6% of the
1.5B's sub-blocks, docs/BENCHMARKS.md). Permuting the residual stream, each MLP's intermediate neurons
and V's dimensions within each head computes the same function in another order; every sub-block of 32
along a weight's input then holds weights of several source blocks, each with its own scale and
minimum, so it lies on no one grid. Each matrix keeps its values, its outlier columns and its rows'
distributions: unlike a rotation (QuaRot), a permutation does not spread outliers, so it does not make
quantization easier than on the source weights.

Convention: the new hidden vector is h[p] (h'_j = h_{p_j}). A linear reading the stream takes its
columns [:, p]; one writing it, its rows [p]; RMSNorm gains are permuted as the stream is (the RMS does
not depend on order). q and k keep their order (RoPE pairs their dimensions); V's dimensions within a
head move with o_proj's matching columns, identically in every head of a layer: o_proj leaves its grid
only where a head spans several groups (head_dim 64 or 128 against groups of 32; with head_dim 32 it stays).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from engine.common.errors import UserError

__all__ = ["ARCHITECTURES", "Permutation", "permute_tensors", "write_permuted"]

ARCHITECTURES = ("qwen2", "llama")  # the key layout below (model.layers.N.self_attn.*, mlp.*)
_PASS = ("rotary_emb.inv_freq",)  # buffers some checkpoints store; no hidden dimension in them
_COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "chat_template.jinja", "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model")


class Permutation:
    """The permutations of one model, drawn from one seed: the stream's, and per layer the MLP's and V's."""

    def __init__(self, config: dict, seed: int):
        kind = config.get("model_type")
        if kind not in ARCHITECTURES:
            raise UserError(f"permuting a {kind!r} model is not supported (its tensor layout is not mapped)",
                            f"use a folder of one of: {', '.join(ARCHITECTURES)}")
        if config.get("quantization_config"):
            raise UserError("this checkpoint is already quantized (config.json has quantization_config): its "
                            "packed weights cannot be permuted", "permute the unquantized (fp32/bf16) folder")
        heads = config["num_attention_heads"]
        self.head_dim = config.get("head_dim") or config["hidden_size"] // heads
        g = torch.Generator().manual_seed(seed)
        self.hidden = torch.randperm(config["hidden_size"], generator=g)
        layers = config["num_hidden_layers"]
        self.mlp = [torch.randperm(config["intermediate_size"], generator=g) for _ in range(layers)]
        self.v = [torch.randperm(self.head_dim, generator=g) for _ in range(layers)]

    def within_heads(self, layer: int, width: int) -> torch.Tensor:
        """Indices of V's permutation applied in every head of `width` = heads * head_dim dimensions."""
        heads = width // self.head_dim
        return (torch.arange(heads)[:, None] * self.head_dim + self.v[layer][None, :]).reshape(-1)


def _permute_one(name: str, t: torch.Tensor, perm: Permutation) -> torch.Tensor:
    """The tensor `name` of the permuted model (see the module docstring for which side of each moves)."""
    p = perm.hidden
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return t[:, p].contiguous()
    if name == "model.norm.weight":
        return t[p].contiguous()
    parts = name.split(".")
    if name.endswith(_PASS):
        return t
    if len(parts) < 5 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        raise UserError(f"tensor {name} has no place in the permuted model's layout",
                        f"permute a plain {' / '.join(ARCHITECTURES)} checkpoint (no extra tensors)")
    layer, rest = int(parts[2]), ".".join(parts[3:])
    weight = rest.endswith(".weight")
    if rest in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        return t[p].contiguous()
    if rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
        return t[:, p].contiguous()
    if rest in ("self_attn.q_proj.bias", "self_attn.k_proj.bias"):
        return t
    if rest.startswith("self_attn.v_proj."):
        rows = perm.within_heads(layer, t.shape[0])
        return t[rows][:, p].contiguous() if weight else t[rows].contiguous()
    if rest.startswith("self_attn.o_proj."):
        return t[p][:, perm.within_heads(layer, t.shape[1])].contiguous() if weight else t[p].contiguous()
    if rest.startswith(("mlp.gate_proj.", "mlp.up_proj.")):
        return t[perm.mlp[layer]][:, p].contiguous() if weight else t[perm.mlp[layer]].contiguous()
    if rest.startswith("mlp.down_proj."):
        return t[p][:, perm.mlp[layer]].contiguous() if weight else t[p].contiguous()
    raise UserError(f"tensor {name} has no place in the permuted model's layout",
                    f"permute a plain {' / '.join(ARCHITECTURES)} checkpoint (no extra tensors)")


def permute_tensors(tensors: dict[str, torch.Tensor], config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of a Qwen2/Llama state dict, permuted (a new dict; the input is not changed)."""
    perm = Permutation(config, seed)
    return {k: _permute_one(k, v, perm) for k, v in tensors.items()}


def write_permuted(src: Path, dst: Path, seed: int, progress=None) -> Path:
    """`dst`: the folder `src` with its weights permuted (one model.safetensors) and its config and tokenizer
    copied; permutation.json says from what. Written beside and renamed, so a stopped run leaves no folder."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    say = progress or (lambda s: None)
    src, dst = Path(src), Path(dst)
    if (dst / "permutation.json").is_file():
        return dst
    config = json.loads((src / "config.json").read_text())
    perm = Permutation(config, seed)
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise UserError(f"{src} holds no *.safetensors", "point at a Hugging Face folder with safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                out[k] = _permute_one(k, h.get_tensor(k), perm)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    say(f"writing {len(out)} permuted tensors to {dst}")
    save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in _COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    (tmp / "permutation.json").write_text(json.dumps(
        {"source": str(src), "seed": seed, "permuted": "the residual stream (embedding and head columns, norms, "
         "q/k/v/gate/up columns, o/down rows), each layer's MLP neurons, V's dimensions within each head"}, indent=1))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst
