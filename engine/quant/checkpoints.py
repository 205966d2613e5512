"""A user's already-quantized checkpoint, read into our int4 format exactly, or refused by name.

Read: compressed-tensors "pack-quantized" W4A16 (what llm-compressor's GPTQ/AWQ recipes save, and
what vLLM serves): per linear `weight_packed` int32 [N, K/8] (column j in word j // 8 at bits
4 * (j % 8), stored as value + 8), `weight_scale` [N, K/gs], `weight_shape` [N, K], and for
asymmetric schemes `weight_zero_point` int32 [ceil(N/8), K/gs] packed the same way along the rows;
w = (value - zero) * scale.

Into ours (engine.ops.formats: w = q * scale + min with q in 0..15): q = value + 8 is the stored
nibble, scale is the checkpoint's (bf16 and fp32 scales are checked to be exact in fp16), and
min = -(8 + zero) * scale. Symmetric: min = -8 * scale, exact. Asymmetric: the product is rounded
to fp16, at most 2^-11 of |min|, so at most 1/128 of one quantization step: the one place the
stored grid is not reproduced bit for bit (docs/MODELS.md says so).

GPTQ (AutoGPTQ / GPTQModel, quant_method "gptq"): per linear `qweight` int32 [K/8, N] (input k in
word k // 8 at bits 4 * (k % 8)), `qzeros` int32 [G, N/8] (output n in word n // 8, same bits), `scales`
[G, N], `g_idx` [K]; w = (q - zero) * scale. checkpoint_format "gptq" (v1, the default) stores zero - 1
(a zero of 0 reads 16, as every v1 kernel computes it), "gptq_v2" the zero itself. A g_idx of k // group
(desc_act off, or act-order with static groups) is read as is. A permuted one (act-order: groups formed in
the order of the Hessian's diagonal) is reordered at load: the input columns sorted by group (stable), so
each group's columns are consecutive, and the permutation kept with the codes; the layer gathers its
input the same way (x[..., perm]) before the int4 kernel, and the fused C++ step declines such a model (its
PyTorch path runs it). Each group must hold `group` columns.

AWQ (AutoAWQ, quant_method "awq", version "gemm"): `qweight` int32 [K, N/8] and `qzeros` [G, N/8] packed
along the outputs in AWQ's order (nibble i of a word holds output 8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]),
`scales` [G, N]; w = (q - zero) * scale.

Into ours for both: q is the stored nibble, scale the checkpoint's (checked exact in fp16) and
min = -zero * scale rounded to fp16 (at most 2^-11 of |min|, as for compressed-tensors asymmetric).

Refused by name with the field: other formats (AWQ's GEMV/Marlin/ExLlama layouts, GPTQ's Marlin), other
bit widths, activation quantization, a g_idx with groups of unequal sizes, group sizes our kernels lack.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.common.errors import UserError
from engine.common.vocab import GROUP_SIZES

__all__ = ["CheckpointScheme", "read_scheme", "unpack_checkpoint"]

READ_FORMATS = ("pack-quantized",)
GPTQ_FORMATS = ("gptq", "gptq_v2")  # checkpoint_format: v1 stores zero - 1
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds output 8c + AWQ_ORDER[i]


@dataclass(frozen=True)
class CheckpointScheme:
    """What a quantized checkpoint holds: its format, group size and symmetry, and the modules left dense."""

    quant_method: str
    format: str
    group_size: int
    symmetric: bool
    ignore: tuple[str, ...]

    @property
    def words(self) -> str:
        return f"{self.quant_method} {self.format} W4A16 g{self.group_size} " + ("sym" if self.symmetric else "asym")


def _refuse(source: str, field: str, value, fix: str):
    raise UserError(f"{source}: config field 'quantization_config.{field}' = {value!r} is not a quantized format "
                    "the lab reads exactly", fix)


_FIX = ("give a compressed-tensors pack-quantized W4A16 checkpoint (llm-compressor's output), a GPTQ (AutoGPTQ/"
        "GPTQModel) or AWQ GEMM (AutoAWQ) 4-bit checkpoint, or the unquantized checkpoint for the lab to quantize "
        "(--precision int4-gptq)")


def _group(qc: dict, source: str, field: str) -> int:
    g = qc.get(field)
    if g not in GROUP_SIZES:
        _refuse(source, field, g, f"our int4 kernels have group sizes {', '.join(map(str, GROUP_SIZES))}"
                + (" (-1 is one group per row)" if g == -1 else ""))
    return int(g)


def _gptq_scheme(qc: dict, source: str) -> CheckpointScheme:
    if qc.get("bits") != 4:
        _refuse(source, "bits", qc.get("bits"), "give a 4-bit GPTQ checkpoint")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in GPTQ_FORMATS:
        _refuse(source, "checkpoint_format", fmt, f"give a GPTQ checkpoint in format {' or '.join(GPTQ_FORMATS)}")
    gs = _group(qc, source, "group_size")
    return CheckpointScheme("gptq", fmt, gs, bool(qc.get("sym", True)), tuple(qc.get("modules_to_not_convert") or ()))


def _awq_scheme(qc: dict, source: str) -> CheckpointScheme:
    if (qc.get("bits") or qc.get("w_bit")) != 4:
        _refuse(source, "bits", qc.get("bits"), "give a 4-bit AWQ checkpoint")
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        _refuse(source, "version", qc.get("version"), "give an AWQ checkpoint saved in the GEMM layout (version gemm)")
    if qc.get("zero_point", True) is not True:
        _refuse(source, "zero_point", qc.get("zero_point"), "give an AWQ GEMM checkpoint with zero points")
    gs = _group(qc, source, "group_size" if "group_size" in qc else "q_group_size")
    return CheckpointScheme("awq", "gemm", gs, False, tuple(qc.get("modules_to_not_convert") or ()))


def read_scheme(qc: dict, source: str = "config.json") -> CheckpointScheme:
    """The scheme of a config.json's quantization_config; a UserError names the first field we do not read."""
    fix = _FIX
    method = qc.get("quant_method")
    if method == "gptq":
        return _gptq_scheme(qc, source)
    if method == "awq":
        return _awq_scheme(qc, source)
    if method != "compressed-tensors":
        _refuse(source, "quant_method", method, fix)
    fmt = qc.get("format")
    if fmt not in READ_FORMATS:
        _refuse(source, "format", fmt, fix)
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        _refuse(source, "config_groups", sorted(groups),
                "give a checkpoint with one quantization scheme for every linear")
    (gname, g), = groups.items()
    if (g.get("format") or fmt) != fmt:
        _refuse(source, f"config_groups.{gname}.format", g.get("format"), fix)
    if g.get("input_activations") or g.get("output_activations"):
        _refuse(source, f"config_groups.{gname}.input_activations", g.get("input_activations"),
                "the lab's int4 is weight-only (W4A16): give a checkpoint without activation quantization")
    w = g.get("weights") or {}
    where = f"config_groups.{gname}.weights"
    if w.get("num_bits") != 4 or w.get("type", "int") != "int":
        _refuse(source, f"{where}.num_bits", w.get("num_bits"), "give a 4-bit integer (W4A16) checkpoint")
    if w.get("strategy") != "group":
        _refuse(source, f"{where}.strategy", w.get("strategy"), "give a group-wise checkpoint (strategy group)")
    if w.get("group_size") not in GROUP_SIZES:
        _refuse(source, f"{where}.group_size", w.get("group_size"),
                f"our int4 kernels have group sizes {', '.join(map(str, GROUP_SIZES))}")
    if w.get("actorder") not in (None, "static", "weight"):
        _refuse(source, f"{where}.actorder", w.get("actorder"),
                "act-order with a g_idx is not read: quantize with actorder 'weight' (static groups)")
    if w.get("dynamic"):
        _refuse(source, f"{where}.dynamic", True, "give a checkpoint with static weight scales")
    if g.get("targets") != ["Linear"]:
        _refuse(source, f"config_groups.{gname}.targets", g.get("targets"), "give a checkpoint that targets Linear")
    return CheckpointScheme(method, fmt, int(w["group_size"]), bool(w.get("symmetric", True)),
                            tuple(qc.get("ignore") or ()))


