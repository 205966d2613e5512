"""Our Llama/Qwen2 transformer with a static KV cache written at explicit positions.

Read top to bottom: config, cache, rows, blocks, model, weight loading. Linear layers are plain
nn.Linear here; engine/quant swaps them for quantized versions.

Batching is ragged: a forward pass takes a flat list of token rows, each belonging to one sequence
(its cache slot) at its own position. A decode step of 8 sequences is 8 rows; speculative
verification of gamma drafts is gamma + 1 rows of one sequence; a prefill chunk is many rows of one
sequence. The linear layers see all rows at once (the weights are read once per step); attention
runs per sequence over that sequence's own cached keys, so a row's numbers do not depend on which
other sequences share the step. Rolling back after a rejected draft is a shorter length next time:
stale entries past it are overwritten before anything attends to them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.ops import fused_forward_rows


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_position: int = 32768
    tie_embeddings: bool = False
    qkv_bias: bool = False
    model_type: str = "llama"
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        mt = cfg.get("model_type", "llama")
        if mt not in ("llama", "qwen2", "mistral"):
            from engine.common.errors import UserError

            raise UserError(f"model type '{mt}' is not supported", "use a Llama, Mistral or Qwen2 family model")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position=int(cfg.get("max_position_embeddings", 32768)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
            model_type=mt,
            eos_token_ids=eos,
        )


class KVCache(nn.Module):
    """K/V for `slots` sequences of up to `capacity` positions each: [layers, slots, Hkv, capacity, D].

    A sequence owns one slot for its lifetime and writes each token's K/V at the token's position.
    """

    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, dtype, device):
        super().__init__()
        shape = (cfg.num_layers, slots, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.slots, self.capacity = slots, capacity

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


@dataclass
class Rows:
    """Which sequence and position each row of a forward pass is.

    segments: (slot, first row, rows, first position) per sequence, rows contiguous and in order;
    a sequence's rows are consecutive positions. slot/pos: per-row tensors for the cache writes.
    """

    segments: list[tuple[int, int, int, int]]
    slot: torch.Tensor
    pos: torch.Tensor

    @classmethod
    def of(cls, segments: list[tuple[int, int, int]], device) -> "Rows":
        """From (slot, first position, rows) per sequence, in row order."""
        segs, slots, pos, r = [], [], [], 0
        for slot, p0, n in segments:
            segs.append((slot, r, n, p0))
            slots += [slot] * n
            pos += range(p0, p0 + n)
            r += n
        return cls(segs, torch.tensor(slots, dtype=torch.long, device=device),
                   torch.tensor(pos, dtype=torch.long, device=device))

    @property
    def n(self) -> int:
        return int(self.pos.shape[0])


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dt = x.dtype
        if dt == torch.float32:  # one fused op instead of five small ones (the same numbers in fp32)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_tables(cfg: ModelConfig, positions: torch.Tensor):
    """cos/sin for positions [N] -> [N, 1, D] (broadcast over heads), computed in fp32 like the reference."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=positions.device).float() / d))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos.to(x.dtype)) + (rot * sin.to(x.dtype))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.qkv_proj = None  # quant.fuse_projections may replace q/k/v with one fused linear

    def forward(self, x, cos, sin, cache: KVCache, rows: Rows):
        """x [N, hidden]: one row per token; writes each row's K/V at its slot and position."""
        c = self.cfg
        h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([h * d, kv * d, kv * d], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = apply_rope(q.reshape(-1, h, d), cos, sin)
        k = apply_rope(k.reshape(-1, kv, d), cos, sin)
        ck, cv = cache.k[self.layer], cache.v[self.layer]
        ck[rows.slot, :, rows.pos] = k.to(ck.dtype)
        cv[rows.slot, :, rows.pos] = v.reshape(-1, kv, d).to(cv.dtype)
        outs = []
        for slot, r0, n, p0 in rows.segments:
            end = p0 + n
            qs = q[r0:r0 + n].transpose(0, 1)[None]  # [1, H, n, D]
            ks, vs = ck[slot, :, :end][None].to(q.dtype), cv[slot, :, :end][None].to(q.dtype)
            if n == 1:  # one new token sees every cached key; SDPA is fastest without a mask
                o = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
            elif p0 == 0:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            else:  # row i (position p0 + i) sees keys 0..p0 + i
                mask = torch.arange(end, device=x.device)[None] <= torch.arange(p0, end, device=x.device)[:, None]
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
            outs.append(o[0].transpose(0, 1).reshape(n, h * d))
        return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj = None  # quant.fuse_projections may replace gate/up with one fused linear

    def forward(self, x):
        if self.gate_up_proj is not None:
            g, u = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(g) * u)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, rows):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, rows)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Parameter names follow Hugging Face's, so a HF state dict loads as is."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def new_cache(self, slots: int, capacity: int, dtype=None) -> KVCache:
        return KVCache(self.cfg, slots, capacity, dtype or self.compute_dtype, self.device)

    def forward_rows(self, tokens: torch.Tensor, rows: Rows, cache: KVCache,
                     logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [N], one per row; returns fp32 logits [len(logits_at), V] (all rows when None)."""
        if rows.n and int(rows.pos.max()) >= cache.capacity:
            raise ValueError(f"cache holds {cache.capacity} positions per sequence, a row needs "
                             f"{int(rows.pos.max()) + 1}")
        fused = fused_forward_rows(self, tokens, rows, cache, logits_at)  # one C++ call, or None: the path below
        if fused is not None:
            return fused
        cos, sin = rope_tables(self.cfg, rows.pos)
        x = self.model.embed_tokens(tokens).to(self.compute_dtype)
        for blk in self.model.layers:
            x = blk(x, cos, sin, cache, rows)
        if logits_at is not None:
            x = x[logits_at]
        return self.lm_head(self.model.norm(x)).float()

    def forward(self, tokens: torch.Tensor, start: int, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        """tokens [B, T]: sequence b (cache slot b) at positions start..start+T-1; logits [B, T, V] (fp32)."""
        b, t = tokens.shape
        rows = Rows.of([(i, start, t) for i in range(b)], tokens.device)
        at = torch.arange(t - 1, b * t, t, device=tokens.device) if last_only else None
        return self.forward_rows(tokens.reshape(-1), rows, cache, at).reshape(b, 1 if last_only else t, -1)


def load_config(folder: Path) -> ModelConfig:
    cfg = ModelConfig.from_hf(json.loads((Path(folder) / "config.json").read_text()))
    gen = Path(folder) / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            extra = tuple(eos) if isinstance(eos, list) else (eos,)
            cfg.eos_token_ids = tuple(dict.fromkeys(cfg.eos_token_ids + extra))
    return cfg


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All *.safetensors tensors in a folder (never pickle)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        from engine.common.errors import UserError

        raise UserError(f"no *.safetensors files in {folder}", "convert the model to safetensors first")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


def build_model(folder: Path, dtype=torch.float32, device="cpu") -> Transformer:
    """Build our model from a HF folder; weights are loaded in fp32 then cast."""
    cfg = load_config(folder)
    with torch.device("meta"):
        model = Transformer(cfg)
    sd = load_state_dict(folder)
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device=device, dtype=dtype)
    model.eval().requires_grad_(False)
    return model
