"""The families we compute, and every config.json field: implemented, harmless, or refused by name.

One visible place for the differences between families (the ``FAMILIES`` table) and for what a
config field does to the arithmetic (``read_config``). A field that changes the numbers is either
implemented exactly as transformers computes it or refused with the fix; a field we do not know
gets a ``ConfigFieldWarning`` naming it (many are harmless: training settings, token ids).
docs/MODELS.md lists the same table for people.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from engine.common.errors import UserError
from engine.ops.rope import ROPE_TYPES, RopeSpec


class ConfigFieldWarning(UserWarning):
    """A config.json field the engine does not know; named, so a user can judge it."""


@dataclass(frozen=True)
class Family:
    """How one model_type differs from Llama. Every switch is read from here, never from the type name."""

    name: str
    qkv_bias: bool = False         # Qwen2: q/k/v biases whatever attention_bias says
    qk_norm: bool = False          # Qwen3, Gemma 3: RMSNorm over head_dim on q and k, before RoPE
    gemma: bool = False            # (1 + w) norms in fp32, sandwich norms, sqrt(hidden) embedding scale
    window: str = "none"           # none | all | qwen (use_sliding_window: layers >= max_window_layers)
                                   # | all_if_used (use_sliding_window: all) | alternate | pattern
    fused_checkpoint: bool = False # Phi-3: qkv_proj and gate_up_proj stored fused
    moe: str = ""                  # mixtral | qwen3_moe: the router's arithmetic
    act_field: str = "hidden_act"


FAMILIES: dict[str, Family] = {
    "llama": Family("llama"),
    "mistral": Family("mistral", window="all"),
    "qwen2": Family("qwen2", qkv_bias=True, window="qwen"),
    "qwen3": Family("qwen3", qk_norm=True, window="qwen"),
    "gemma2": Family("gemma2", gemma=True, window="alternate", act_field="hidden_activation"),
    "gemma3_text": Family("gemma3", gemma=True, qk_norm=True, window="pattern", act_field="hidden_activation"),
    "phi3": Family("phi3", fused_checkpoint=True, window="all"),
    "mixtral": Family("mixtral", window="all", moe="mixtral"),
    "qwen3_moe": Family("qwen3-moe", qk_norm=True, window="all_if_used", moe="qwen3_moe"),
}

ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}

# Fields that do not change inference arithmetic: training-only settings, metadata, token ids.
HARMLESS = {
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "initializer_range",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout", "embd_pdrop",
    "resid_pdrop", "hidden_dropout", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "_name_or_path", "_model_name_or_path", "tokenizer_class", "pretraining_tp",
    "attn_implementation", "_attn_implementation",
    "id2label", "label2id", "output_attentions", "output_hidden_states", "return_dict", "auto_map",
    "max_position_embeddings", "chunk_size_feed_forward", "is_encoder_decoder", "tie_encoder_decoder",
    "problem_type", "torchscript", "use_bfloat16", "tf_legacy_loss", "add_cross_attention",
    "cross_attention_hidden_size", "decoder_start_token_id", "sep_token_id", "task_specific_params",
    "finetuning_task", "pruned_heads", "prefix", "cache_implementation", "router_z_loss_coef",
    "final_logit_softcapping_enabled", "_sliding_window_pattern", "sliding_window_pattern",
}
# Fields read below (implemented); anything else is warned about by name.
IMPLEMENTED = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings", "rope_theta", "rope_scaling",
    "rope_parameters", "partial_rotary_factor", "attention_bias", "mlp_bias", "hidden_act",
    "hidden_activation", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "num_local_experts",
    "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
    "mlp_only_layers", "original_max_position_embeddings", "rope_local_base_freq",
    "use_bidirectional_attention", "quantization_config",
}
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


def family_of(cfg: dict, source: str = "config.json") -> Family:
    mt = cfg.get("model_type")
    if mt is None:
        raise UserError(f"{source} has no 'model_type' field",
                        "add it (e.g. \"llama\"), or use the model's own config.json")
    if mt == "gemma3":
        raise UserError(f"{source}: model type 'gemma3' is the multimodal Gemma 3 (vision + text)",
                        "use its text-only checkpoint (model_type 'gemma3_text', e.g. google/gemma-3-1b-it)")
    if mt not in FAMILIES:
        raise UserError(f"{source}: model type '{mt}' is not supported",
                        f"use one of: {', '.join(sorted(FAMILIES))} (docs/MODELS.md)")
    return FAMILIES[mt]


def _refuse(source: str, field: str, value, fix: str):
    raise UserError(f"{source}: config field '{field}' = {value!r} is not computed by this engine", fix)


def check_fields(cfg: dict, source: str = "config.json") -> list[str]:
    """Warn (ConfigFieldWarning) about every field we neither implement nor know to be harmless."""
    unknown = sorted(k for k in cfg if k not in HARMLESS and k not in IMPLEMENTED)
    for k in unknown:
        warnings.warn(f"{source}: config field '{k}' is not known to this engine and is ignored; "
                      "check docs/MODELS.md if it changes the arithmetic", ConfigFieldWarning, stacklevel=3)
    return unknown


def _rope_params(cfg: dict, layer_type: str | None) -> dict:
    """The rope dict of one layer type, in either the transformers 5 form (rope_parameters) or the older
    one (rope_theta + rope_scaling)."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        if layer_type is not None and isinstance(rp.get(layer_type), dict):
            return dict(rp[layer_type])
        if "rope_type" in rp or "rope_theta" in rp:
            return dict(rp)
    out = dict(cfg.get("rope_scaling") or {})
    if "type" in out and "rope_type" not in out:
        out["rope_type"] = out.pop("type")
    theta = cfg.get("rope_theta", 10000.0)
    if layer_type == "sliding_attention" and cfg.get("rope_local_base_freq") is not None:
        theta, out = cfg["rope_local_base_freq"], {}  # Gemma 3's local layers: plain RoPE at their own base
    out.setdefault("rope_theta", theta)
    out.setdefault("rope_type", "default")
    return out


