"""A model's own llama.cpp GGUF weights on our kernels: int4 codes read from its 4-bit blocks, not requantized.

llama.cpp's 4-bit types all fit our int4 format (engine.ops.formats: w = q * scale + min, q in 0..15, an fp16
scale and min per group of 32):
  Q4_K  super-blocks of 256 = 8 sub-blocks of 32: w = d * sc * q - dmin * m (d, dmin fp16; sc, m 6-bit);
        scale = d * sc, min = -dmin * m
  Q4_1  blocks of 32: w = d * q + m;                scale = d, min = m (exact)
  Q4_0  blocks of 32: w = d * (q - 8);              scale = d, min = -8 d (exact)
The nibbles are kept as they are. d * sc and dmin * m are rounded to fp16 (at most 2^-11 of the value, so a
weight moves by at most 1/128 of a step): the one place the file's grid is not reproduced bit for bit.

Tensors at 5 to 8 bits or in float (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, F16, BF16, F32; Q4_K_M keeps attn_v and half
of ffn_down at Q6_K) cannot be int4 without requantizing them to fewer bits: they are kept at our int8
(per-channel, from the file's dequantized weights), and counted. Other types (2-3 bit K-quants, the IQ
codebooks) are refused by name. The q/k rows of Llama-family GGUFs are permuted by llama.cpp's converter,
so only architectures it does not permute are read.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from engine.common.errors import UserError
from engine.quant.gguf_file import read_gguf
from engine.quant.gptq import pack_codes

__all__ = ["GgufCodes", "read_gguf_codes", "decode_int4_blocks", "hf_name", "gguf_name", "INT4_TYPES", "INT8_TYPES"]

INT4_TYPES = ("Q4_K", "Q4_1", "Q4_0")  # read into our int4 exactly (group 32)
INT8_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16", "F32")  # more bits than int4: kept at int8
READ_ARCHS = ("qwen2", "qwen3")  # llama.cpp's converter leaves their q/k rows in Hugging Face order

_HF_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_TO_GGUF = {v: k for k, v in _HF_LAYER.items()}


def hf_name(gguf_tensor: str) -> str:
    """The Hugging Face (Qwen2/Llama) name of a GGUF tensor: 'blk.3.attn_v.weight' is
    'model.layers.3.self_attn.v_proj.weight'."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if gguf_tensor in fixed:
        return fixed[gguf_tensor]
    parts = gguf_tensor.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _HF_LAYER:
        raise UserError(f"no Hugging Face name for the GGUF tensor {gguf_tensor}", "extend hf_name for this model")
    return f"model.layers.{parts[1]}.{_HF_LAYER[parts[2]]}.{parts[3]}"


