"""Our decoder transformer (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, Mixtral, Qwen3-MoE) with a
static KV cache written at explicit positions.

Read top to bottom: config, cache, rows, blocks, model, weight loading. What differs between the
families is read from ModelConfig's switches, which engine/infer/arch.py sets from one table; the
mixture-of-experts MLP is engine/infer/moe.py. Linear layers are plain nn.Linear here;
engine/quant swaps them for quantized versions.

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

from engine.infer.moe import SparseMoE
from engine.ops import fused_forward_rows
from engine.ops.rope import RopeSpec


@dataclass
class ModelConfig:
    """What the forward pass computes. engine/infer/arch.py fills it from config.json (one family table);
    the defaults are plain Llama."""

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
    family: str = "llama"
    act: str = "silu"                    # silu | gelu_tanh
    o_bias: bool = False                 # Llama's attention_bias also biases o_proj
    mlp_bias: bool = False
    qk_norm: bool = False                # RMSNorm over head_dim on q and k, before RoPE
    gemma_norms: bool = False            # norms scale by (1 + w) in fp32; sandwich norms around attn and MLP
    embed_scale: float = 1.0             # Gemma: sqrt(hidden)
    attn_scale: float = 0.0              # 0: head_dim ** -0.5
    attn_softcap: float = 0.0            # 0: none; else cap * tanh(score / cap)
    final_softcap: float = 0.0
    layer_types: tuple[str, ...] = ()    # full_attention | sliding_attention per layer; () = all full
    sliding_window: int = 0              # a sliding layer's query at p sees keys p - window < k <= p
    ropes: tuple = ()                    # ops.rope.RopeSpec per layer; () = default RoPE at rope_theta
    fused_checkpoint: bool = False       # Phi-3: q/k/v and gate/up stored fused (split at load)
    num_experts: int = 0                 # 0 = dense MLP
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_router: str = ""                 # mixtral | qwen3_moe
    sparse_layers: tuple[bool, ...] = ()
    ignored_fields: tuple[str, ...] = ()  # config.json fields not known to the engine (warned about at load)

    def __post_init__(self):
        if not self.ropes:
            self.ropes = tuple(RopeSpec(self.head_dim, self.rope_theta) for _ in range(self.num_layers))
        if not self.layer_types:
            self.layer_types = tuple("full_attention" for _ in range(self.num_layers))
        if not self.attn_scale:
            self.attn_scale = self.head_dim ** -0.5

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "ModelConfig":
        from engine.infer.arch import read_config

        return cls(**read_config(cfg, source))

    def window(self, layer: int) -> int:
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else 0

    def is_sparse(self, layer: int) -> bool:
        return bool(self.num_experts) and self.sparse_layers[layer]

    def architecture(self) -> dict:
        """What a run record says about the architecture that ran."""
        return {"family": self.family, "model_type": self.model_type, "features": list(self.features()),
                "ignored_fields": list(self.ignored_fields)}

    def features(self) -> tuple[str, ...]:
        """What this model computes beyond plain Llama/Qwen2 arithmetic, by name. A fast path (the fused
        C++ step, the CUDA graph) runs a model only if it implements every feature named here."""
        r0 = self.ropes[0]
        named = {
            "qk_norm": self.qk_norm, "gemma_norms": self.gemma_norms, "attn_softcap": bool(self.attn_softcap),
            "final_softcap": bool(self.final_softcap), "o_bias": self.o_bias, "mlp_bias": self.mlp_bias,
            "gelu_tanh": self.act != "silu", "embed_scale": self.embed_scale != 1.0, "moe": bool(self.num_experts),
            "sliding_window": any(self.window(i) for i in range(self.num_layers)),
            "attn_scale": abs(self.attn_scale - self.head_dim ** -0.5) > 1e-12,
            "rope_per_layer": any(r != r0 for r in self.ropes),
            "rope_attention_factor": any(r.scale() != 1.0 for r in self.ropes),
            "rope_length_dependent": any(r.length_dependent for r in self.ropes),
            "partial_rotary": any(r.dim != self.head_dim for r in self.ropes),
        }
        return tuple(k for k, on in named.items() if on)


class KVCache(nn.Module):
    """K/V for `slots` sequences of up to `capacity` positions each: [layers, slots, Hkv, capacity, D].

    A sequence owns one slot for its lifetime and writes each token's K/V at the token's position.
    engine/infer/paged.py's PagedKVCache is the other cache: the same write/read, through block tables.
    """

    paged = False

    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, dtype, device):
        super().__init__()
        shape = (cfg.num_layers, slots, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.slots, self.capacity = slots, capacity

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, rows: "Rows", k: torch.Tensor, v: torch.Tensor) -> None:
        """Row r's K/V [N, KV, D] at its slot and position."""
        self.k[layer][rows.slot, :, rows.pos] = k.to(self.k.dtype)
        self.v[layer][rows.slot, :, rows.pos] = v.to(self.v.dtype)

    def read(self, layer: int, slot: int, k0: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot's K and V at positions [k0, end): [KV, end - k0, D] (views, in the cache's dtype)."""
        return self.k[layer, slot, :, k0:end], self.v[layer, slot, :, k0:end]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Slot dst's positions [0, n) become slot src's."""
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]

    def clone(self) -> "KVCache":
        """An independent copy (the same slots, capacity and contents)."""
        c = KVCache.__new__(KVCache)
        nn.Module.__init__(c)
        c.register_buffer("k", self.k.clone(), persistent=False)
        c.register_buffer("v", self.v.clone(), persistent=False)
        c.slots, c.capacity = self.slots, self.capacity
        return c


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
    """Llama's RMSNorm (w * x, cast before scaling), or Gemma's ((1 + w) * x in fp32, cast after)."""

    def __init__(self, dim: int, eps: float, gemma: bool = False):
        super().__init__()
        self.eps, self.gemma = eps, gemma
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))

    def forward(self, x):
        dt = x.dtype
        if self.gemma:
            y = x.float()
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
            return (y * (1.0 + self.weight.float())).to(dt)
        if dt == torch.float32:  # one fused op instead of five small ones (the same numbers in fp32)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_tables(cfg: ModelConfig, rows: "Rows") -> dict:
    """{RopeSpec: (cos, sin) [N, 1, dim]} for each distinct rotary setting of the model's layers.

    A length-dependent setting (dynamic, longrope) is computed per sequence from its length after this
    step, as transformers computes it from the step's longest position."""
    out = {}
    for spec in dict.fromkeys(cfg.ropes):
        if not spec.length_dependent:
            out[spec] = spec.tables(rows.pos)
            continue
        parts = [spec.tables(rows.pos[r0:r0 + n], seq_len=p0 + n) for _, r0, n, p0 in rows.segments]
        out[spec] = (torch.cat([c for c, _ in parts]), torch.cat([s for _, s in parts]))
    return out


