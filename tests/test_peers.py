"""Peer benchmarks: every system measured the same way, unavailable peers reported, outputs written.

The real-model checks use the 0.5B (its converted cache and its shipped GGUF); the random-init
path (what a GPU box runs) uses the smallest catalog shape.
"""
import json
from pathlib import Path

import pytest

from engine.peers import report as peer_report

from engine import peers
from engine.peers import peer as peer_mod
from engine.common.errors import UserError
from engine.peers import PeerConfig
from engine.measure.records import RunRecord

ROOT = Path(__file__).resolve().parent.parent
N = 8


@pytest.fixture(scope="module")
def real_records():
    """transformers fp32 and our fp32 on the real 0.5B, same prompt ids, N greedy tokens each."""
    base = dict(model="default-draft", max_new_tokens=N, reps=1)
    return {s: peers.measure(PeerConfig.of(system=s, precision="fp32", **base))
            for s in ("transformers", "serving-cost-lab")}


def test_transformers_and_our_engine_agree_on_real_weights(real_records):
    hf, us = real_records["transformers"], real_records["serving-cost-lab"]
    for r in (hf, us):
        assert r.notes == "" and r.kind == "peer"
        m = r.metrics
        assert m["new_tokens"] == N and m["decode_tok_s"] > 0 and 0 < m["ttft_s"] < 60
        assert m["peak_rss_bytes"] > m["weight_bytes"] * 0.9  # the fp32 weights are resident
        assert m["load_peak_rss_bytes"] >= m["peak_rss_bytes"] * 0.9
        assert len(r.output["new_tokens"][0]) == N
    assert hf.output["prompt_ids"] == us.output["prompt_ids"]
    # Same weights, same greedy decoding: the same tokens.
    assert peers.token_agreement(us, hf) == N
    assert hf.config["system"] == "transformers" and hf.versions.get("transformers")


def test_llama_cpp_runs_the_shipped_gguf(real_records):
    if not peer_mod._has("llama_cpp"):
        pytest.skip("llama-cpp-python is not installed here (`make peers` builds it)")
    rec = peers.measure(PeerConfig.of(system="llama.cpp", model="default-draft", precision="Q4_K_M",
                                   max_new_tokens=N, reps=1))
    assert rec.notes == "", rec.notes
    from engine.infer import catalog
    assert rec.metrics["weight_bytes"] == catalog.CATALOG["qwen2.5-coder-0.5b"].size
    assert rec.output["prompt_ids"] == real_records["transformers"].output["prompt_ids"]
    # Our fp32 model is the dequantized GGUF, so llama.cpp's first tokens match it.
    assert peers.token_agreement(rec, real_records["serving-cost-lab"]) >= 4


def test_unavailable_peer_is_reported_not_dropped(monkeypatch, tmp_path):
    from engine.measure.store import Store

    store = Store(tmp_path / "runs.db")
    monkeypatch.setattr(peer_mod, "_has", lambda m: m != "llama_cpp")
    rec = peers.measure(PeerConfig.of(system="llama.cpp", precision="Q4_K_M"), store)
    assert rec.notes.startswith("unavailable: llama-cpp-python is not installed") and "make peers" in rec.notes
    assert rec.metrics == {}
    assert store.list_runs() == []  # nothing measured, nothing stored
    rows = peer_report.peer_rows([rec])
    assert rows[0]["tok_s"] is None and "make peers" in rows[0]["status"]


def test_a_failing_peer_says_why():
    rec = peers.measure(PeerConfig.of(system="transformers", model="no-such-model", max_new_tokens=4, reps=1))
    assert "unknown model 'no-such-model'" in rec.notes


@pytest.mark.parametrize("kw, match", [
    (dict(system="llama.cpp", precision="bf16"), "Q4_K_M"),
    (dict(system="transformers", draft="self"), "no 'self' draft"),
    (dict(system="transformers", precision="int4"), "llm.int8, nf4"),
    (dict(system="vllm"), "unknown peer system"),
    (dict(system="llama.cpp", precision="Q4_K_M", random_init="vicuna-68m"), "random weights"),
    (dict(max_new_tokens=1), "max_new_tokens"),
])
def test_bad_configs_name_the_fix(kw, match):
    with pytest.raises(UserError, match=match):
        PeerConfig.of(**kw).validate()


def _rec(system, precision, tok_s, draft=None, notes=""):
    cfg = PeerConfig.of(system=system, precision=precision, draft=draft or "none")
    return RunRecord(kind="peer", config=peer_mod._record_config(cfg, None),
                     metrics={} if tok_s is None else {"decode_tok_s": tok_s, "ttft_s": 0.1, "new_tokens": 64},
                     machine={}, notes=notes)


def test_rows_and_targets_are_ratios_of_measured_numbers():
    recs = [_rec("transformers", "fp32", 2.0), _rec("llama.cpp", "Q4_K_M", 20.0),
            _rec("llama.cpp", "Q4_K_M", None, "ngram", notes="unavailable: x"),
            _rec("serving-cost-lab", "int4", 18.0), _rec("serving-cost-lab", "int8", 31.0, "model")]
    rows = peer_report.peer_rows(recs)
    by = {r["config"]: r for r in rows}
    assert by["serving-cost-lab int4"]["vs_best_peer"] == 0.9
    assert by["llama.cpp Q4_K_M"]["vs_best_peer"] == 1.0
    assert by["llama.cpp Q4_K_M + Python prompt lookup (llama-cpp-python)"]["status"] == "unavailable: x"
    t = {x["target"]: x for x in peer_report.targets(recs)}
    assert t["best non-speculative vs llama.cpp Q4_K_M"]["ratio"] == 0.9
    assert t["best non-speculative vs llama.cpp Q4_K_M"]["met"] is False
    assert (t["best speculative vs llama.cpp Q4_K_M"]["ratio"] == 1.55
            and t["best speculative vs llama.cpp Q4_K_M"]["met"])
    assert t["best speculative vs transformers fp32"]["ratio"] == 15.5
    fig = peer_report.peer_figure(rows)
    names = {tr.name for tr in fig.data}
    assert names == {"transformers", "llama.cpp", "serving-cost-lab"}
    assert ("not measured: llama.cpp Q4_K_M + Python prompt lookup (llama-cpp-python)"
            in json.dumps(fig.to_dict()["layout"]))


