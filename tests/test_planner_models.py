"""The planner's newer shapes (MoE widths, shared experts, sliding windows, MLA) against the published
parameter counts, against transformers' own models of the same config.json, and `plan --model-config`."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.planner import hf_config, shapes  # noqa: E402

from engine.planner import counts
from engine.present.plan_cli import main  # noqa: E402
from engine.planner.gpus import load_gpus  # noqa: E402
from engine.planner.roofline import Deployment, decode_step, memory  # noqa: E402

MODELS = shapes.load_models()
GPUS = load_gpus()
TOLERANCE = 0.02   # published totals are rounded (30.5B, 37B): within 2%

# name: (published total, published active, whether the active figure counts the input embedding)
PUBLISHED = {
    "llama-3.3-70b": (70.6e9, None, True),
    "qwen3-8b": (8.2e9, None, True),
    "qwen3-32b": (32.8e9, None, True),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, True),
    "qwen3-235b-a22b": (235e9, 22e9, True),
    "gemma-3-27b": (27e9, None, True),           # the language model; 27.4B with the vision tower
    "gpt-oss-20b": (20.9e9, 3.6e9, False),       # OpenAI's model card: active excludes the embedding
    "gpt-oss-120b": (116.8e9, 5.1e9, False),
    "deepseek-v3": (671e9, 37e9, True),
    "mixtral-8x22b": (141e9, 39e9, True),
}

# The config.json fields of each checkpoint (as published; rope, eps, token ids left out).
CONFIGS = {
    "llama-3.3-70b": ("llama", dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                                    num_key_value_heads=8, num_hidden_layers=80, vocab_size=128256,
                                    max_position_embeddings=131072, tie_word_embeddings=False)),
    "qwen3-32b": ("qwen3", dict(hidden_size=5120, intermediate_size=25600, num_attention_heads=64,
                                num_key_value_heads=8, head_dim=128, num_hidden_layers=64, vocab_size=151936,
                                max_position_embeddings=40960, tie_word_embeddings=False)),
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                        num_hidden_layers=48, num_experts=128, num_experts_per_tok=8,
                                        vocab_size=151936, max_position_embeddings=40960, tie_word_embeddings=False)),
    "qwen3-235b-a22b": ("qwen3_moe", dict(hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
                                          num_attention_heads=64, num_key_value_heads=4, head_dim=128,
                                          num_hidden_layers=94, num_experts=128, num_experts_per_tok=8,
                                          vocab_size=151936, max_position_embeddings=40960,
                                          tie_word_embeddings=False)),
    "gemma-3-27b": ("gemma3_text", dict(hidden_size=5376, intermediate_size=21504, num_attention_heads=32,
                                        num_key_value_heads=16, head_dim=128, num_hidden_layers=62,
                                        sliding_window=1024, max_position_embeddings=131072)),
    "gpt-oss-20b": ("gpt_oss", dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                                    num_key_value_heads=8, head_dim=64, num_hidden_layers=24, num_local_experts=32,
                                    num_experts_per_tok=4, vocab_size=201088, sliding_window=128,
                                    max_position_embeddings=131072, tie_word_embeddings=False)),
    "gpt-oss-120b": ("gpt_oss", dict(hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
                                     num_key_value_heads=8, head_dim=64, num_hidden_layers=36, num_local_experts=128,
                                     num_experts_per_tok=4, vocab_size=201088, sliding_window=128,
                                     max_position_embeddings=131072, tie_word_embeddings=False)),
    "deepseek-v3": ("deepseek_v3", dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                                        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                                        num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
                                        num_experts_per_tok=8, first_k_dense_replace=3, kv_lora_rank=512,
                                        q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                                        n_group=8, topk_group=4, max_position_embeddings=163840,
                                        tie_word_embeddings=False)),
    "mixtral-8x22b": ("mixtral", dict(hidden_size=6144, intermediate_size=16384, num_attention_heads=48,
                                      num_key_value_heads=8, num_hidden_layers=56, num_local_experts=8,
                                      num_experts_per_tok=2, vocab_size=32768, max_position_embeddings=65536,
                                      sliding_window=None, tie_word_embeddings=False)),
}

# A tiny config per supported model type, each exercising that type's byte-changing fields.
TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=6,
            vocab_size=101, max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2)
TINY_TYPES = {
    "llama": dict(attention_bias=True, mlp_bias=True),
    "mistral": dict(sliding_window=32),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2": dict(),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, mlp_only_layers=[1]),
    "qwen3": dict(head_dim=24, use_sliding_window=True, sliding_window=16, max_window_layers=2),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=24,
                      mlp_only_layers=[0], decoder_sparse_step=2),
    "gemma2": dict(head_dim=16, sliding_window=16),
    "gemma3_text": dict(head_dim=16, sliding_window=16),
    "phi3": dict(sliding_window=32),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=16),
    "deepseek_v3": dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=2,
                        first_k_dense_replace=2, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=12, n_group=1, topk_group=1, num_key_value_heads=4),
}


def _hf_config(model_type: str, fields: dict) -> dict:
    from transformers import AutoConfig
    return json.loads(AutoConfig.for_model(model_type, **fields).to_json_string())


def _hf_param_count(cfg: dict) -> int:
    """What transformers' model of this config holds: parameters (tied once) + persistent buffers
    (DeepSeek's e_score_correction_bias), built on the meta device (no memory)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    persistent = model.state_dict().keys()
    return (sum(p.numel() for p in model.parameters())
            + sum(b.numel() for n, b in model.named_buffers() if n in persistent))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_entry_matches_published_parameter_counts(name):
    m = MODELS[name]
    assert m.source.startswith("config.json of") or m.source.startswith("text_config of"), m.source
    assert m.hf_id.split("/")[-1].lower() in m.source.lower()
    total, active, with_embedding = PUBLISHED[name]
    assert counts.param_count(m) == pytest.approx(total, rel=TOLERANCE)
    if active is not None:
        got = counts.param_count(m, active=True) - (0 if with_embedding else m.vocab * m.hidden)
        assert got == pytest.approx(active, rel=TOLERANCE)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_catalog_entry_is_its_config_json_and_transformers_agrees(name):
    model_type, fields = CONFIGS[name]
    cfg = _hf_config(model_type, fields)
    got = hf_config.shape_from_hf_config(cfg, name=name)
    want = MODELS[name]
    for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied_embeddings",
              "max_context", "qkv_bias", "o_bias", "mlp_bias", "qk_norm", "experts", "active_experts",
              "moe_intermediate", "shared_expert_intermediate", "dense_layers", "router_bias", "attention_sinks",
              "sliding_window", "local_layers", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
              "qk_nope_head_dim", "v_head_dim", "norms_per_layer"):
        assert getattr(got, f) == getattr(want, f), f
    assert counts.param_count(want) == _hf_param_count(cfg)