def apply_rope(x, cos, sin):
    """Rotate the first cos.shape[-1] channels of each head (all of them unless partial_rotary_factor < 1)."""
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rd], cos, sin), x[..., rd:]], dim=-1)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos.to(x.dtype)) + (rot * sin.to(x.dtype))


def _attend_row(q, k, v, scale: float):
    """One query row (every key visible) in fp32, its output rounded once to q's half dtype. On CPU, torch's
    SDPA runs a bf16 row through its flash kernel at 277 us for 14 heads x 257 keys on an AMD EPYC, this at 86
    (docs/runs/2026-12-06/session28-epyc): in a batch-8 bf16 decode step of the 0.5B that was 52 of ~110 ms."""
    h, kvh, d = q.shape[1], k.shape[1], q.shape[3]
    s = torch.bmm(q.float().reshape(kvh, h // kvh, d), k[0].float().transpose(1, 2)).mul_(scale)
    return torch.bmm(torch.softmax(s, dim=-1), v[0].float()).reshape(1, h, 1, d).to(q.dtype)


def _attend(q, k, v, p0: int, k0: int, window: int, scale: float, softcap: float):
    """q [1, H, n, D] at positions p0..; k/v [1, KV, m, D] at positions k0..; causal, windowed, soft-capped."""
    n, m = q.shape[2], k.shape[2]
    if n == 1 and not softcap and q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        return _attend_row(q, k, v, scale)  # one decode row sees every key read for it (k0 is its window's start)
    if not softcap and not window and k0 == 0:  # the plain causal cases, no mask tensor needed
        if n == 1:
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        if p0 == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    qpos = torch.arange(p0, p0 + n, device=q.device)[:, None]
    kpos = torch.arange(k0, k0 + m, device=q.device)[None]
    mask = kpos <= qpos
    if window:
        mask &= qpos - kpos < window
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(2, 3)) * scale
    s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=cfg.o_bias)
        self.qkv_proj = None  # quant.fuse_projections may replace q/k/v with one fused linear
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_eps, cfg.gemma_norms)
            self.k_norm = RMSNorm(d, cfg.rms_eps, cfg.gemma_norms)

    def forward(self, x, cos, sin, cache: KVCache, rows: Rows):
        """x [N, hidden]: one row per token; writes each row's K/V at its slot and position."""
        c = self.cfg
        h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([h * d, kv * d, kv * d], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k = q.reshape(-1, h, d), k.reshape(-1, kv, d)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.write(self.layer, rows, k, v.reshape(-1, kv, d))
        if getattr(cache, "quantized", False):  # an int8 cache: the queries as its integer dot products read them
            q = cache.queries(q)
        window = c.window(self.layer)
        outs = []
        for slot, r0, n, p0 in rows.segments:
            end = p0 + n
            k0 = max(0, p0 - window + 1) if window else 0  # keys no row of this segment can see are not read
            qs = q[r0:r0 + n].transpose(0, 1)[None]  # [1, H, n, D]
            ks, vs = cache.read(self.layer, slot, k0, end)
            ks, vs = ks[None].to(q.dtype), vs[None].to(q.dtype)
            o = _attend(qs, ks, vs, p0, k0, window, c.attn_scale, c.attn_softcap)
            outs.append(o[0].transpose(0, 1).reshape(n, h * d))
        return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))


