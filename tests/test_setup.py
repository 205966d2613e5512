"""One setup from the command line to the record: RunConfig's wire form, the typed record config, the
record's kind, labels of old and new records, the planner reading a stored record's quantization,
the model pool's budget, and the default comparison."""
from __future__ import annotations

import pytest

from engine.common.errors import UserError
from engine.common.record_setup import setup_from_record
from engine.common.setup import EngineSetup
from engine.measure.pool import ModelPool
from engine.measure.record_config import RecordConfig
from engine.measure.records import RunRecord
from engine.measure.runs import RunConfig, execute
from engine.measure.store import Store
from engine.measure.grid import default_comparison, sweep_configs

# A bench record's config as schema 2 stored it (runs.py before the setup): setup fields flat in run_config.
SCHEMA2_CONFIG = {
    "model": "qwen2.5-coder-1.5b", "precision": "int4-g32",
    "quant": {"precision": "int4", "group_size": 32, "quantize_embeddings": True, "quantize_head": True},
    "device": "cpu", "batch_size": 2, "max_new_tokens": 48, "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                                                          "seed": 0},
    "chat": True, "workload": "chat:2", "reps": 3,
    "draft": {"kind": "model", "model": "qwen2.5-coder-0.5b", "precision": "int4-g32", "gamma": 3, "adaptive": False},
    "run_config": {"model": "default", "precision": "int4", "group_size": 32, "quantize_embeddings": True,
                   "quantize_head": True, "device": "auto", "draft": "model", "draft_model": "default-draft",
                   "draft_precision": "int4", "gamma": 3, "adaptive_gamma": False, "prompt": None,
                   "workload": "chat:2", "reps": 3, "batch_size": 2, "max_new_tokens": 48, "temperature": 0.0,
                   "top_k": 0, "top_p": 1.0, "seed": 0, "chat": True, "warmup": True, "baseline": True,
                   "quality": False, "quality_tokens": 256}}


def test_run_config_wire_form_round_trips_and_reads_the_old_flat_form():
    cfg = RunConfig.of(model="tiny", precision="int8", draft="self", draft_precision="int4", gamma=3, reps=2)
    d = cfg.to_dict()
    assert d["setup"]["precision"] == "int8" and d["reps"] == 2 and "precision" not in d
    assert RunConfig.from_dict(d) == cfg
    old = RunConfig.from_dict(SCHEMA2_CONFIG["run_config"])  # "measure again" of a schema-2 record
    assert old.setup == EngineSetup(precision="int4", group_size=32, quantize_embeddings=True, draft="model", gamma=3)
    assert (old.batch_size, old.workload, old.baseline) == (2, "chat:2", True)


@pytest.mark.parametrize("d, word", [
    ({"presicion": "int4"}, "presicion"),
    ({"setup": {"model": "tiny", "gama": 3}}, "gama"),
    ({"setup": {"model": "tiny"}, "precision": "int4"}, "both inside and beside"),
])
def test_unknown_or_doubled_run_config_keys_are_refused_by_name(d, word):
    with pytest.raises(UserError, match=word):
        RunConfig.from_dict(d)


def test_old_records_keep_their_setup_and_label():
    rec = RunRecord(kind="bench", config=SCHEMA2_CONFIG, metrics={}, machine={}, schema_version=2)
    assert rec.label == "qwen2.5-coder-1.5b@int4 g32 + default-draft@int4 g=3 b=2"
    rc = RecordConfig.from_record(rec)
    assert (rc.setup.group_size, rc.setup.quantize_embeddings, rc.batch_size) == (32, True, 2)
    v1 = {"model": "qwen2.5-coder-0.5b", "precision": "int4-g64", "device": "cpu", "batch_size": 1,
          "draft": {"kind": "self", "model": "qwen2.5-coder-0.5b", "precision": "int4-g64", "gamma": 4}}
    assert setup_from_record(v1).draft_precision == "int4"
    assert RunRecord(kind="generate", config=v1, metrics={}, machine={}, schema_version=1).label == \
        "qwen2.5-coder-0.5b@int4 + self@int4 g=4"


def test_a_playground_run_is_stored_with_its_kind_and_typed_config(pool, tmp_path):
    store = Store(tmp_path / "lab.sqlite")
    cfg = RunConfig.of(model="tiny", precision="int8", draft="self", draft_precision="int4", gamma=2, reps=1,
                       max_new_tokens=6, prompt="hello", device="cpu")
    rec = execute(cfg, pool, store, kind="playground")
    [back] = store.list_runs()
    assert back.run_id == rec.run_id and back.kind == "playground"
    assert back.label == cfg.label == "tiny@int8 + self@int4 g=2"
    rc = RecordConfig.from_record(back)
    assert rc.setup == cfg.setup.validate() and rc.max_new_tokens == 6 and rc.kernel_settings
    assert back.config["draft"] == cfg.setup.to_record()["draft"]
    assert RunConfig.from_record(back) == cfg  # measured again with the same settings
    with pytest.raises(UserError, match="kind 'peer'"):
        execute(cfg, pool, None, kind="peer")


