"""Load-time packed weights: the canonical formats converted once to the layout the kernel for their device reads.

CPU with the extension ("cpu_tiled"): output rows in tiles of 64 (N padded with zero rows).
  int8: w int8 [NT, Kq/4, 64, 4]: (t, o, r, i) holds q[64t + r, 4o + i], Kq = K rounded up to 32 (zero past K):
        4 consecutive k of a row per 32-bit lane, what the int8 x int8 dot products take; scale fp32 [NT*64].
  int4: w int32 [NT, Kp/8, 64]: dword (t, o, r) holds q[n, 8o..8o+7] of row n = 64t + r,
        byte i = q[8o+i] | q[8o+4+i] << 4; sm fp16 [NT, G, 2, 64]: (scale, min) per group per row.
Otherwise ("canonical"): int8 w [N, K] (on CUDA K zero-padded to a multiple of 16), int4 the
canonical packed bytes [N, Kp/2] with sm fp16 [N, G, 2].
"""
from __future__ import annotations

import dataclasses

import torch

from engine.ops import build as _build
from engine.ops.formats import check_group_size, dequantize_int4, quantize_int4, quantize_int8, unpack_int4

__all__ = ["TILE", "PreparedInt8", "PreparedInt4", "prepare_int8", "prepare_int4", "quantize_int4_at_load",
           "quantize_int8_at_load"]

TILE = 64  # output rows per packed CPU tile (must match kernels/cpu/qgemm_kernels.h)


def _tensors_nbytes(*ts) -> int:
    return int(sum(t.numel() * t.element_size() for t in ts if t is not None))