@pytest.mark.parametrize("model_type", sorted(TINY_TYPES))
def test_tiny_config_of_each_type_counts_as_transformers_builds_it(model_type):
    cfg = _hf_config(model_type, {**TINY, **TINY_TYPES[model_type]})
    shape = hf_config.shape_from_hf_config(cfg)
    assert counts.param_count(shape) == _hf_param_count(cfg)


def test_kv_bytes_windowed_layers_are_bounded():
    ctx = 32768
    g = MODELS["gemma-3-27b"]       # 62 layers: every 6th global (10), 52 keep 1024 tokens; 16 KV heads x 128, bf16
    per_layer = 2 * 16 * 128 * 2
    assert counts.kv_cache_bytes(g, ctx) == per_layer * (10 * ctx + 52 * 1024)
    assert counts.kv_bytes_per_token(g, "bf16", ctx) == per_layer * (10 * ctx + 52 * 1024) / ctx
    assert counts.kv_bytes_per_token(g, "bf16", 512) == per_layer * 62          # inside the window: every layer
    assert counts.kv_bytes_per_token(g) == per_layer * 62                       # no context: the upper bound
    o = MODELS["gpt-oss-120b"]      # 36 layers alternating: 18 full, 18 keep 128 tokens; 8 KV heads x 64
    assert counts.kv_cache_bytes(o, ctx, "fp8") == 2 * 8 * 64 * 1 * (18 * ctx + 18 * 128)
    # int8 adds fp16 scales as the engine's paged cache keeps them: per 32 values of a K vector (2 for
    # head_dim 64) and one per V vector, per KV head (engine.common.formulas.kv_pair_bytes)
    assert counts.kv_cache_bytes(o, ctx, "int8") == (2 * 8 * 64 + 8 * (2 * 2 + 2)) * (18 * ctx + 18 * 128)