def _unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """int32 [R, ceil(n/8)] -> the stored nibbles uint8 [R, n] (column j: word j // 8, bits 4 * (j % 8))."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nib = (words.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF
    return nib.reshape(words.shape[0], -1)[:, :n].to(torch.uint8)


def _fp16_exact(t: torch.Tensor, what: str) -> torch.Tensor:
    h = t.to(torch.float16)
    if not torch.equal(h.to(t.dtype), t):
        raise UserError(f"{what}: scales do not fit fp16 exactly (our int4 kernels keep fp16 scales)",
                        "give a checkpoint with bf16/fp16 scales in fp16's range")
    return h


def unpack_checkpoint(sd: dict, scheme: CheckpointScheme) -> tuple[dict, dict]:
    """(state dict with each quantized linear's dense fp32 weight, {linear: (packed, scales, mins)} in our format).

    The dense weight is w = q * scale + min computed from our codes, so a model built from it and then
    converted with the codes holds exactly what it computes with."""
    if scheme.quant_method in ("gptq", "awq"):
        return _unpack_qweight(sd, scheme)
    from engine.quant.gptq import dequantize_codes, pack_codes

    out, codes = {}, {}
    prefixes = sorted({k[: -len(".weight_packed")] for k in sd if k.endswith(".weight_packed")})
    for p in prefixes:
        for part in ("weight_scale", "weight_shape") + (() if scheme.symmetric else ("weight_zero_point",)):
            if f"{p}.{part}" not in sd:
                raise UserError(f"the checkpoint's linear {p} has weight_packed but no {part}",
                                "use the complete checkpoint as llm-compressor saved it")
        N, K = (int(x) for x in sd[f"{p}.weight_shape"].tolist())
        gs = scheme.group_size
        scale = sd[f"{p}.weight_scale"]
        if K % gs or tuple(scale.shape) != (N, K // gs) or tuple(sd[f"{p}.weight_packed"].shape) != (N, (K + 7) // 8):
            raise UserError(f"the checkpoint's linear {p}: weight_packed {tuple(sd[f'{p}.weight_packed'].shape)} and "
                            f"weight_scale {tuple(scale.shape)} do not match weight_shape [{N}, {K}] at group {gs}",
                            "use the checkpoint as llm-compressor saved it (tensors and config.json together)")
        q = _unpack(sd[f"{p}.weight_packed"], K)
        s16 = _fp16_exact(scale, p)
        if scheme.symmetric:
            mins = (-8 * s16.float()).to(torch.float16)
        else:
            zero = _unpack(sd[f"{p}.weight_zero_point"].T.contiguous(), N).T.float() - 8  # [N, G], signed
            mins = (-(8 + zero) * s16.float()).to(torch.float16)
        codes[p] = (pack_codes(q), s16.contiguous(), mins.contiguous())
        out[f"{p}.weight"] = dequantize_codes(q, s16, mins)
    packed_parts = {f"{p}.{part}" for p in prefixes
                    for part in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")}
    out.update({k: t for k, t in sd.items() if k not in packed_parts})  # biases, norms, embeddings, dense linears
    return out, codes


def _unpack_qweight(sd: dict, scheme: CheckpointScheme) -> tuple[dict, dict]:
    """GPTQ's and AWQ's qweight/qzeros/scales (module docstring) into our codes and dense weights."""
    from engine.quant.gptq import dequantize_codes, pack_codes

    gs, awq = scheme.group_size, scheme.quant_method == "awq"
    out, codes = {}, {}
    prefixes = sorted({k[: -len(".qweight")] for k in sd if k.endswith(".qweight")})
    for p in prefixes:
        for part in ("qzeros", "scales"):
            if f"{p}.{part}" not in sd:
                raise UserError(f"the checkpoint's linear {p} has qweight but no {part}",
                                f"use the complete checkpoint as {'AutoAWQ' if awq else 'GPTQModel/AutoGPTQ'} saved it")
        qweight, scale = sd[f"{p}.qweight"], sd[f"{p}.scales"]
        G, N = scale.shape
        K = G * gs
        want = (K, N // 8) if awq else (K // 8, N)
        if tuple(qweight.shape) != want or tuple(sd[f"{p}.qzeros"].shape) != (G, N // 8) or N % 8:
            raise UserError(f"the checkpoint's linear {p}: qweight {tuple(qweight.shape)}, qzeros "
                            f"{tuple(sd[f'{p}.qzeros'].shape)} and scales {(G, N)} do not fit one {scheme.words} "
                            "layout", "use the checkpoint with the config.json it was saved with")
        perm = None
        if awq:
            natural = _awq_natural(N)
            q = _unpack(qweight, N)[:, natural].T.contiguous()  # [N, K]
            zero = _unpack(sd[f"{p}.qzeros"], N)[:, natural].T.float()  # [N, G]
        else:
            q = _unpack(qweight.T.contiguous(), K)  # [N, K]
            zero = _unpack(sd[f"{p}.qzeros"], N).T.float() + (1 if scheme.format == "gptq" else 0)
            perm = _act_order(sd.get(f"{p}.g_idx"), K, gs, p)
            if perm is not None:  # inputs reordered into consecutive groups; the layer gathers x the same way
                q = q[:, perm]
        s16 = _fp16_exact(scale.T.contiguous(), p)  # [N, G]
        mins = (-zero * s16.float()).to(torch.float16)
        codes[p] = (pack_codes(q), s16.contiguous(), mins.contiguous())
        w = dequantize_codes(q, s16, mins)
        if perm is not None:
            codes[p] += (perm.to(torch.int32),)
            w = torch.empty_like(w).index_copy_(1, perm, w)  # back to the checkpoint's input order
        out[f"{p}.weight"] = w
    parts = {f"{p}.{x}" for p in prefixes for x in ("qweight", "qzeros", "scales", "g_idx")}
    out.update({k: t for k, t in sd.items() if k not in parts})  # biases, norms, embeddings, dense linears
    return out, codes


def _act_order(g_idx: torch.Tensor | None, K: int, gs: int, p: str) -> torch.Tensor | None:
    """None when g_idx is k // gs (or absent); for act-order (desc_act without static groups), the input order
    that makes each group's columns consecutive: a stable sort by group. Each group must hold gs columns."""
    if g_idx is None:
        return None
    g = g_idx.long()
    if tuple(g.shape) != (K,) or g.min() < 0 or g.max() >= K // gs:
        raise UserError(f"the checkpoint's linear {p}: g_idx {tuple(g.shape)} with groups "
                        f"{int(g.min())}..{int(g.max())} is not one group of 0..{K // gs - 1} per input column",
                        "use the checkpoint as GPTQModel/AutoGPTQ saved it")
    if torch.equal(g, torch.arange(K) // gs):
        return None
    if not torch.equal(torch.bincount(g, minlength=K // gs), torch.full((K // gs,), gs)):
        raise UserError(f"the checkpoint's linear {p}: its g_idx gives groups of unequal sizes; our int4 kernels "
                        f"read groups of {gs} inputs", "quantize with GPTQModel/AutoGPTQ's own group_size, "
                        "desc_act on or off")
    return torch.argsort(g, stable=True)


def _awq_natural(n: int) -> torch.Tensor:
    """Column j of the natural order within AWQ's unpacked columns: 8c + i where AWQ_ORDER[i] = j % 8."""
    inverse = [AWQ_ORDER.index(j) for j in range(8)]
    return torch.tensor([8 * (j // 8) + inverse[j % 8] for j in range(n)])
