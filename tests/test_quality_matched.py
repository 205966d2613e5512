"""bench/quality_matched.py: llama.cpp and our engine scored on the same reference, from the same weights.

End to end on a tiny random Qwen2 (2 layers, hidden 64, built offline by transformers, with the real
Qwen2.5 tokenizer so that llama.cpp's converter recognises it): the folder is the reference, llama.cpp's
own converter makes its F32 GGUF and llama.cpp's quantizer its Q4_K_M, and the F32 GGUF run by
llama.cpp must score KLD ~0 against our reference (same weights, same token ids). Also the picking
function, the per-position profile and the activation rounding of the position-0 probe.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
from tests.bench_scripts import bench_script  # noqa: E402

qm = bench_script("quality_matched")

from engine.measure import quality  # noqa: E402
from engine.measure.eval_text import EvalDoc  # noqa: E402
from engine.measure.kld import Scores  # noqa: E402
from engine.peers import gguf_tools  # noqa: E402

# ---------------------------------------------------------------- the picking function


def _stats(median, p99, top1, wb=None):
    return {"kld_median": median, "kld_p99": p99, "top1_agreement": top1, "weight_bytes": wb}


def test_quality_matched_keeps_only_candidates_no_worse_on_every_statistic():
    target = _stats(0.004, 0.10, 0.95)
    cands = {"g32": _stats(0.003, 0.09, 0.96, 900), "g64": _stats(0.004, 0.10, 0.95, 800),  # ties count
             "g128": _stats(0.005, 0.09, 0.96, 700), "bad": _stats(0.009, 0.2, 0.90, 600)}
    m = quality.quality_matched(cands, target)
    assert m["matched"] == ["g32", "g64"]
    assert m["misses"] == {"g128": ["kld_median"], "bad": ["kld_median", "kld_p99", "top1_agreement"]}
    assert m["pick"] == "g64"  # the matched one with the fewest weight bytes


def test_quality_matched_picks_none_when_nothing_matches_and_refuses_missing_statistics():
    target = _stats(0.001, 0.01, 0.99)
    assert quality.quality_matched({"g32": _stats(0.002, 0.01, 0.99, 1)}, target)["pick"] is None
    with pytest.raises(ValueError, match="kld_p99"):
        quality.quality_matched({"g32": {"kld_median": 0.0, "top1_agreement": 1.0}}, target)
    with pytest.raises(ValueError, match="target"):
        quality.quality_matched({"g32": target}, {"kld_median": 0.0})
    # without weight bytes, the first matched in the order given
    assert quality.quality_matched({"a": _stats(0, 0, 1), "b": _stats(0, 0, 1)}, target)["pick"] == "a"


def test_position_profile_splits_the_first_positions_of_each_document():
    docs = [EvalDoc("a", "chat", tuple(range(7))), EvalDoc("b", "code", tuple(range(6)))]  # 6 + 5 positions
    kl = torch.tensor([5.0, 0.1, 0, 0, 0.01, 0.01, 3.0, 0.2, 0, 0, 0.03], dtype=torch.float64)
    n = kl.numel()
    sc = Scores(kl, torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.float64),
                torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64))
    p = quality.position_profile(sc, docs)
    assert p["0"] == {"documents": 2, "kld_mean": 4.0, "kld_max": 5.0, "over_1": 2, "same_top1": 1.0}
    assert p["1"]["kld_mean"] == pytest.approx(0.15)
    assert p["rest"]["positions"] == 3 and p["rest"]["kld_mean"] == pytest.approx(0.05 / 3)
    assert p["first_share_of_total_kl"] == pytest.approx(8.3 / float(kl.sum()))
    with pytest.raises(ValueError):
        quality.position_profile(sc, docs[:1])


def test_round_q8_is_ggml_s_8_bit_blocks():
    x = torch.tensor([[1000.0] + [0.5] * 255 + [2.0] + [0.5] * 31 + [0.0] * 224])
    q256 = qm.round_q8(x, 256)
    assert q256[0, 0] == 1000.0 and (q256[0, 1:256] == 0).all()  # one massive value crushes its 255 neighbours
    q32 = qm.round_q8(x, 32)
    assert (q32[0, 1:32] == 0).all() and (q32[0, 32:256] == 0.5).all()  # per 32, only its own block
    assert torch.allclose(q32[0, 256:288], x[0, 256:288], atol=2.0 / 254)
    assert (q32[0, 288:] == 0).all()
    with pytest.raises(ValueError):
        qm.round_q8(torch.ones(1, 48), 32)
    assert qm.act_block("Q4_K") == 256 and qm.act_block("Q6_K") == 256 and qm.act_block("Q5_0") == 32
    assert qm.act_block("F32") is None
    with pytest.raises(Exception, match="IQ4_XS"):
        qm.act_block("IQ4_XS")
    assert qm.gguf_name("model.layers.3.mlp.down_proj") == "blk.3.ffn_down.weight"
    assert qm.gguf_name("lm_head") == "output.weight"


# ---------------------------------------------------------------- end to end on a tiny Qwen2


def _real_cache() -> Path:
    from engine.common.paths import cache_dir

    return cache_dir()


def _qwen_tokenizer_folder() -> Path | None:
    from engine.infer import catalog

    d = _real_cache() / "models" / catalog.CATALOG["qwen2.5-coder-0.5b"].name
    return d if (d / "tokenizer.json").exists() else None


def _llama_tools() -> Path | None:
    """llama-imatrix and llama-quantize as `make peers` builds them in the real cache (None: not built)."""
    d = _real_cache() / f"llama-tools-{gguf_tools.LLAMA_CPP_VERSION}"
    return d if (d / "bin" / "llama-imatrix").exists() and (d / "bin" / "llama-quantize").exists() else None


def _sdist_src() -> Path | None:
    from engine.peers.servers import LLAMA_CPP_VERSION

    base = _real_cache() / "llama-cpp-src"
    ok = (base / f"llama_cpp_python-{LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").exists()
    return base if ok else None


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python not installed (make peers)")
    tok, src = _qwen_tokenizer_folder(), _sdist_src()
    if tok is None:
        pytest.skip("the Qwen2.5 tokenizer is not cached (make models)")
    if src is None:
        pytest.skip("the llama-cpp-python sdist is not cached (bench/quality_matched.py downloads it once)")
    from transformers import AutoConfig, AutoModelForCausalLM

    root = tmp_path_factory.mktemp("qm")
    folder = root / "tiny-qwen2"
    folder.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok / f, folder / f)
    cfg = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=151936,
                               tie_word_embeddings=True, max_position_embeddings=1024, initializer_range=0.1,
                               bos_token_id=151643, eos_token_id=151645, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(folder))
    cache = root / "cache"  # the reference and the GGUFs go here; the sdist and llama.cpp's tools are the real cache's
    cache.mkdir()
    (cache / "llama-cpp-src").symlink_to(src)
    tools = _llama_tools()
    if tools is not None:
        (cache / tools.name).symlink_to(tools)
    mp = pytest.MonkeyPatch()
    mp.setenv("SCL_CACHE_DIR", str(cache))
    from engine.ops.config import configure

    # Our rows on the plain-PyTorch path: the pipeline is under test here, not the kernels (which a
    # changed kernels/ tree would otherwise rebuild first, for minutes).
    prev = configure(enabled=False)
    try:
        yield qm.run(str(folder), 96, root / "out", "test", group_sizes=(32,), int8=False, shipped=False,
                     probe=True, probe_prefix=8,
                     llama_types=("Q4_K_M" + gguf_tools.IMATRIX,) if tools is not None else ()), root
    finally:
        configure(prev)
        mp.undo()


def test_f32_gguf_through_llama_cpp_scores_kld_zero_against_our_reference(tiny_run):
    rep, _ = tiny_run
    f32 = rep["rows"][qm.F32]
    assert rep["f32_check"]["ok"], rep["f32_check"]
    assert f32["kld_mean"] < 1e-4 and f32["top1_agreement"] == 1.0
    assert f32["vocab_check"]["detokenized_same"] == f32["vocab_check"]["documents"]


def test_pipeline_writes_every_row_the_pick_and_the_files(tiny_run):
    rep, root = tiny_run
    imat = {qm.requant_label("Q4_K_M-imatrix")} if "imatrix" in rep["gguf"] else set()
    assert set(rep["rows"]) == {qm.F32, qm.REQUANT, "ours int4-g32"} | imat
    assert rep["tokens"] == 96 and all(rep["positions"][k]["0"]["documents"] >= 2 for k in rep["rows"])
    assert Path(rep["gguf"]["Q4_K_M"]).exists() and Path(rep["gguf"]["F32"]).exists()
    # llama-server's Q4_K_M-requant is this file (built once, one file under both names)
    again = gguf_tools.reference_ggufs(rep["model"], Path(rep["folder"]), ("Q4_K_M" + gguf_tools.REQUANT,))
    assert again["Q4_K_M-requant"] == again["Q4_K_M"] == Path(rep["gguf"]["Q4_K_M"])
    assert rep["match"]["pick"] in (None, "ours int4-g32")
    assert set(rep["match"]["matched"]) | set(rep["match"]["misses"]) == {"ours int4-g32"}
    assert len(rep["probe"]["modes"]) == 3
    md = (root / "out" / "quality_matched.md").read_text()
    assert md.splitlines()[2] == "Command: `test`" and "Quality-matched pick" in md
    assert (root / "out" / "quality_matched.json").exists()



def test_imatrix_row_is_llama_cpp_quantizing_with_its_importance_matrix_of_the_calibration_text(tiny_run):
    """llama-imatrix ran on the F32 GGUF over the calibration text (never the eval text), llama-quantize used it:
    the GGUF names the matrix in its metadata, and its 4-5-bit blocks differ from the plain requantization's
    (this tiny model's rows are too short for Q4_K: llama.cpp falls back to Q5_0, which weighs by the matrix too;
    Q8_0 and float tensors do not use it)."""
    rep, root = tiny_run
    if "imatrix" not in rep["gguf"]:
        pytest.skip("llama-imatrix/llama-quantize not built (make peers)")
    import numpy as np

    from engine.infer.calibrate import CALIBRATION_SET, DEFAULT_TOKENS
    from engine.quant.gguf_file import read_gguf

    im = Path(rep["gguf"]["imatrix"])
    assert im.name == f"imatrix-{CALIBRATION_SET}-{DEFAULT_TOKENS}.gguf" and im.exists()
    text = im.with_suffix(".txt").read_text()
    assert text == gguf_tools.calibration_text(root / "tiny-qwen2", DEFAULT_TOKENS)  # what GPTQ/AWQ read
    imat_gguf = Path(rep["gguf"]["F32"]).with_name("model-Q4_K_M-imatrix.gguf")
    r = read_gguf(imat_gguf)
    stored = r.metadata["quantize.imatrix.file"]
    # llama-quantize keeps the path's first 127 bytes (seen: a 131-byte path stored cut after ".g")
    assert str(im).startswith(stored) and len(stored) >= min(len(str(im)), 127)
    plain = read_gguf(rep["gguf"]["Q4_K_M"]).tensors
    differ = [t.name for t in r.tensors.values() if t.name in plain and t.tensor_type == plain[t.name].tensor_type
              and t.tensor_type.name not in ("F32", "F16", "Q8_0") and not np.array_equal(t.data, plain[t.name].data)]
    assert len(differ) >= 10, "the importance matrix changed too few 4-5-bit tensors"
    row = rep["rows"][qm.requant_label("Q4_K_M-imatrix")]
    assert row["precision"] == "Q4_K_M-imatrix" and row["kld_median"] >= 0


def test_blocks_recovered_against_a_folder_counts_the_sub_blocks_llama_cpp_copies_bit_for_bit(tiny_run):
    """bench/blocks_recovered.py --folder: random fp32 weights are copied nowhere; a folder holding the requantized
    GGUF's own weights is copied almost everywhere when requantized again; its permuted copy
    (bench/permuted_model.py's off-grid reference) nowhere, though it computes the same function."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from safetensors.torch import load_file, save_file

    from engine.quant.gguf_codes import hf_name
    from engine.quant.gguf_file import read_gguf
    from engine.quant.permute import write_permuted

    rep, root = tiny_run
    br = bench_script("blocks_recovered")
    share = lambda r: r["kinds"]["all"]["llama_exact"] / r["kinds"]["all"]["sub_blocks"]  # noqa: E731
    assert share(br.run_folder(Path(rep["folder"]), progress=lambda s: None)) == 0.0
    on = root / "on-grid"
    shutil.copytree(rep["folder"], on, ignore=shutil.ignore_patterns("*.safetensors"))
    sd = load_file(str(Path(rep["folder"]) / "model.safetensors"))
    for t in read_gguf(rep["gguf"]["Q4_K_M"]).tensors.values():
        if len(t.shape) == 2 and t.tensor_type.name not in ("F32", "F16"):
            k, n = (int(x) for x in t.shape)
            deq = dequantize(t.data, GGMLQuantizationType[t.tensor_type.name]).astype(np.float32)
            sd[hf_name(t.name)] = torch.from_numpy(deq.reshape(n, k))
    save_file(sd, str(on / "model.safetensors"), metadata={"format": "pt"})
    again = br.run_folder(on, progress=lambda s: None)
    assert share(again) > 0.95, again["kinds"]
    assert share(br.run_folder(write_permuted(on, root / "on-grid-permuted", 0), progress=lambda s: None)) < 0.05


def test_llama_precisions_are_one_vocabulary_and_a_missing_tool_is_named(monkeypatch, tmp_path):
    from engine.peers import peer, servers
    from engine.common.errors import UserError

    assert tuple(servers.LLAMA_PRECISIONS) == peer.LLAMA_PRECISIONS == tuple(gguf_tools.LLAMA_PRECISIONS)
    with pytest.raises(UserError, match="runs Q4_K_M, Q4_K_M-requant, Q4_K_M-imatrix, IQ4_XS.*not 'Q4_K_Z'"):
        peer.PeerConfig.of(system="llama.cpp", precision="Q4_K_Z").validate()
    monkeypatch.setenv("SCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SCL_LLAMA_TOOLS", raising=False)
    with pytest.raises(UserError, match="llama-imatrix is not built.*make peers"):
        gguf_tools.llama_tool("llama-imatrix")
    assert "make peers" in gguf_tools.llama_precision_unavailable("IQ4_XS-imatrix")
    assert gguf_tools.llama_precision_unavailable("Q4_K_M") is None


def test_the_report_names_which_calibration_made_a_calibrated_rows_codes():
    """A calibrated row is one calibration: the report names its version, text, key and codes (and a mixed row's
    int8 count); a row without one adds nothing."""
    rows = {"ours int4-g32": {"calibration": None},
            "ours int4-gptq-mixed-g32": {"calibration": {
                "method": "gptq", "version": 3, "calibration_set": "sharegpt-chat-and-code-exchanges",
                "calibration_tokens": 8192, "key": "6453b3322f18", "codes": "0123456789abcdef", "int8_linears": 136}}}
    assert qm.calibration_lines(rows) == [
        "", "Calibrated rows, one calibration each (the same key under other float rounding gives other codes):",
        "- ours int4-gptq-mixed-g32: gptq version 3, 8192 tokens of sharegpt-chat-and-code-exchanges, cache key "
        "6453b3322f18, codes 0123456789abcdef, 136 linears at int8"]
    assert qm.calibration_lines({"ours int4-g32": {}}) == []