def test_kv_bytes_mla_latent():
    d = MODELS["deepseek-v3"]       # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) values, bf16
    assert counts.kv_bytes_per_token(d, "bf16") == 61 * (512 + 64) * 2
    assert counts.kv_cache_bytes(d, 100_000, "bf16") == 61 * (512 + 64) * 2 * 100_000
    assert counts.kv_bytes_per_token(d, "int8") == 61 * ((512 + 64) + 2)
    # The latent is one vector for all heads: each GPU of a TP group holds all of it.
    mem = memory(Deployment(d, GPUS["H200"] if "H200" in GPUS else next(iter(GPUS.values())), "fp8", tp=8))
    assert mem.kv_per_token == counts.kv_bytes_per_token(d, "bf16")


def test_windowed_memory_holds_requests_by_their_window():
    g = MODELS["gemma-3-27b"]
    mem = memory(Deployment(g, GPUS["H100 SXM"], "bf16"))
    tokens = 65536
    free = mem.kv_budget_tokens * mem.kv_per_token
    assert mem.kv_bytes(tokens) == pytest.approx(counts.kv_cache_bytes(g, tokens))
    assert mem.max_concurrency(tokens) == int(free // counts.kv_cache_bytes(g, tokens))
    assert mem.max_concurrency(tokens) > int(free // (counts.kv_bytes_per_token(g) * tokens))
    # Decode reads the held KV only: the step at 64K reads kv_cache_bytes, not 62 full layers.
    st = decode_step(Deployment(g, GPUS["H100 SXM"], "bf16"), 4, tokens)
    assert st.kv_bytes == pytest.approx(4 * counts.kv_cache_bytes(g, tokens))


def test_expected_experts_touched():
    f = counts.expected_experts_touched
    assert f(128, 8, 1) == pytest.approx(8)
    assert f(128, 8, 5) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 5))
    assert f(8, 2, 1000) == pytest.approx(8)
    assert f(8, 8, 1) == pytest.approx(8)
    assert f(256, 8, 2) < 2 * 8            # two tokens share some experts
    for bad in ((0, 1, 1), (8, 0, 1), (8, 9, 1), (8, 2, -1)):
        with pytest.raises(shapes.ShapeError):
            f(*bad)
    # The roofline reads the touched share of the expert bytes.
    m = MODELS["qwen3-30b-a3b"]
    dep = Deployment(m, GPUS["H100 SXM"], "bf16")
    wb = counts.weight_bytes_breakdown(m, "bf16")
    one, five = decode_step(dep, 1, 0), decode_step(dep, 5, 0)
    row = wb.embedding / m.vocab
    assert five.weight_bytes - one.weight_bytes == pytest.approx(
        wb.experts * (f(128, 8, 5) - f(128, 8, 1)) / 128 + 4 * row)


def _write(tmp_path: Path, cfg, name: str = "config.json") -> Path:
    p = tmp_path / name
    p.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return p


