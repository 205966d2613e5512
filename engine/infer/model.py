"""Our Llama/Qwen2 transformer with a static KV cache written at explicit positions.

Read top to bottom: config, cache, blocks, model, weight loading. Linear layers are plain
nn.Linear here; engine/quant.py swaps them for quantized versions.

Batching: all sequences share one slot counter (slot = index into the cache). Shorter prompts are
left-padded; `pad[b]` counts sequence b's pad slots, its RoPE position is slot - pad[b], and pad
slots are masked out as keys. Rolling back the cache after a rejected draft is just using a smaller
slot next time: stale entries past the current slot are never attended to.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


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
    """Per-layer K/V buffers [B, Hkv, S, D], written at explicit slots."""

    def __init__(self, cfg: ModelConfig, batch: int, max_slots: int, dtype, device):
        super().__init__()
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_slots, cfg.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.max_slots = max_slots

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


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
    """cos/sin for positions [B, T] -> [B, 1, T, D], computed in fp32 like the reference."""
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

    def forward(self, x, cos, sin, cache: KVCache, slots: torch.Tensor, mask: torch.Tensor, end: int):
        b, t, _ = x.shape
        c = self.cfg
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                                              c.num_kv_heads * c.head_dim], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = k.reshape(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = v.reshape(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.k[self.layer, :, :, slots] = k.to(cache.k.dtype)
        cache.v[self.layer, :, :, slots] = v.to(cache.v.dtype)
        keys = cache.k[self.layer, :, :, :end].to(q.dtype)
        vals = cache.v[self.layer, :, :, :end].to(q.dtype)
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, c.num_heads * c.head_dim))


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

    def forward(self, x, cos, sin, cache, slots, mask, end):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, slots, mask, end)
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

    def new_cache(self, batch: int, max_slots: int, dtype=None) -> KVCache:
        return KVCache(self.cfg, batch, max_slots, dtype or self.compute_dtype, self.device)

    def forward(self, tokens: torch.Tensor, start: int, cache: KVCache, pad: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Run tokens [B, T] written at slots start..start+T-1; returns logits [B, T, V] (fp32)."""
        b, t = tokens.shape
        end = start + t
        if end > cache.max_slots:
            raise ValueError(f"cache holds {cache.max_slots} slots, step needs {end}")
        dev = tokens.device
        slots = torch.arange(start, end, device=dev)
        pad = torch.zeros(b, dtype=torch.long, device=dev) if pad is None else pad.to(dev)
        positions = (slots[None, :] - pad[:, None]).clamp(min=0)
        cos, sin = rope_tables(self.cfg, positions)
        key_slots = torch.arange(end, device=dev)
        # Query at slot s sees key j when j <= s and j is not one of its own pad slots.
        mask = (key_slots[None, None, :] <= slots[None, :, None]) & (key_slots[None, None, :] >= pad[:, None, None])
        mask = mask[:, None]  # [B, 1, T, end]
        if t == 1 and not bool(pad.any()):
            mask = None  # one new token, no padding: it sees every key; SDPA is faster without a mask
        x = self.model.embed_tokens(tokens).to(self.compute_dtype)
        for blk in self.model.layers:
            x = blk(x, cos, sin, cache, slots, mask, end)
        x = self.model.norm(x)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(x).float()


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
