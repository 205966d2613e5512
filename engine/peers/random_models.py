"""Random-weight models of real shapes, for speed checks where no weights can be downloaded (GPU boxes).

The folder looks like a converted catalog model (config.json, model.safetensors, tokenizer), so our
loader and transformers both read it. Speed depends on shapes, not values; quality does not, so
these models are never used for quality or acceptance-rate claims.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import cache_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Where a GPU run finds the tokenizer when no catalog model is converted there (bench/gpu_peers.sh).
ASSETS_ENV = "SCL_TOKENIZER_DIR"


def hf_config(shape) -> dict:
    """A transformers config.json for a data/models.json shape (Qwen2 or Llama architecture)."""
    qwen = shape.qkv_bias or shape.family.startswith("qwen")
    if shape.qk_norm or shape.is_moe:
        raise UserError(f"random-init supports dense Llama/Qwen2 shapes; '{shape.name}' is not one",
                        "pick e.g. qwen2.5-coder-1.5b, qwen2.5-7b or llama-3.1-8b")
    return {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
        "vocab_size": shape.vocab, "max_position_embeddings": min(shape.max_context, 32768),
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0 if qwen else 500000.0,
        "tie_word_embeddings": shape.tied_embeddings, "hidden_act": "silu",
        "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
        **({"attention_bias": True} if not qwen and shape.qkv_bias else {}),
    }


def _tokenizer_source() -> Path:
    env = os.environ.get(ASSETS_ENV)
    if env and (Path(env) / "tokenizer.json").exists():
        return Path(env)
    from engine.infer import catalog
    m = catalog.CATALOG[catalog.canonical_name("default-draft")]
    d = catalog._model_dir(m)
    if (d / "tokenizer.json").exists():
        return d
    raise UserError("no tokenizer for a random-init model: no converted catalog model and no "
                    f"${ASSETS_ENV} folder",
                    f"run `make models` here, or point {ASSETS_ENV} at a folder holding tokenizer.json")


def random_state_dict(cfg: dict, seed: int = 0):
    """Weights ~ N(0, 0.02) in bf16 (norms at 1): logits stay finite and varied in every dtype."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias")

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": w(v, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = w(v, h)
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        sd.update({p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
                   p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
                   p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                   p + "mlp.down_proj.weight": w(h, i),
                   p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                   p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)})
        if bias:
            for k, d in (("q", q), ("k", kv), ("v", kv)):
                sd[p + f"self_attn.{k}_proj.bias"] = w(d)
    return sd


def random_model_folder(shape_name: str, root: Path | None = None, seed: int = 0) -> Path:
    """Build (once) and return a folder with random weights of `shape_name` from data/models.json."""
    from safetensors.torch import save_file


    from engine.planner import shapes
    shape = shapes.get_model(shape_name)
    base = Path(root) if root else cache_dir() / "random"
    dest = base / f"{shape.name}-seed{seed}"
    if (dest / "model.safetensors").exists() and (dest / "config.json").exists():
        return dest
    cfg = hf_config(shape)
    tmp = base / f".{shape.name}-seed{seed}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        src = _tokenizer_source()
        for f in TOKENIZER_FILES:
            if (src / f).exists():
                shutil.copy(src / f, tmp / f)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, "bos_token_id": 0}))
        save_file(random_state_dict(cfg, seed), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