def test_random_init_shape_loads_in_both_systems_and_agrees(tmp_path, monkeypatch):
    """The GPU script's path, on CPU with the smallest shape: random weights, fixed prompt ids."""
    from engine.peers import random_models
    tok_dir = _real_tokenizer_dir()  # tokenizer files come from the real cache, as $SCL_TOKENIZER_DIR on a GPU box
    monkeypatch.setenv("SCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(random_models.ASSETS_ENV, str(tok_dir))
    folder = random_models.random_model_folder("vicuna-68m")
    assert folder.parent == tmp_path / "random"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["model_type"] == "llama"
    ids = [5, 100, 2000, 31000, 7, 9, 11, 13]
    recs = [peers.measure(PeerConfig.of(system=s, precision="fp32", random_init="vicuna-68m", model="vicuna-68m",
                                     prompt_ids=ids, max_new_tokens=N, reps=1))
            for s in ("transformers", "serving-cost-lab")]
    assert all(r.notes == "" for r in recs), [r.notes for r in recs]
    assert recs[0].output["prompt_ids"] == ids
    assert peers.token_agreement(recs[1], recs[0]) == N
    assert random_models.random_model_folder("vicuna-68m") == folder  # built once


def test_bench_cli_writes_table_chart_and_targets(tmp_path, monkeypatch):
    """bench/peers.py end to end on the random-init path: one unavailable peer (fp8 on CPU) is listed."""
    from engine.peers import random_models
    monkeypatch.setenv(random_models.ASSETS_ENV, str(_real_tokenizer_dir()))
    monkeypatch.setenv("SCL_CACHE_DIR", str(tmp_path / "cache"))
    from tests.bench_scripts import bench_script

    bench = bench_script("peers")
    out = tmp_path / "out"
    rc = bench.main(["--random-init", "vicuna-68m", "--device", "cpu", "--only", "serving-cost-lab bf16,fp8",
                     "--max-new-tokens", "4", "--reps", "1", "--out", str(out)])
    assert rc == 0
    md = (out / "peers.md").read_text()
    assert "serving-cost-lab bf16" in md and "serving-cost-lab fp8" in md
    data = json.loads((out / "peers.json").read_text())
    status = {r["config"].split(" (")[0]: r["status"] for r in data["rows"]}
    assert status["serving-cost-lab bf16"] == "ok"
    assert "fp8" in status["serving-cost-lab fp8"] and status["serving-cost-lab fp8"].startswith("unavailable")
    assert "plotly" in (out / "peers.html").read_text()[:200000].lower()
    assert (out / "peers.csv").read_text().startswith("config,tok_s")


def _real_tokenizer_dir():
    from engine.infer import catalog
    return catalog.resolve("default-draft")


@pytest.mark.parametrize("act,env", [("int8", {}), ("fp32", {}), ("int8", {"SCL_FUSED": "0"}),
                                     ("int8", {"SCL_KERNEL_ISA": "avx2"})])
def test_each_labelled_setting_is_what_the_subprocess_ran(act, env, monkeypatch):
    """Issue 23: a row labelled fp32 activations ran int8 ones (the child's environment left the setting
    unset). Each labelled setting (activations, the fused path, the ISA) runs in its own peer subprocess,
    and the kernel settings that process recorded are the ones its label and environment name."""
    from engine.peers import random_models
    # the user's cache (not tmp_path): its kernel build is shared, a fresh cache dir compiles it per case
    monkeypatch.setenv(random_models.ASSETS_ENV, str(_real_tokenizer_dir()))
    monkeypatch.delenv("SCL_KERNEL_ACT", raising=False)
    cfg = PeerConfig.of(system="serving-cost-lab", precision="int4", random_init="vicuna-68m", model="vicuna-68m",
                        prompt_ids=[5, 100, 2000, 7], max_new_tokens=4, reps=1, act=act)
    rec = peers.measure(cfg, env=env)
    assert rec.notes == "", rec.notes
    ran = rec.kernels["settings"]
    assert ran["act_int8"] is (act == "int8")
    assert ("fp32 act" in rec.config["label"]) is (act == "fp32")
    assert ran["fused"] is ("SCL_FUSED" not in env)
    assert ran["isa"] == env.get("SCL_KERNEL_ISA")
    assert rec.kernels["int4_activations"].startswith("int8" if act == "int8" else "fp32")


def test_a_label_that_differs_from_what_ran_is_refused():
    """The parent's check itself: recorded settings other than the environment's make the record a failure."""
    asked = {"SCL_KERNEL_ACT": "fp32"}
    from engine.ops.config import KernelConfig
    ran = KernelConfig.from_env({}).to_dict()  # what an unset environment runs: int8 activations
    why = peer_mod._settings_mismatch(asked, ran)
    assert why and "act_int8 True (asked False)" in why
    assert peer_mod._settings_mismatch(asked, {**ran, "act_int8": False}) is None
    assert "no kernel settings" in peer_mod._settings_mismatch(asked, None)