def gguf_name(module: str) -> str | None:
    """The GGUF weight behind one of our linear layers (Hugging Face module names), or None."""
    if module == "lm_head":
        return "output.weight"
    parts = module.split(".")
    if len(parts) >= 5 and parts[0] == "model" and parts[1] == "layers":
        kind = _TO_GGUF.get(".".join(parts[3:]))
        return f"blk.{parts[2]}.{kind}.weight" if kind else None
    return None


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per entry (last axis) as float32 values of their fp16."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def decode_int4_blocks(raw: np.ndarray, kind: str, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One GGUF tensor's raw bytes (uint8 [n, bytes per row]) of a 4-bit type -> our canonical
    (packed uint8 [n, k/2], scales fp16 [n, k/32], mins fp16 [n, k/32])."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(n, -1)
    if kind == "Q4_K":
        b = raw.reshape(n, k // 256, 144)
        d, dmin, sm, qs = _f16(b[..., 0:2]), _f16(b[..., 2:4]), b[..., 4:16].astype(np.int32), b[..., 16:]
        sc = np.concatenate([sm[..., 0:4] & 63, (sm[..., 8:12] & 0xF) | ((sm[..., 0:4] >> 6) << 4)], -1)
        mn = np.concatenate([sm[..., 4:8] & 63, (sm[..., 8:12] >> 4) | ((sm[..., 4:8] >> 6) << 4)], -1)
        q = qs.reshape(n, k // 256, 4, 1, 32)  # 64 weights per 32 bytes: 32 low nibbles, then 32 high
        q = np.concatenate([q & 0xF, q >> 4], axis=3).reshape(n, k)
        scales = (d[..., None] * sc).reshape(n, -1)
        mins = -(dmin[..., None] * mn).reshape(n, -1)
    elif kind in ("Q4_0", "Q4_1"):
        size = 18 if kind == "Q4_0" else 20
        b = raw.reshape(n, k // 32, size)
        d = _f16(b[..., 0:2])
        qs = b[..., size - 16:]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(n, k)  # weights 0..15 low, 16..31 high
        scales = d
        mins = -8.0 * d if kind == "Q4_0" else _f16(b[..., 2:4])
    else:
        raise ValueError(kind)
    def f16(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float16)

    return pack_codes(torch.from_numpy(q.astype(np.uint8))), f16(scales), f16(mins)


@dataclass
class GgufCodes:
    """What the loader needs: int4 codes per linear, the linears kept at int8, and the file's types."""

    codes: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    keep_int8: set[str] = field(default_factory=set)
    types: dict[str, Counter] = field(default_factory=lambda: {"int4": Counter(), "int8": Counter()})

    def words(self) -> str:
        """'169 linears at int4 (Q4_K 168 ...), 29 at int8 (Q6_K 29)'."""
        def part(c):
            return ", ".join(f"{t} {n}" for t, n in sorted(c.items()))
        return (f"{sum(self.types['int4'].values())} linears at int4 ({part(self.types['int4'])}), "
                f"{sum(self.types['int8'].values())} at int8 ({part(self.types['int8'])})")


def read_gguf_codes(path: Path, model, check: bool = True) -> GgufCodes:
    """The int4 codes of `model`'s linears from the GGUF it was converted from. With `check`, each int4
    tensor's codes must reproduce the model's fp32 weight (within the fp16 rounding of its scales): a GGUF
    that is not the folder's is refused, never run as if it were."""
    gguf = read_gguf(path)
    arch = gguf.metadata.get("general.architecture", "?")
    if arch not in READ_ARCHS:
        raise UserError(f"{Path(path).name}: int4-gguf reads {', '.join(READ_ARCHS)} GGUFs; this one is {arch!r} "
                        "(llama.cpp's converter permutes its q/k rows)",
                        "load it at int4-gptq or int4 (requantized from its weights), or int8")
    tensors = gguf.tensors
    out = GgufCodes()
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for name in names:
        gname = gguf_name(name)
        if gname is None:
            raise UserError(f"int4-gguf: the linear {name} has no GGUF tensor name (an MoE expert or an unknown "
                            "layer)", "load this model at int4-gptq or int4")
        if gname == "output.weight" and gname not in tensors:  # a tied head reads the embedding
            gname = "token_embd.weight"
        t = tensors.get(gname)
        if t is None:
            raise UserError(f"{Path(path).name} has no tensor {gname} for {name}",
                            "give the GGUF this model was converted from")
        kind = t.tensor_type.name
        w = model.get_submodule(name).weight.data
        n, k = w.shape
        if tuple(int(x) for x in t.shape) != (k, n):
            raise UserError(f"{Path(path).name}: {gname} has shape {list(t.shape)}, {name} is [{n}, {k}]",
                            "give the GGUF this model was converted from")
        if kind in INT4_TYPES:
            codes = decode_int4_blocks(t.data, kind, n, k)
            if check:
                _check_codes(codes, w, f"{Path(path).name} {gname} ({kind})")
            out.codes[name] = codes
            out.types["int4"][kind] += 1
        elif kind in INT8_TYPES:
            out.keep_int8.add(name)
            out.types["int8"][kind] += 1
        else:
            raise UserError(f"{Path(path).name}: {gname} is {kind}, which int4-gguf does not read (it reads "
                            f"{', '.join(INT4_TYPES)} as int4 and keeps {', '.join(INT8_TYPES)} at int8)",
                            "load the model at int4-gptq or int4, or use a Q4_K_M/Q4_0 GGUF")
    return out


def _check_codes(codes, w: torch.Tensor, what: str) -> None:
    from engine.ops.formats import unpack_int4

    packed, scales, mins = codes
    N, G = scales.shape
    s, m = scales.float()[:, :, None], mins.float()[:, :, None]
    q = unpack_int4(packed).view(N, G, 32).float()  # int4-gguf's groups are llama.cpp's blocks of 32
    # dequantize_int4's values (q * scale, then + min, in fp32), compared group by group in place (llama.cpp's
    # 4-bit rows are whole blocks: K = 32 G)
    diff = q.mul_(s).add_(m).sub_(w.float().view(N, G, 32)).abs_()
    # fp16 scales and mins: a weight moves by at most ~2^-11 of (15 |scale| + |min|), far below one step
    bound = (15 * s.abs() + m.abs()) * 2 ** -10 + 1e-12
    bad = diff > bound
    if bool(bad.any()):
        r, g, j = (int(i) for i in bad.nonzero()[0])
        c = g * 32 + j
        got = float(unpack_int4(packed[r:r + 1])[0, c].float() * s[r, g, 0] + m[r, g, 0])
        raise UserError(f"{what} does not hold the model's weight: row {r} column {c} is {got:.6g} "
                        f"in the GGUF and {float(w[r, c]):.6g} in the folder",
                        "give the GGUF this folder was converted from (the catalog's own, for catalog models)")
