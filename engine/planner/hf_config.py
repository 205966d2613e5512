"""A model's shape from its Hugging Face config.json: the fields read, the fields known to change neither
bytes nor FLOPs, and a refusal naming any field that would (docs/PLANNER.md "Any model from its config.json")."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from engine.planner.shapes import ModelShape, ShapeError

# config.json fields, by what the planner does with them (docs/PLANNER.md "Any model from its config.json").
HF_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3",
                  "gemma3_text", "phi3", "gpt_oss", "deepseek_v3")
_HF_READ = {  # fields read into the shape
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings", "attention_bias",
    "mlp_bias", "qkv_bias", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
    "sliding_window_pattern", "_sliding_window_pattern", "num_local_experts", "num_experts", "n_routed_experts",
    "num_experts_per_tok", "experts_per_token", "moe_intermediate_size", "shared_expert_intermediate_size",
    "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "mlp_only_layers", "decoder_sparse_step",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "qk_head_dim", "v_head_dim",
    "text_config", "_name_or_path",
}
_HF_NO_BYTES = {  # fields that change neither bytes nor FLOPs (values, masks, training, token ids, rope)
    "architectures", "transformers_version", "dtype", "torch_dtype", "id2label", "label2id", "problem_type",
    "return_dict", "output_attentions", "output_hidden_states", "chunk_size_feed_forward", "is_encoder_decoder",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "attention_dropout",
    "rms_norm_eps", "layer_norm_eps", "hidden_act", "hidden_activation", "rope_theta", "rope_scaling",
    "rope_parameters", "rope_local_base_freq", "rope_interleave", "partial_rotary_factor",
    "original_max_position_embeddings", "pretraining_tp", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group", "topk_method",
    "scoring_func", "aux_loss_alpha", "seq_aux", "ep_size", "embd_pdrop", "resid_pdrop", "attn_logit_softcapping",
    "final_logit_softcapping", "query_pre_attn_scalar", "cache_implementation", "use_bidirectional_attention",
    "swiglu_limit", "swiglu_alpha", "initial_context_length", "tokenizer_class", "auto_map", "use_qk_norm",
    "boi_token_index", "eoi_token_index", "image_token_index", "mm_tokens_per_image", "bos_token", "eos_token",
}
_TIED_BY_DEFAULT = {"gemma2", "gemma3", "gemma3_text"}


def _req(cfg: Mapping, key: str, where: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        got = "missing" if key not in cfg else f"{v!r}, not a positive integer"
        raise ShapeError(f"{where}: field '{key}' is {got}; a {cfg.get('model_type')} config.json must set it")
    return v


def _one_of(cfg: Mapping, keys: tuple[str, ...], where: str, required: bool = True) -> int:
    """The value of whichever spelling is present (they must agree)."""
    vals = {k: cfg[k] for k in keys if cfg.get(k) is not None}
    if len(set(vals.values())) > 1:
        raise ShapeError(f"{where}: fields {', '.join(vals)} disagree ({vals}); keep one of them")
    if not vals:
        if required:
            raise ShapeError(f"{where}: field '{keys[0]}' is missing; a {cfg.get('model_type')} config.json "
                             "must set it")
        return 0
    k, v = next(iter(vals.items()))
    return _req({k: v, "model_type": cfg.get("model_type")}, k, where)


def _windows(cfg: Mapping, mt: str, layers: int, where: str) -> tuple[int, int]:
    """(sliding_window, layers using it), as transformers builds the layers for this model type."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ShapeError(f"{where}: field 'layer_types' must list one entry per layer ({layers})")
        odd = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
        if odd:
            raise ShapeError(f"{where}: field 'layer_types' holds {', '.join(map(repr, odd))}; the planner "
                             "models full_attention and sliding_attention only")
        local = types.count("sliding_attention")
    elif mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        use = cfg.get("use_sliding_window", False) and window
        local = max(0, layers - int(cfg.get("max_window_layers", layers))) if use else 0
    elif mt in ("gemma3", "gemma3_text"):
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        local = layers - layers // pattern          # every pattern-th layer is global
    elif mt in ("gemma2", "gpt_oss"):
        local = (layers + 1) // 2                   # even layers slide, odd layers are global
    else:                                           # llama, mistral, mixtral, phi3: every layer or none
        local = layers if window else 0
    if mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window", False):
        local = 0                                   # their sliding_window is inert unless use_sliding_window
    if local and not (isinstance(window, int) and window > 0):
        raise ShapeError(f"{where}: {local} layers slide but field 'sliding_window' is {window!r}; set it to "
                         "the window in tokens")
    return (int(window), local) if local else (0, 0)