def rope_spec(cfg: dict, head_dim: int, layer_type: str | None, source: str) -> RopeSpec:
    p = _rope_params(cfg, layer_type)
    t = p.get("rope_type") or "default"
    if t not in ROPE_TYPES:
        _refuse(source, "rope_type", t, f"supported rope types: {', '.join(ROPE_TYPES)}")
    prf = float(p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)) or 1.0)
    dim = int(head_dim * prf)
    orig = int(p.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings") or 0)
    maxpos = int(cfg.get("max_position_embeddings") or 0)
    if t in ("llama3", "yarn", "longrope") and not orig:
        _refuse(source, "original_max_position_embeddings", None, f"rope type {t} needs it: add it to rope_parameters")
    factor = p.get("factor")
    if t in ("linear", "dynamic", "llama3") and factor is None:
        _refuse(source, "rope factor", None, f"rope type {t} needs a 'factor'")
    return RopeSpec(
        dim=dim, theta=float(p.get("rope_theta", 10000.0)), type=t,
        factor=float(factor) if factor is not None else 0.0,
        low_freq_factor=float(p.get("low_freq_factor", 1.0)), high_freq_factor=float(p.get("high_freq_factor", 4.0)),
        original_max_position=orig, max_position=maxpos,
        attention_factor=None if p.get("attention_factor") is None else float(p["attention_factor"]),
        beta_fast=float(p.get("beta_fast") or 32), beta_slow=float(p.get("beta_slow") or 1),
        mscale=float(p.get("mscale") or 0), mscale_all_dim=float(p.get("mscale_all_dim") or 0),
        truncate=bool(p.get("truncate", True)),
        short_factor=tuple(float(x) for x in p.get("short_factor") or ()),
        long_factor=tuple(float(x) for x in p.get("long_factor") or ()),
    )


def layer_types(cfg: dict, fam: Family, layers: int, source: str) -> tuple[str, ...]:
    """full_attention | sliding_attention per layer: config.json's layer_types, else the family's rule."""
    window = cfg.get("sliding_window")
    given = cfg.get("layer_types")
    if given is not None:
        bad = [t for t in given if t not in ("full_attention", "sliding_attention")]
        if bad or len(given) != layers:
            _refuse(source, "layer_types", given, "give one of full_attention/sliding_attention per layer")
        out = tuple(given)
        if fam.window in ("qwen", "all_if_used") and not cfg.get("use_sliding_window", False):
            out = tuple("full_attention" for _ in out)  # transformers drops the window when use_sliding_window is off
    elif fam.window == "all":
        out = tuple("sliding_attention" if window else "full_attention" for _ in range(layers))
    elif fam.window == "qwen":
        on = window and cfg.get("use_sliding_window", False)
        mwl = int(cfg.get("max_window_layers", layers))
        out = tuple("sliding_attention" if on and i >= mwl else "full_attention" for i in range(layers))
    elif fam.window == "all_if_used":
        on = window and cfg.get("use_sliding_window", False)
        out = tuple("sliding_attention" if on else "full_attention" for _ in range(layers))
    elif fam.window == "alternate":
        out = tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers))
    elif fam.window == "pattern":
        pat = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        out = tuple("sliding_attention" if (i + 1) % pat else "full_attention" for i in range(layers))
    else:
        out = tuple("full_attention" for _ in range(layers))
    if "sliding_attention" in out and not window:
        _refuse(source, "sliding_window", window, "a sliding layer needs a positive sliding_window")
    return out