def test_calibration_reads_group_size_and_embedding_quantization_from_a_stored_bench_record(pool, tmp_path):
    from engine.planner import hf_config
    from engine.planner import counts
    from engine.planner.calibration import record_bytes_per_token
    from engine.quant import make_spec

    store = Store(tmp_path / "lab.sqlite")
    execute(RunConfig.of(model="tiny", precision="int4", group_size=32, quantize_embeddings=True, reps=1,
                         max_new_tokens=4, prompt="hi", device="cpu"), pool, store)
    [rec] = store.list_runs()
    c = pool.peek("tiny", make_spec("int4", 32, True, True), "cpu").cfg
    tiny = hf_config.shape_from_hf_config({"hidden_size": c.hidden_size, "num_attention_heads": c.num_heads,
                                        "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
                                        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
                                        "vocab_size": c.vocab_size, "attention_bias": True}, name="tiny")
    d = rec.to_dict()
    for k in ("bytes_per_token", "weight_bytes", "kv_bytes"):  # what a record without measured bytes lacks
        d["metrics"].pop(k, None)
    got = record_bytes_per_token(d, {"tiny": tiny})
    assert got == counts.decode_read_bytes(tiny, "int4", 1, True, True, 32, base_dtype="fp32")
    assert got != counts.decode_read_bytes(tiny, "int4", 1, False, True, 64, base_dtype="fp32")  # the old fallback


def test_the_pool_evicts_least_recently_used_past_its_byte_budget():
    from engine.quant import make_spec

    probe = ModelPool(keep=3)
    one = probe.get("tiny", make_spec("fp32"), "cpu").weight_bytes
    pool = ModelPool(keep=3, budget_bytes=int(one * 1.5))
    pool.get("tiny", make_spec("fp32"), "cpu")
    pool.get("tiny-draft", make_spec("fp32"), "cpu")  # two fp32 copies exceed 1.5: the first goes
    assert [(m["name"], m["precision"]) for m in pool.loaded()] == [("tiny-draft", "fp32")]
    assert pool.loaded()[0]["bytes"] == pool.bytes() <= pool.budget_bytes
    pool.get("tiny", make_spec("int8"), "cpu")  # smaller: fits beside it
    assert [m["name"] for m in pool.loaded()] == ["tiny-draft", "tiny"]
    with pytest.raises(UserError, match="budget"):
        ModelPool(budget_bytes=0)


def test_default_comparisons_and_sweeps_hold_only_setups_that_validate():
    for self_draft in (False, True):
        cfgs = [c.validate() for c in default_comparison(self_draft=self_draft)]
        spec = cfgs[-1].setup
        assert spec.speculative and cfgs[-1].baseline
    assert (spec.precision, spec.draft, spec.draft_precision) == ("int8", "self", "int4")  # int4 drafting int8
    left_out = []
    grid = sweep_configs(RunConfig(), ["int8", "int4"], ["self"], ["int4"], [4], left_out=left_out)
    assert [c.label for c in grid] == ["default@int8 + self@int4 g=4"]  # int4 drafting int4 saves nothing
    assert left_out == ["int4 + self@int4"]  # and the caller is told, never silently
    with pytest.raises(UserError, match="no cheaper"):
        sweep_configs(RunConfig(), ["int4"], ["self"], ["int4"], [4])


def test_peer_and_server_configs_hold_the_setup_and_read_their_wire_forms():
    from engine.peers.peer import PeerConfig, _record_config
    from engine.peers.servers import ServerSpec

    ours = PeerConfig.of(system="serving-cost-lab", precision="int8", draft="self", draft_precision="int4", gamma=3)
    assert PeerConfig.from_dict(ours.to_dict()) == ours and ours.setup.device == "cpu"
    assert ours.validate().label == "serving-cost-lab int8 + self@int4 g=3"
    assert _record_config(ours, None)["draft"] == {**ours.setup.to_record()["draft"], "setting": None}
    flat = {"system": "transformers", "model": "default", "precision": "bf16", "draft": "model", "reps": 2}
    hf = PeerConfig.from_dict(flat)  # the flat form older peer records keep
    assert (hf.setup.precision, hf.setup.draft, hf.reps) == ("bf16", "model", 2)
    assert _record_config(hf, None)["draft"]["precision"] == "bf16"  # the assistant runs at the target's precision
    with pytest.raises(UserError, match="'presicion'"):
        PeerConfig.from_dict({"presicion": "int4"})
    with pytest.raises(UserError, match="no cheaper|saves nothing"):
        PeerConfig.of(system="serving-cost-lab", precision="int4", draft="self", draft_precision="int4").validate()
    spec = ServerSpec.of("serving-cost-lab", precision="int8", draft="ngram", gamma=2, slots=4)
    assert ServerSpec.from_dict(spec.to_dict()) == spec and spec.label == "serving-cost-lab int8 + ngram g=2 (4 seqs)"
    assert ServerSpec("llama-server").setup.precision == "Q4_K_M"
    with pytest.raises(UserError, match="'precision'"):  # the setup's fields live in its setup
        ServerSpec.from_dict({"system": "vllm", "precision": "bf16"})
