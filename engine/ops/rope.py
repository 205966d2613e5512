"""Rotary position embeddings: every rope type a supported config names, computed as transformers does.

One home for the RoPE arithmetic (engine/infer/model.py, the fused step and the CUDA graph all read
it). A ``RopeSpec`` is one layer type's rotary setting, read from config.json by
engine/infer/arch.py. Types: default, linear, llama3 and yarn have fixed frequencies; dynamic (NTK)
and longrope change theirs with the sequence's length, so ``length_dependent`` specs are computed
per sequence from its current length (transformers computes them from the step's longest position).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["RopeSpec", "rope_inv_freq", "ROPE_TYPES"]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] fp32: 1 / theta^(2i/D), computed in the same dtype steps as transformers."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


@dataclass(frozen=True)
class RopeSpec:
    """One rotary setting. ``dim`` is the rotated width (head_dim times partial_rotary_factor)."""

    dim: int
    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 0
    max_position: int = 0
    attention_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    truncate: bool = True
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    @property
    def length_dependent(self) -> bool:
        return self.type in ("dynamic", "longrope")

    def _base(self) -> torch.Tensor:
        return torch.arange(0, self.dim, 2, dtype=torch.int64).float() / self.dim

    def inv_freq(self, seq_len: int = 0) -> torch.Tensor:
        """[dim/2] fp32 inverse frequencies; ``seq_len`` only matters for dynamic and longrope."""
        t = self.type
        if t == "default":
            return rope_inv_freq(self.dim, self.theta)
        if t == "linear":
            return rope_inv_freq(self.dim, self.theta) / self.factor
        if t == "dynamic":
            n = max(seq_len, self.max_position)
            base = self.theta * (((self.factor * n / self.max_position) - (self.factor - 1))
                                 ** (self.dim / (self.dim - 2)))
            return 1.0 / (base ** self._base())
        if t == "llama3":
            return self._llama3()
        if t == "yarn":
            return self._yarn()
        if t == "longrope":
            ext = self.long_factor if seq_len > self.original_max_position else self.short_factor
            return 1.0 / (torch.tensor(ext, dtype=torch.float32) * self.theta ** self._base())
        raise ValueError(f"rope type {t!r}")

    def scale(self) -> float:
        """The factor transformers multiplies cos and sin by (yarn's and longrope's attention factor)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.type == "yarn":
            def mscale(s, m=1.0):
                return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
            if self.mscale and self.mscale_all_dim:
                return float(mscale(self._yarn_factor(), self.mscale)
                             / mscale(self._yarn_factor(), self.mscale_all_dim))
            return mscale(self._yarn_factor())
        if self.type == "longrope":
            f = self._longrope_factor()
            return 1.0 if f <= 1.0 else math.sqrt(1 + math.log(f) / math.log(self.original_max_position))
        return 1.0

    def tables(self, positions: torch.Tensor, seq_len: int = 0):
        """cos/sin [N, 1, dim] (broadcast over heads) for positions [N], in fp32 like the reference."""
        inv = self.inv_freq(seq_len).to(positions.device)
        freqs = positions.float()[..., None] * inv
        emb = torch.cat([freqs, freqs], dim=-1)
        s = self.scale()
        cos, sin = emb.cos(), emb.sin()
        if s != 1.0:
            cos, sin = cos * s, sin * s
        return cos[:, None], sin[:, None]

    # -- the two scaled types, step by step as in transformers' modeling_rope_utils

    def _llama3(self) -> torch.Tensor:
        inv = rope_inv_freq(self.dim, self.theta)
        old = self.original_max_position
        low_wl, high_wl = old / self.low_freq_factor, old / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / self.factor, inv)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        return torch.where(medium, smoothed, scaled)

    def _yarn_factor(self) -> float:
        return self.factor if self.factor else self.max_position / self.original_max_position

    def _longrope_factor(self) -> float:
        return self.factor if self.factor else self.max_position / self.original_max_position

    def _yarn(self) -> torch.Tensor:
        dim, base, factor = self.dim, self.theta, self._yarn_factor()

        def corr_dim(rot):
            return (dim * math.log(self.original_max_position / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(self.beta_fast), corr_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as the reference: no division by zero
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        keep = 1 - ramp
        return inter * (1 - keep) + extra * keep