def read_config(cfg: dict, source: str = "config.json") -> dict:
    """ModelConfig keyword arguments from a config.json dict; refuses by name what we do not compute."""
    if not isinstance(cfg, dict):
        raise UserError(f"{source} is not a JSON object", "give the model's config.json")
    fam = family_of(cfg, source)
    missing = [k for k in REQUIRED if cfg.get(k) is None]
    if fam.moe:
        missing += [k for k in ("num_experts_per_tok",) if cfg.get(k) is None]
    if missing:
        raise UserError(f"{source} lacks required field(s): {', '.join(missing)}",
                        "use the model's complete config.json")
    ignored = check_fields(cfg, source)
    if cfg.get("quantization_config"):  # read exactly (engine/quant/checkpoints.py) or refused there by field
        from engine.quant.checkpoints import read_scheme

        read_scheme(cfg["quantization_config"], source)
        if fam.moe or cfg.get("model_type") == "phi3":
            _refuse(source, "quantization_config", cfg["quantization_config"].get("quant_method"),
                    "quantized checkpoints are read for families whose tensors map one to one onto ours (not "
                    "mixture-of-experts or Phi-3's fused projections): give the unquantized checkpoint")
    if cfg.get("use_bidirectional_attention"):
        _refuse(source, "use_bidirectional_attention", True, "use a causal (generative) checkpoint")
    act_name = cfg.get(fam.act_field) or cfg.get("hidden_act") or "silu"
    if act_name not in ACTIVATIONS:
        _refuse(source, fam.act_field, act_name, f"supported activations: {', '.join(ACTIVATIONS)}")
    hidden, heads, layers = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    types = layer_types(cfg, fam, layers, source)
    ropes = tuple(rope_spec(cfg, head_dim, t if _per_type_rope(cfg) else None, source) for t in types)
    if any(r.dim % 2 or r.dim > head_dim for r in ropes):
        _refuse(source, "partial_rotary_factor", cfg.get("partial_rotary_factor"), "the rotated width must be even")
    attn_bias = bool(cfg.get("attention_bias", False))
    kw = dict(
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or 0), num_layers=layers, num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        rope_theta=ropes[0].theta, rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position=_context(cfg, ropes),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", fam.gemma)),
        qkv_bias=fam.qkv_bias or attn_bias, o_bias=attn_bias and not fam.qkv_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        model_type=cfg["model_type"], family=fam.name, act=ACTIVATIONS[act_name], qk_norm=fam.qk_norm,
        gemma_norms=fam.gemma, embed_scale=math.sqrt(hidden) if fam.gemma else 1.0,
        attn_scale=float(cfg["query_pre_attn_scalar"]) ** -0.5 if fam.gemma and cfg.get("query_pre_attn_scalar")
        else head_dim ** -0.5,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0) if fam.gemma else 0.0,
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0) if fam.gemma else 0.0,
        layer_types=types, sliding_window=int(cfg.get("sliding_window") or 0) if "sliding_attention" in types else 0,
        ropes=ropes, fused_checkpoint=fam.fused_checkpoint, ignored_fields=tuple(ignored),
    )
    if fam.moe:
        kw.update(_moe_fields(cfg, fam, layers, source))
    elif not kw["intermediate_size"]:
        raise UserError(f"{source} lacks required field(s): intermediate_size", "use the model's complete config.json")
    eos = cfg.get("eos_token_id")
    kw["eos_token_ids"] = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    return kw