def activation(name: str):
    return F.silu if name == "silu" else (lambda t: F.gelu(t, approximate="tanh"))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, width: int | None = None):
        super().__init__()
        width = width or cfg.intermediate_size
        self.gate_proj = nn.Linear(cfg.hidden_size, width, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, width, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(width, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gate_up_proj = None  # quant.fuse_projections may replace gate/up with one fused linear
        self.act = activation(cfg.act)

    def forward(self, x):
        if self.gate_up_proj is not None:
            g, u = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(self.act(g) * u)
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        g = cfg.gemma_norms
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, g)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, g)
        if g:  # Gemma's sandwich: post_attention_layernorm normalizes the attention output
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, g)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, g)
        if cfg.is_sparse(layer):
            self.mlp = SparseMoE(cfg, lambda: MLP(cfg, cfg.moe_intermediate_size))
        else:
            self.mlp = MLP(cfg)
        self.sandwich = g

    def forward(self, x, cos, sin, cache, rows):
        if self.sandwich:
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, cache, rows))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, rows)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Parameter names follow Hugging Face's, so a HF state dict loads as is."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        # On meta (build_model, which fills it by load_state_dict(assign=True)) an explicit weight skips the random
        # init, whose first normal_ there costs 1.6-1.9 s of torch's lazy setup in every process that loads a model.
        on_meta = torch.get_default_device().type == "meta"
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(
            cfg.vocab_size, cfg.hidden_size) if on_meta else None)
        self.model.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, cfg.gemma_norms)
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
        c = self.cfg
        tables = rope_tables(c, rows)
        x = self.model.embed_tokens(tokens).to(self.compute_dtype)
        if c.embed_scale != 1.0:  # Gemma: the scale rounded to the compute dtype, as transformers does
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        for i, blk in enumerate(self.model.layers):
            x = blk(x, *tables[c.ropes[i]], cache, rows)
        if logits_at is not None:
            x = x[logits_at]
        logits = self.lm_head(self.model.norm(x))
        if c.final_softcap:
            logits = torch.tanh(logits / c.final_softcap) * c.final_softcap
        return logits.float()

    def forward(self, tokens: torch.Tensor, start: int, cache: KVCache, last_only: bool = False) -> torch.Tensor:
        """tokens [B, T]: sequence b (cache slot b) at positions start..start+T-1; logits [B, T, V] (fp32)."""
        b, t = tokens.shape
        rows = Rows.of([(i, start, t) for i in range(b)], tokens.device)
        at = torch.arange(t - 1, b * t, t, device=tokens.device) if last_only else None
        return self.forward_rows(tokens.reshape(-1), rows, cache, at).reshape(b, 1 if last_only else t, -1)


def _read_json(path: Path) -> dict:
    from engine.common.errors import UserError

    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} does not exist",
                        "give a Hugging Face model folder (config.json + *.safetensors)") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})",
                        "repair or re-download the file") from None


def load_config(folder: Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    cfg = ModelConfig.from_hf(_read_json(path), str(path))
    gen = Path(folder) / "generation_config.json"
    if gen.exists():
        eos = _read_json(gen).get("eos_token_id")
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
    from engine.common.errors import UserError
    from engine.infer.arch import checkpoint_to_ours

    sd, codes, scheme = load_state_dict(folder), None, None
    qc = _read_json(Path(folder) / "config.json").get("quantization_config")
    if qc:  # an already-quantized checkpoint: dense weights to build with, and its int4 codes (engine/quant)
        from engine.quant.checkpoints import read_scheme, unpack_checkpoint

        scheme = read_scheme(qc, str(Path(folder) / "config.json"))
        sd, codes = unpack_checkpoint(sd, scheme)
    sd = checkpoint_to_ours(sd, cfg)
    emb = sd.get("model.embed_tokens.weight")
    head = emb if cfg.tie_embeddings else sd.get("lm_head.weight")
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing:
        raise UserError(f"{folder}: tensor '{missing[0]}' is missing from the safetensors files"
                        + (f" ({len(missing) - 1} more)" if len(missing) > 1 else ""),
                        "use the complete checkpoint whose config.json this is")
    if unexpected:
        raise UserError(f"{folder}: tensor '{unexpected[0]}' in the safetensors files is not used by the "
                        f"{cfg.family} architecture config.json describes"
                        + (f" ({len(unexpected) - 1} more)" if len(unexpected) > 1 else ""),
                        "check that config.json belongs to these weights (docs/MODELS.md lists what each family reads)")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device=device, dtype=dtype)
    model.eval().requires_grad_(False)
    model.checkpoint_codes, model.checkpoint_scheme = codes, scheme
    model.checkpoint_float_dtypes = {part: None if t is None else t.dtype  # as stored, before the cast to `dtype`
                                     for part, t in (("head", head), ("embedding", emb))}
    return model
