"""Model architecture shapes: the catalog (data/models.json) and the vocabulary of the planner's precisions.

Nothing here loads weights or computes a size: engine/planner/counts.py derives parameter counts, bytes and
FLOPs from these few architecture numbers, so every figure the planner shows traces back to a formula. A shape
also comes from elsewhere: engine/planner/hf_config.py reads one from a Hugging Face config.json, and
engine/peers/gguf_tools.py reads a GGUF header's tensor shapes.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Mapping

from engine.common.paths import DATA
from engine.common.vocab import PRECISIONS, canonical_model_name

MODELS_PATH = DATA / "models.json"

KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
# The planner's precisions: the lab's (engine.common.vocab, shared with the engine and the dashboard's
# pickers) plus fp4, which only Blackwell's FP4 tensor cores run and the lab has no kernel for.
INT4_MIXED = "int4-mixed"  # the Q4_K_M layer rule (module docstring); a format, whatever chose the codes
PLAN_PRECISIONS = PRECISIONS + (INT4_MIXED, "fp4")


def kernel_precision(precision: str) -> str:
    """The precision whose kernels, efficiencies and calibration a plan at `precision` uses: int4-mixed's
    are int4's (the lab's runs of it are int4 records; their fits use the bytes they measured)."""
    return "int4" if precision == INT4_MIXED else precision


class ShapeError(ValueError):
    """A model shape or precision name that cannot be used."""


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a decoder-only transformer: Llama/Qwen/Mistral/Gemma/Phi-3 style
    attention (or DeepSeek's MLA), a dense gated MLP or a mixture of experts, optional sliding
    windows. Every field after `max_context` defaults to "absent", so older entries stay valid."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int                    # MLA: the q/k head width, qk_nope_head_dim + qk_rope_head_dim
    intermediate: int                # dense MLP width; MoE without moe_intermediate: per-expert width
    vocab: int
    tied_embeddings: bool
    max_context: int
    qkv_bias: bool = False
    qk_norm: bool = False            # Qwen3/Gemma 3: RMSNorm of head_dim on q and k in every layer
    experts: int = 0                 # routed experts per MoE layer; 0 = dense MLP
    active_experts: int = 0          # routed experts each token goes to
    extra_linear_params: int = 0     # e.g. EAGLE's fc layer: linear weights outside the usual blocks
    hf_id: str = ""
    family: str = ""
    source: str = ""
    o_bias: bool = False             # bias on o_proj (Llama attention_bias, gpt-oss)
    mlp_bias: bool = False           # biases on every MLP / expert linear (Llama mlp_bias, gpt-oss experts)
    norms_per_layer: int = 2         # hidden-size norms per block (Gemma 2/3: 4, pre and post each sublayer)
    moe_intermediate: int = 0        # per-expert width when it differs from `intermediate` (moe_intermediate_size)
    shared_expert_intermediate: int = 0  # always-on shared expert MLP width in each MoE layer (all shared experts)
    shared_expert_gate: bool = False     # Qwen2-MoE: a sigmoid gate Linear(hidden, 1) on the shared expert
    dense_layers: int = 0            # MoE models: layers with a dense MLP of `intermediate` (first_k_dense_replace)
    router_bias: bool = False        # one bias per routed expert (gpt-oss router, DeepSeek e_score_correction_bias)
    attention_sinks: bool = False    # gpt-oss: one learned sink logit per head and layer
    sliding_window: int = 0          # tokens a local layer attends to (and keeps in its KV cache); 0 = none
    local_layers: int = 0            # how many layers use sliding_window; the others attend to everything
    kv_lora_rank: int = 0            # MLA (DeepSeek-V2/V3): the cached latent width; 0 = ordinary attention
    q_lora_rank: int = 0             # MLA: query low-rank width (0 = a direct q_proj)
    qk_rope_head_dim: int = 0        # MLA: rotary part of q/k per head (its k part is cached beside the latent)
    qk_nope_head_dim: int = 0        # MLA: non-rotary part of q/k per head
    v_head_dim: int = 0              # MLA: value width per head

    def __post_init__(self):
        bad = []
        if self.local_layers and not self.sliding_window or self.sliding_window and not self.local_layers:
            bad.append("sliding_window and local_layers go together (both 0, or both > 0)")
        if not 0 <= self.local_layers <= self.layers:
            bad.append(f"local_layers {self.local_layers} is outside 0..layers ({self.layers})")
        if self.experts and not 0 < self.active_experts <= self.experts:
            bad.append(f"active_experts {self.active_experts} is outside 1..experts ({self.experts})")
        if not 0 <= self.dense_layers <= (self.layers if self.experts else 0):
            bad.append(f"dense_layers {self.dense_layers} needs an MoE model and at most {self.layers} layers")
        if (self.shared_expert_intermediate or self.moe_intermediate or self.router_bias) and not self.experts:
            bad.append("moe_intermediate, shared_expert_intermediate and router_bias need experts > 0")
        if self.kv_lora_rank and not (self.qk_rope_head_dim and self.qk_nope_head_dim and self.v_head_dim):
            bad.append("MLA (kv_lora_rank > 0) needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        if self.kv_lora_rank and self.head_dim != self.qk_rope_head_dim + self.qk_nope_head_dim:
            bad.append("MLA: head_dim must be qk_nope_head_dim + qk_rope_head_dim")
        if self.kv_lora_rank and (self.qkv_bias or self.o_bias):
            bad.append("MLA with attention biases is not modelled")
        if bad:
            raise ShapeError(f"model '{self.name}': " + "; ".join(bad))

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attn_out_dim(self) -> int:
        """Width o_proj reads: heads * head_dim, MLA heads * v_head_dim."""
        return self.heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def expert_intermediate(self) -> int:
        return self.moe_intermediate or self.intermediate

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def global_layers(self) -> int:
        """Layers whose KV cache holds every token (no sliding window)."""
        return self.layers - self.local_layers

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ catalog

def _shape_from_dict(d: Mapping) -> ModelShape:
    known = {f.name for f in fields(ModelShape)}
    kw = {k: v for k, v in d.items() if k in known}
    if "head_dim" not in kw and "hidden" in kw and "heads" in kw:
        kw["head_dim"] = kw["hidden"] // kw["heads"]
    missing = [f.name for f in fields(ModelShape) if f.name not in kw and f.default is MISSING]
    if missing:
        raise ShapeError(f"model '{d.get('name', '?')}' lacks fields: {', '.join(missing)}")
    return ModelShape(**kw)


def load_models(path: str | Path | None = None) -> dict[str, ModelShape]:
    """Read data/models.json (or `path`): {name: ModelShape}, in file order."""
    p = Path(path) if path else MODELS_PATH
    raw = json.loads(p.read_text())
    items = raw["models"] if isinstance(raw, dict) else raw
    out: dict[str, ModelShape] = {}
    for d in items:
        m = _shape_from_dict(d)
        out[m.name] = m
    return out


def get_model(name: str | ModelShape, models: Mapping[str, ModelShape] | None = None) -> ModelShape:
    """Look a model up by catalog name (case-insensitive; 'default' aliases work)."""
    if isinstance(name, ModelShape):
        return name
    models = models if models is not None else load_models()
    n = canonical_model_name(name)
    for k, m in models.items():
        if k.lower() == n or m.hf_id.lower() == n or m.hf_id.lower().split("/")[-1] == n:
            return m
    raise ShapeError(f"unknown model '{name}'; known: {', '.join(models)}")