def _context(cfg: dict, ropes) -> int:
    """Positions a sequence may use: max_position_embeddings, times the factor of dynamic NTK scaling
    (its config names the pretraining length there, and the scaling is what extends it)."""
    n = int(cfg.get("max_position_embeddings", 32768))
    dyn = [r.factor for r in ropes if r.type == "dynamic"]
    return int(n * max(dyn)) if dyn else n


def _per_type_rope(cfg: dict) -> bool:
    rp = cfg.get("rope_parameters")
    return (isinstance(rp, dict) and any(isinstance(v, dict) for v in rp.values())) or "rope_local_base_freq" in cfg


def _moe_fields(cfg: dict, fam: Family, layers: int, source: str) -> dict:
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    k = int(cfg["num_experts_per_tok"])
    if experts < 1 or not 1 <= k <= experts:
        _refuse(source, "num_experts_per_tok", k, f"route 1..{experts} experts per token")
    if fam.moe == "mixtral":
        width, renorm, sparse = int(cfg["intermediate_size"]), True, tuple(True for _ in range(layers))
    else:
        width = int(cfg.get("moe_intermediate_size") or 0)
        if not width:
            _refuse(source, "moe_intermediate_size", None, "Qwen3-MoE needs the experts' width")
        renorm = bool(cfg.get("norm_topk_prob", False))
        step, dense = int(cfg.get("decoder_sparse_step", 1) or 1), set(cfg.get("mlp_only_layers") or [])
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
    return dict(num_experts=experts, experts_per_token=k, moe_intermediate_size=width, norm_topk_prob=renorm,
                moe_router=fam.moe, sparse_layers=sparse)


# -- checkpoint names: each family's tensors renamed/split into ours (Llama/Qwen3-MoE names)

def checkpoint_to_ours(sd: dict, cfg) -> dict:
    """A family's state dict in our parameter names: Mixtral's block_sparse_moe.experts.i.w1/w2/w3,
    stacked 3D experts (transformers 5 in memory), Phi-3's fused qkv_proj / gate_up_proj."""
    out = {}
    h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    for name, t in sd.items():
        n = name.replace(".block_sparse_moe.", ".mlp.")
        if ".mlp.experts." in n:
            n = n.replace(".w1.", ".gate_proj.").replace(".w3.", ".up_proj.").replace(".w2.", ".down_proj.")
            if n.endswith(".mlp.experts.gate_up_proj"):   # [E, 2I, H] in one tensor
                pre = n[: -len("gate_up_proj")]
                for e in range(t.shape[0]):
                    g, u = t[e].chunk(2, dim=0)
                    out[f"{pre}{e}.gate_proj.weight"], out[f"{pre}{e}.up_proj.weight"] = g, u
                continue
            if n.endswith(".mlp.experts.down_proj"):      # [E, H, I]
                pre = n[: -len("down_proj")]
                for e in range(t.shape[0]):
                    out[f"{pre}{e}.down_proj.weight"] = t[e]
                continue
        if cfg.fused_checkpoint and n.endswith("self_attn.qkv_proj.weight"):
            pre = n[: -len("qkv_proj.weight")]
            q, k, v = t.split([h * d, kv * d, kv * d], dim=0)
            out[pre + "q_proj.weight"], out[pre + "k_proj.weight"], out[pre + "v_proj.weight"] = q, k, v
            continue
        if cfg.fused_checkpoint and n.endswith("mlp.gate_up_proj.weight"):
            pre = n[: -len("gate_up_proj.weight")]
            out[pre + "gate_proj.weight"], out[pre + "up_proj.weight"] = t.chunk(2, dim=0)
            continue
        out[n] = t
    return out
