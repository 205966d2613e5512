"""The mixture-of-experts MLP (Mixtral, Qwen3-MoE): a float router picks top-k experts per row.

Computed as transformers does: softmax over the router logits in fp32, top-k, optional
renormalisation (Mixtral always; Qwen3-MoE when norm_topk_prob), then each chosen expert's
SwiGLU MLP on the rows routed to it, weighted and summed. Experts are plain MLPs, so quantization
swaps their linears like any other; the router stays in float (routing must not move with the
weights' rounding). This is the PyTorch path: the fused C++ step does not cover MoE; each expert's
linears are our quantized ones (engine/quant), so an int4 expert runs the kernels' int4 GEMV/GEMM.

Experts touched are counted, not assumed: inside ``count_expert_touches()``, every sparse layer of
every forward pass made inside a ``step_kind(kind)`` block (the target's pass of a batch step,
engine/infer/batch.py) adds the number of distinct experts its rows routed to, by the step's kind
and its row count. A draft model's passes run outside such a block and are not counted. The open
counters live in a context variable, as ops.count_steps' do: runs in two threads never mix.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

# A batch step's kind, by the rows its decoding sequences bring (engine/infer/batch.py says which):
# decode: one row each (no drafts); verify: a sequence's last token and its drafts (gamma + 1 rows);
# prefill: prompt chunks only; mixed: decode or verify rows and prefill chunks in one pass.
STEP_KINDS = ("decode", "verify", "prefill", "mixed")


@dataclass
class ExpertTouches:
    """Distinct experts per sparse layer per forward pass, summed by step kind and the pass's rows.

    by_kind[kind][rows] = [layer passes, distinct experts summed over them]; a pass of a model with L
    sparse layers is L layer passes. experts / per_token: E and k of the counted model."""

    experts: int = 0
    per_token: int = 0
    by_kind: dict = field(default_factory=dict)

    def add(self, kind: str, rows: int, touched: int, experts: int, per_token: int) -> None:
        self.experts, self.per_token = experts, per_token
        cell = self.by_kind.setdefault(kind, {}).setdefault(rows, [0, 0])
        cell[0] += 1
        cell[1] += touched

    def layer_passes(self, kind: str) -> int:
        return sum(n for n, _ in self.by_kind.get(kind, {}).values())

    def mean(self, kind: str) -> float | None:
        """Mean distinct experts per sparse layer per pass of this kind (None: no such pass)."""
        n = self.layer_passes(kind)
        return sum(t for _, t in self.by_kind.get(kind, {}).values()) / n if n else None


_open: ContextVar[tuple] = ContextVar("scl_open_expert_touches", default=())
_kind: ContextVar[str | None] = ContextVar("scl_step_kind", default=None)
_lock = threading.Lock()  # a server thread and a dashboard run may count at once


@contextmanager
def count_expert_touches() -> Iterator[ExpertTouches]:
    """Count the experts touched by the labelled passes made inside the block (nested blocks all count)."""
    counts = ExpertTouches()
    token = _open.set(_open.get() + (counts,))
    try:
        yield counts
    finally:
        _open.reset(token)


@contextmanager
def step_kind(kind: str):
    """Label the forward passes inside the block as one of STEP_KINDS (what the counters sort them by)."""
    if kind not in STEP_KINDS:
        raise ValueError(f"step kind {kind!r} is not one of {STEP_KINDS}")
    token = _kind.set(kind)
    try:
        yield
    finally:
        _kind.reset(token)


class SparseMoE(nn.Module):
    def __init__(self, cfg, make_expert):
        """make_expert(): one expert MLP (engine/infer/model.py MLP at moe_intermediate_size)."""
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)  # the router
        self.experts = nn.ModuleList(make_expert() for _ in range(cfg.num_experts))

    def route(self, x):
        """(weights [N, k], expert ids [N, k]) for rows x [N, hidden]."""
        probs = F.softmax(self.gate(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.cfg.experts_per_token, dim=-1)
        if self.cfg.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, idx

    def forward(self, x):
        w, idx = self.route(x)
        if self.cfg.moe_router == "qwen3_moe":  # Qwen3-MoE rounds the weights to the compute dtype first
            w = w.to(x.dtype)
        out = torch.zeros_like(x)
        touched = torch.unique(idx).tolist()
        if _open.get() and _kind.get() is not None:
            self._count(x.shape[0], len(touched))
        for e in touched:
            tok, pos = torch.where(idx == e)
            y = self.experts[e](x[tok]) * w[tok, pos, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out

    def _count(self, rows: int, touched: int) -> None:
        with _lock:
            for c in _open.get():
                c.add(_kind.get(), rows, touched, self.cfg.num_experts, self.cfg.experts_per_token)