@dataclasses.dataclass
class PreparedInt8:
    """int8 weight in the layout the kernel for its device wants.

    layout "cpu_tiled": w int8 [NT, Kq/4, 64, 4] (tile t, quad o, row r, k = 4o + i), scale fp32 [NT*64]
    layout "canonical": w int8 [N, K], scale fp32 [N]   (torch fallback, CUDA)
    """
    N: int
    K: int
    layout: str
    w: torch.Tensor
    scale: torch.Tensor

    def nbytes(self) -> int:
        return _tensors_nbytes(self.w, self.scale)

    @property
    def device(self) -> torch.device:
        return self.w.device

    def dequantize_rows(self, r0: int, r1: int) -> torch.Tensor:
        """fp32 rows [r0, r1) of the dequantized weight (pure torch)."""
        if self.layout == "cpu_tiled":
            t0, t1 = r0 // TILE, (r1 + TILE - 1) // TILE
            q = self.w[t0:t1].permute(0, 2, 1, 3).reshape((t1 - t0) * TILE, -1)
            q = q[r0 - t0 * TILE: r1 - t0 * TILE, : self.K]
        else:
            q = self.w[r0:r1, : self.K]   # CUDA layout pads K to 16
        return q.to(torch.float32) * self.scale[r0:r1, None]

    def dequantize(self) -> torch.Tensor:
        return self.dequantize_rows(0, self.N)

    def canonical(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layout == "cpu_tiled":
            q = self.w.permute(0, 2, 1, 3).reshape(self.w.shape[0] * TILE, -1)[: self.N, : self.K].contiguous()
            return q, self.scale[: self.N].contiguous()
        return self.w[:, : self.K].contiguous(), self.scale


@dataclasses.dataclass
class PreparedInt4:
    """int4 weight in the layout the kernel for its device wants.

    layout "cpu_tiled": w int32 [NT, Kp/8, 64]: dword (t, o, r) holds q[n, 8o..8o+7] of
                        row n = 64t + r, byte i = q[8o+i] | q[8o+4+i] << 4;
                        sm fp16 [NT, G, 2, 64]: (scale, min) per group per row.
    layout "canonical": w = packed uint8 [N, Kp/2], sm fp16 [N, G, 2]   (torch fallback, CUDA)
    """
    N: int
    K: int
    group_size: int
    layout: str
    w: torch.Tensor
    sm: torch.Tensor

    @property
    def G(self) -> int:
        return (self.K + self.group_size - 1) // self.group_size

    @property
    def Kp(self) -> int:
        return self.G * self.group_size

    def nbytes(self) -> int:
        return _tensors_nbytes(self.w, self.sm)

    @property
    def device(self) -> torch.device:
        return self.w.device

    def _canonical_rows(self, r0: int, r1: int):
        if self.layout == "cpu_tiled":
            t0, t1 = r0 // TILE, (r1 + TILE - 1) // TILE
            a, b = r0 - t0 * TILE, r1 - t0 * TILE
            dw = self.w[t0:t1].permute(0, 2, 1).reshape(-1, self.Kp // 8)[a:b]
            packed = _octets_to_canonical(dw)
            sm = self.sm[t0:t1].permute(0, 3, 1, 2).reshape(-1, self.G, 2)[a:b]
        else:
            packed, sm = self.w[r0:r1], self.sm[r0:r1]
        return packed, sm[..., 0], sm[..., 1]

    def dequantize_rows(self, r0: int, r1: int) -> torch.Tensor:
        packed, s, m = self._canonical_rows(r0, r1)
        return dequantize_int4(packed, s, m, self.K)

    def dequantize(self) -> torch.Tensor:
        return self.dequantize_rows(0, self.N)

    def canonical(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed, s, m = self._canonical_rows(0, self.N)
        return packed.contiguous(), s.contiguous(), m.contiguous()


def _canonical_to_octets(packed: torch.Tensor) -> torch.Tensor:
    """canonical uint8 [R, Kp/2] -> int32 [R, Kp/8] octet dwords of the CPU layout:
    byte i of dword o = q[8o+i] | q[8o+4+i] << 4 (see kernels/cpu/qgemm_kernels.h)."""
    R = packed.shape[0]
    q = unpack_int4(packed).view(R, -1, 8)
    b = q[..., :4] | (q[..., 4:] << 4)
    return b.contiguous().view(torch.int32).view(R, -1)


def _octets_to_canonical(dw: torch.Tensor) -> torch.Tensor:
    """Inverse of _canonical_to_octets: int32 [R, Kp/8] -> canonical uint8 [R, Kp/2]."""
    R = dw.shape[0]
    b = dw.contiguous().view(torch.uint8).view(R, -1, 4)
    q = torch.cat([b & 0x0F, b >> 4], dim=-1).view(R, -1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def quantize_int4_at_load(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """formats.quantize_int4's codes, by the CPU extension where it is built (the same values, one pass in C++: in
    torch this was most of an int4 load); the torch definition on other devices and for non-finite weights."""
    ext = _build.cpu_extension() if w.device.type == "cpu" else None
    if ext is not None and w.dim() == 2:
        check_group_size(group_size)
        packed, scales, mins, finite = ext.int4_quantize(w.detach().to(torch.float32), group_size)
        if bool(finite):
            return packed, scales, mins
    return quantize_int4(w, group_size)


def quantize_int8_at_load(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """formats.quantize_int8's codes and scales, by the CPU extension where it is built (the same values, one
    pass); the torch definition on other devices and for non-finite weights."""
    ext = _build.cpu_extension() if w.device.type == "cpu" else None
    if ext is not None and w.dim() == 2:
        q, scale, finite = ext.int8_quantize(w.detach().to(torch.float32))
        if bool(finite):
            return q, scale
    return quantize_int8(w)


def tile_int8(qweight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU tiled layout of canonical int8 (the module's docstring), in torch: its definition, which the
    extension's int8_tile reproduces byte for byte (tests/test_load_codes.py)."""
    N, K = qweight.shape
    NT, Kq = (N + TILE - 1) // TILE, (K + 31) // 32 * 32
    wp = torch.zeros(NT * TILE, Kq, dtype=torch.int8)
    wp[:N, :K] = qweight
    sp = torch.zeros(NT * TILE, dtype=torch.float32)
    sp[:N] = scale
    return wp.view(NT, TILE, Kq // 4, 4).permute(0, 2, 1, 3).contiguous(), sp


def _use_cpu_tiled(device: torch.device) -> bool:
    return device.type == "cpu" and _build.cpu_extension() is not None


def prepare_int8(qweight: torch.Tensor, scale: torch.Tensor) -> PreparedInt8:
    """Canonical int8 -> kernel layout (done once at load time)."""
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise ValueError("qweight must be int8 [N, K]")
    N, K = qweight.shape
    if scale.numel() != N:
        raise ValueError(f"scale has {scale.numel()} elements, expected N={N}")
    scale = scale.reshape(N).to(torch.float32)
    if _use_cpu_tiled(qweight.device):  # the same bytes as tile_int8 (above), in one pass
        w, sp = _build.cpu_extension().int8_tile(qweight, scale)
        return PreparedInt8(N, K, "cpu_tiled", w, sp)
    if qweight.device.type == "cuda":
        # CUDA kernel: row-major, K padded to 16 bytes so every row is 16-byte aligned.
        Kpad = (K + 15) // 16 * 16
        if Kpad != K:
            wp = torch.zeros(N, Kpad, dtype=torch.int8, device=qweight.device)
            wp[:, :K] = qweight
            qweight = wp
        return PreparedInt8(N, K, "canonical", qweight.contiguous(), scale.contiguous())
    return PreparedInt8(N, K, "canonical", qweight.contiguous(), scale.contiguous())


def tile_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU tiled layout of canonical int4 (the module's docstring), in torch: its definition, which the
    extension's int4_tile reproduces byte for byte (tests/test_load_codes.py)."""
    N, G, Kp = packed.shape[0], scales.shape[1], packed.shape[1] * 2
    NT = (N + TILE - 1) // TILE
    pp = torch.zeros(NT * TILE, Kp // 2, dtype=torch.uint8)
    pp[:N] = packed
    w = _canonical_to_octets(pp).view(NT, TILE, Kp // 8).permute(0, 2, 1).contiguous()
    smp = torch.zeros(NT * TILE, G, 2, dtype=torch.float16)
    smp[:N] = torch.stack([scales.to(torch.float16), mins.to(torch.float16)], dim=-1)
    return w, smp.view(NT, TILE, G, 2).permute(0, 2, 3, 1).contiguous()


def prepare_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, K: int,
                 group_size: int) -> PreparedInt4:
    """Canonical int4 -> kernel layout (done once at load time)."""
    check_group_size(group_size)
    gs = group_size
    G = (K + gs - 1) // gs
    Kp = G * gs
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != Kp // 2:
        raise ValueError(f"packed must be uint8 [N, {Kp // 2}] for K={K}, gs={gs}; got "
                         f"{packed.dtype} {tuple(packed.shape)}")
    N = packed.shape[0]
    if tuple(scales.shape) != (N, G) or tuple(mins.shape) != (N, G):
        raise ValueError(f"scales/mins must be [N, G] = [{N}, {G}]")
    s16, m16 = scales.to(torch.float16), mins.to(torch.float16)
    if _use_cpu_tiled(packed.device):  # the same bytes as tile_int4 (above), in one pass
        w, smt = _build.cpu_extension().int4_tile(packed, s16, m16)
        return PreparedInt4(N, K, gs, "cpu_tiled", w, smt)
    sm = torch.stack([s16, m16], dim=-1)  # [N, G, 2]
    return PreparedInt4(N, K, gs, "canonical", packed.contiguous(), sm.contiguous())
