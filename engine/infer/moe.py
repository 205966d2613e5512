"""The mixture-of-experts MLP (Mixtral, Qwen3-MoE): a float router picks top-k experts per row.

Computed as transformers does: softmax over the router logits in fp32, top-k, optional
renormalisation (Mixtral always; Qwen3-MoE when norm_topk_prob), then each chosen expert's
SwiGLU MLP on the rows routed to it, weighted and summed. Experts are plain MLPs, so quantization
swaps their linears like any other; the router stays in float (routing must not move with the
weights' rounding). This is the PyTorch path: the fused C++ step does not cover MoE.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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
        for e in torch.unique(idx).tolist():
            tok, pos = torch.where(idx == e)
            y = self.experts[e](x[tok]) * w[tok, pos, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out
