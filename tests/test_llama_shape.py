"""bench/llama_shape.py's model: one set of weights that transformers, llama.cpp and our engine compute alike.

A 2-layer, narrow copy of the Llama 3.2 1B config (its vocabulary, tied embeddings and llama3 rope
scaling kept), built offline by transformers as the benchmark builds the full one, then converted
by llama.cpp's own converter. Equal logits are what make the benchmark's speed comparison one of
the same weights.
"""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
from tests.bench_scripts import bench_script  # noqa: E402

llama_shape = bench_script("llama_shape")

# Narrow, with the rope scaling's original context cut from 8192 to 64 so that a 300-token input runs
# past it (the llama3 rule then rescales most frequencies), and weights ~N(0, 0.2) rather than 0.02 so
# that attention is sharp enough for positions to matter: ignoring the scaling then moves the logits
# by more than their own magnitude (seen: 12.5 on 9.1, 4% of argmaxes kept). With the real 8192 and
# 0.02 it moved them by 3e-4 of their magnitude, too close to rounding for a test to tell.
NARROW = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "initializer_range": 0.2, "rope_scaling": {**llama_shape.LLAMA_3_2_1B["rope_scaling"],
                                           "original_max_position_embeddings": 64}}
N_TOKENS = 300


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return llama_shape.build_folder(tmp_path_factory.mktemp("llama") / "llama-3.2-1b-shape-2l", layers=2, **NARROW)


@pytest.fixture(scope="module")
def ids():
    rnd = random.Random(1)
    return [rnd.randrange(259, llama_shape.LLAMA_3_2_1B["vocab_size"]) for _ in range(N_TOKENS)]


@pytest.fixture(scope="module")
def hf_logits(folder, ids):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].float()


def test_folder_has_the_llama_3_2_1b_vocabulary_and_rope_scaling(folder):
    from transformers import AutoTokenizer

    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    assert cfg["vocab_size"] == 128256 and cfg["tie_word_embeddings"] is True and cfg["num_hidden_layers"] == 2
    assert rope["rope_type"] == "llama3" and rope["factor"] == 32.0
    assert rope["original_max_position_embeddings"] == 64 < N_TOKENS and rope["high_freq_factor"] == 4.0
    tok = AutoTokenizer.from_pretrained(str(folder))
    # Exactly the embedding's rows: llama.cpp's converter takes the tokenizer's size as the vocabulary.
    assert len(tok) == 128256
    text = "def f(x):\n    return x  # é 你好 🦙"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed (make peers)")
def test_gguf_from_llama_cpps_converter_computes_what_transformers_computes(folder, ids, hf_logits):
    src = llama_shape.cache_dir() / "llama-cpp-src"
    if not (src / f"llama_cpp_python-{llama_shape.LLAMA_CPP_VERSION}.tar.gz").exists() and not list(
            src.glob("*/vendor/llama.cpp/convert_hf_to_gguf.py")):
        pytest.skip("the llama-cpp-python sdist is not cached (bench/llama_shape.py downloads it once)")
    import llama_cpp
    import numpy as np

    gguf = llama_shape.convert_f32(folder, folder / "model-F32.gguf")
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=512, n_threads=2, logits_all=True, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)  # its default KV is f16
    llm.eval(ids)
    got = torch.from_numpy(np.array(llm.scores[:len(ids)]))
    # fp32 rounding only; a missed rope scaling moves them by more than their magnitude (NARROW).
    assert (got - hf_logits).abs().max() <= 1e-3 * hf_logits.abs().max()
    assert torch.equal(got.argmax(-1), hf_logits.argmax(-1))


def test_our_engine_loads_the_folder_and_computes_what_transformers_computes(folder, ids, hf_logits):
    from engine.infer.loader import load

    lm = load(str(folder), "fp32", device="cpu")
    with torch.no_grad():
        ours = lm.model.forward(torch.tensor([ids]), 0, lm.model.new_cache(1, 512))[0].float()
    assert (ours - hf_logits).abs().max() <= 1e-4 * hf_logits.abs().max()
    assert torch.equal(ours.argmax(-1), hf_logits.argmax(-1))