@pytest.mark.parametrize("model_type", sorted(TINY_TYPES))
def test_plan_model_config_plans_each_type(model_type, tmp_path, capsys):
    big = dict(hidden_size=1024, intermediate_size=2048, num_attention_heads=16, num_key_value_heads=4,
               num_hidden_layers=8, vocab_size=32000)
    cfg = _hf_config(model_type, {**TINY, **TINY_TYPES[model_type], **big})
    folder = tmp_path / f"my-{model_type}"
    folder.mkdir()
    path = _write(folder, cfg)
    rc = main(["plan", "--model-config", str(path), "--gpus", "L4", "--tp", "1", "--top", "2", "--spec", "off"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith(f"my-{model_type}: 1 req/s")
    assert "1x L4" in out


def test_plan_model_config_gemma3_reads_text_config(tmp_path, capsys):
    cfg = _hf_config("gemma3", {"text_config": {**TINY, "head_dim": 16, "sliding_window": 16}})
    rc = main(["plan", "--model-config", str(_write(tmp_path, cfg, "gemma3.json")), "--gpus", "L4", "--json"])
    cap = capsys.readouterr()
    assert rc == 0
    assert json.loads(cap.out)["model"]["local_layers"] == 5
    assert "vision tower" in cap.err


def _refused(argv, capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_plan_model_config_refusals(tmp_path, capsys):
    cfg = _hf_config("llama", TINY)
    err = _refused(["plan", "--model-config", str(_write(tmp_path, dict(cfg, model_type="bert"))), "--gpus", "L4"],
                   capsys)
    assert "model_type 'bert' is not supported" in err and "qwen3_moe" in err
    no_hidden = {k: v for k, v in cfg.items() if k != "hidden_size"}
    path = _write(tmp_path, no_hidden, "nohidden.json")
    err = _refused(["plan", "--model-config", str(path)], capsys)
    assert str(path) in err and "'hidden_size' is missing" in err
    path = _write(tmp_path, '{"model_type": "llama", ', "broken.json")
    err = _refused(["plan", "--model-config", str(path)], capsys)
    assert str(path) in err and "not JSON" in err
    qwen = _hf_config("qwen3", dict(TINY, num_hidden_layers=2))
    odd = dict(qwen, layer_types=["full_attention", "chunked_attention"])
    err = _refused(["plan", "--model-config", str(_write(tmp_path, odd, "odd.json"))], capsys)
    assert "layer_types" in err and "chunked_attention" in err
    err = _refused(["plan", "--model-config", str(_write(tmp_path, cfg, "ok.json")), "--model", "qwen3-8b"], capsys)
    assert "--model-config" in err and "not both" in err
    mla_bias = _hf_config("deepseek_v3", {**TINY, **TINY_TYPES["deepseek_v3"], "attention_bias": True})
    err = _refused(["plan", "--model-config", str(_write(tmp_path, mla_bias, "dsb.json"))], capsys)
    assert "attention_bias" in err


def test_unknown_fields_are_named(tmp_path, capsys):
    cfg = dict(_hf_config("llama", TINY), frobnicate_heads=3)
    rc = main(["plan", "--model-config", str(_write(tmp_path, cfg)), "--gpus", "L4", "--json"])
    assert rc == 0
    assert "frobnicate_heads" in capsys.readouterr().err


def test_moe_default_draft_is_cheaper_per_token():
    from engine.planner.speculation import default_draft
    # qwen3-8b has fewer total parameters than Qwen3-30B-A3B but more than its 3.3B active ones.
    assert default_draft(MODELS["qwen3-30b-a3b"], MODELS) is None
    assert default_draft(MODELS["qwen3-32b"], MODELS).name == "qwen3-8b"
    assert default_draft(MODELS["llama-3.3-70b"], MODELS).name == "llama-3.2-1b"
    assert math.isfinite(counts.param_count(MODELS["mixtral-8x22b"], True))
