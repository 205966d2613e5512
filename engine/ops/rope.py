"""RoPE inverse frequencies, as the model computes them (engine/infer/model.py rope_tables; tested equal)."""
from __future__ import annotations

import torch

__all__ = ["rope_inv_freq"]


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] fp32: 1 / theta^(2i/D), computed in the same dtype steps as rope_tables."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