def shape_from_hf_config(cfg: Mapping, name: str = "custom", *, notes: list | None = None, where: str = "config",
                         **extra) -> ModelShape:
    """Build a shape from a Hugging Face config.json dict, exactly as transformers builds the model.

    Model types: HF_MODEL_TYPES (a config without model_type is read as Llama-style, its
    attention_bias on q/k/v only, as the lab's tiny test models have it). A field that
    would change bytes or FLOPs in a way the shape cannot hold is refused by name (ShapeError); a
    field the planner does not know is named in `notes` (a list to append to), since most are
    harmless; so are what the plan leaves out (a vision tower, DeepSeek's MTP layers, the
    checkpoint's own quantization). `where` names the file in messages.
    """
    notes = notes if notes is not None else []
    if not isinstance(cfg, Mapping):
        raise ShapeError(f"{where}: a config.json holds a JSON object, not {type(cfg).__name__}")
    mt = str(cfg.get("model_type") or "llama")
    if mt not in HF_MODEL_TYPES:
        raise ShapeError(f"{where}: model_type '{mt}' is not supported by the planner; supported: "
                         f"{', '.join(HF_MODEL_TYPES)}. Use a catalog model (--model) or a config of those types")
    if mt == "gemma3":
        text = cfg.get("text_config")
        if not isinstance(text, Mapping):
            raise ShapeError(f"{where}: field 'text_config' is missing; a gemma3 config.json nests the language "
                             "model's fields there")
        notes.append("gemma3: the plan covers the language model (text_config); the vision tower "
                     "(vision_config, ~0.4B parameters at 27B) and image tokens are not counted")
        tied = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
        known = _HF_READ | _HF_NO_BYTES | {"vision_config", "text_config"}
        _note_unknown(cfg, known, where, notes)
        return shape_from_hf_config(dict(text, model_type="gemma3_text", tie_word_embeddings=tied), name,
                                    notes=notes, where=f"{where} text_config", **extra)
    _note_unknown(cfg, _HF_READ | _HF_NO_BYTES | {"quantization_config", "num_nextn_predict_layers"}, where, notes)
    if cfg.get("quantization_config"):
        q = cfg["quantization_config"]
        method = q.get("quant_method", "?") if isinstance(q, Mapping) else "?"
        notes.append(f"quantization_config ({method}) is how the checkpoint is stored; the plan computes the "
                     "weight bytes of each precision it lists")
    if cfg.get("num_nextn_predict_layers"):
        notes.append(f"num_nextn_predict_layers {cfg['num_nextn_predict_layers']}: the multi-token-prediction "
                     "layers (a speculation module) are not counted, as transformers does not load them")

    hidden = _req(cfg, "hidden_size", where)
    layers = _req(cfg, "num_hidden_layers", where)
    heads = _req(cfg, "num_attention_heads", where)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    inter = _req(cfg, "intermediate_size", where)
    vocab = _req(cfg, "vocab_size", where)
    bias = bool(cfg.get("attention_bias", False))
    kw: dict = dict(
        qkv_bias=bias, o_bias=bias and "model_type" in cfg, mlp_bias=bool(cfg.get("mlp_bias", False)),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", mt in _TIED_BY_DEFAULT)),
    )
    if mt == "qwen2":
        kw.update(qkv_bias=True, o_bias=False)                       # Qwen2Attention: q/k/v biases, o without
    elif mt == "qwen2_moe":
        kw.update(qkv_bias=bool(cfg.get("qkv_bias", True)), o_bias=False)
    elif mt in ("mistral", "mixtral", "phi3"):
        kw.update(qkv_bias=False, o_bias=False)                      # no attention biases in these classes
    if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
        kw["qk_norm"] = True
    if mt in ("gemma2", "gemma3_text"):
        kw["norms_per_layer"] = 4
    if mt == "gpt_oss":
        kw.update(qkv_bias=True, o_bias=True, mlp_bias=True, router_bias=True, attention_sinks=True)
    if mt != "llama" and cfg.get("mlp_bias"):
        raise ShapeError(f"{where}: field 'mlp_bias' is only modelled for llama; remove it or use model_type llama")
    window, local = _windows(cfg, mt, layers, where)
    kw.update(sliding_window=window, local_layers=local)

    if mt in ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss", "deepseek_v3"):
        experts = _one_of(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), where)
        active = _one_of(cfg, ("num_experts_per_tok", "experts_per_token"), where)
        if active > experts:
            raise ShapeError(f"{where}: field 'num_experts_per_tok' {active} exceeds the {experts} experts")
        kw.update(experts=experts, active_experts=active)
        if mt in ("qwen2_moe", "qwen3_moe", "deepseek_v3"):
            kw["moe_intermediate"] = _req(cfg, "moe_intermediate_size", where)
        if mt in ("qwen2_moe", "qwen3_moe"):
            only = cfg.get("mlp_only_layers") or []
            step = int(cfg.get("decoder_sparse_step") or 1)
            if not isinstance(only, list) or any(not isinstance(i, int) for i in only):
                raise ShapeError(f"{where}: field 'mlp_only_layers' must be a list of layer indices")
            moe = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
            kw["dense_layers"] = layers - len(moe)
        if mt == "qwen2_moe":
            kw.update(shared_expert_intermediate=int(cfg.get("shared_expert_intermediate_size") or 0),
                      shared_expert_gate=bool(cfg.get("shared_expert_intermediate_size")))
        if mt == "deepseek_v3":
            first, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
            kw["dense_layers"] = layers - sum(1 for i in range(layers) if i >= first and i % freq == 0)
            kw["shared_expert_intermediate"] = int(cfg.get("n_shared_experts") or 0) * kw["moe_intermediate"]
            kw["router_bias"] = True                                  # e_score_correction_bias
    if mt == "deepseek_v3":
        if bias:
            raise ShapeError(f"{where}: field 'attention_bias' true is not modelled for MLA; it is false in "
                             "DeepSeek-V3's config.json")
        rope = _req(cfg, "qk_rope_head_dim", where)
        nope = _req(cfg, "qk_nope_head_dim", where)
        if cfg.get("qk_head_dim") not in (None, rope + nope):
            raise ShapeError(f"{where}: field 'qk_head_dim' {cfg['qk_head_dim']} is not qk_nope_head_dim + "
                             f"qk_rope_head_dim ({rope + nope})")
        kw.update(kv_lora_rank=_req(cfg, "kv_lora_rank", where), q_lora_rank=int(cfg.get("q_lora_rank") or 0),
                  qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=_req(cfg, "v_head_dim", where),
                  head_dim=rope + nope, qkv_bias=False, o_bias=False)
    kw.update(extra)
    return ModelShape(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, intermediate=inter, vocab=vocab,
        max_context=int(cfg.get("max_position_embeddings") or 0),
        family=kw.pop("family", mt), hf_id=kw.pop("hf_id", str(cfg.get("_name_or_path") or "")), **kw)


def _note_unknown(cfg: Mapping, known: set, where: str, notes: list) -> None:
    unknown = sorted(k for k in cfg if k not in known)
    if unknown:
        notes.append(f"{where}: fields the planner does not know, assumed not to change bytes or FLOPs: "
                     + ", ".join(unknown))


def shape_from_hf_config_file(path: str | Path, name: str | None = None, notes: list | None = None) -> ModelShape:
    """shape_from_hf_config on a config.json file; errors name the file (and the field)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ShapeError(f"{p}: cannot read it ({e.strerror or e}); pass the path of a config.json") from None
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ShapeError(f"{p}: not JSON ({e}); pass a Hugging Face config.json") from None
    stem = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return shape_from_hf_config(cfg, name or stem, notes=notes, where=str(p), source=f"config.json at {p}")
