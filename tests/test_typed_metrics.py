"""The record's metrics are typed by common/fields.py: written through one checked writer, stored only when
every key is declared, named in code through the declaration, and older schemas read with today's names."""
import copy
import json
import pickle
from pathlib import Path

import pytest

from engine.common.errors import UserError
from engine.common import fields as F
from engine.common.fields import M, Metrics, UndeclaredField
from engine.measure.records import KL_RENAMES, SCHEMA_VERSION, RunRecord, validate
from engine.measure.store import Store
from engine.measure.summary import aggregate

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _sample(rep, pid, tok_s, drafted=4, accepted=2):
    return {"rep": rep, "category": "code", "prompt_id": pid, "prompt_tokens": 10, "new_tokens": 8, "ttft_s": 0.1,
            "decode_s": 0.5, "decode_tok_s": tok_s, "token_latency_ms": 1000 / tok_s, "drafted": drafted,
            "accepted": accepted, "rounds": 2, "emitted": 4}


def _gen(tok_s):
    return {"decode_tok_s": tok_s, "ttft_s": 0.1, "weight_bytes": 100, "kv_bytes": 10,
            "spec": {"draft_kind": "ngram", "gamma": 3, "adaptive": False, "rounds": 2, "drafted": 4, "accepted": 2,
                     "emitted": 4, "position_drafted": [2, 2], "position_accepted": [1, 1], "gamma_history": [2, 2]}}


def _record(metrics, **kw):
    return RunRecord(kind="bench", config={"model": "m", "precision": "int4"}, metrics=metrics, machine={}, **kw)


# ---------------------------------------------------------------- written through one writer

@pytest.mark.parametrize("write,field", [
    (lambda m: m.__setitem__("decode_toks", 1.0), "metrics.decode_toks"),
    (lambda m: m.update(tokens_s=1.0), "metrics.tokens_s"),
    (lambda m: m.setdefault("bogus", {}), "metrics.bogus"),
    (lambda m: m.__setitem__("spec", {"acceptance": 0.5}), "metrics.spec.acceptance"),
    (lambda m: m["quality"].__setitem__("kl_mean", 0.1), "metrics.quality.kl_mean"),  # the old name is refused
    (lambda m: m["samples"][0].__setitem__("tok_s", 1.0), "metrics.samples[].tok_s"),
    (lambda m: m["by_category"]["code"]["spec"].update(rate=0.5), "metrics.by_category.<category>.spec.rate"),
    (lambda m: m["intervals"].__setitem__("spec.rate", {"lo": 0, "hi": 1}), "metrics.intervals.spec.rate"),
])
def test_an_undeclared_metric_fails_when_written_naming_the_field(write, field):
    m = Metrics({M.decode_tok_s: 10.0, M.quality: {F.Q.kld_mean: 0.01}, M.samples: [_sample(0, "a", 10.0)],
                 M.by_category: {"code": {F.CAT.samples: 1, M.spec: {F.S.accepted: 1}}}, M.intervals: {}})
    with pytest.raises(UndeclaredField) as e:
        write(m)
    assert e.value.field == field and isinstance(e.value, UserError)
    assert f"'{field}' is not a declared record field" in str(e.value) and "fields.py" in str(e.value)


def test_summary_returns_the_checked_writer_so_callers_writes_are_checked():
    samples = [_sample(r, p, 10.0 + r) for r in range(2) for p in ("a", "b")]  # 4 samples, 2 of 4 accepted each
    m = aggregate([_gen(10.0), _gen(12.0)], samples)
    assert isinstance(m, Metrics) and isinstance(m[M.spec], F.METRICS_LEVEL.parts["spec"][1].cls)
    assert m[M.decode_tok_s] == 11.0 and m[M.spec][F.S.accepted] == 8 and m[M.spec][F.S.acceptance_rate] == 0.5
    m[M.noise] = {F.N.noisy: False, F.N.reasons: []}  # declared: written as runs.py writes it
    with pytest.raises(UndeclaredField, match="metrics.noise.verdict"):
        m[M.noise] = {"verdict": "quiet"}
    with pytest.raises(UndeclaredField, match="metrics.by_category.<category>.intervals.spec.nope"):
        m[M.by_category]["code"][M.intervals]["spec.nope"] = None


def test_checked_metrics_survive_pickle_deepcopy_and_json():
    m = aggregate([_gen(10.0)], [_sample(0, "a", 10.0)])
    for back in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert back == m and type(back) is Metrics and type(back[M.spec]) is type(m[M.spec])
    assert json.loads(_record(m).to_json())["metrics"] == json.loads(json.dumps(m))


def test_code_names_fields_through_the_declaration():
    assert M.decode_tok_s == "decode_tok_s" and F.SPEC_AT.speedup == "spec.speedup"
    assert F.QUALITY_AT.kld_mean == "quality.kld_mean" and F.lookup(F.QUALITY_AT.kld_mean).unit == "nats/token"
    with pytest.raises(AttributeError, match="'decode_toks' is not a declared record field"):
        M.decode_toks  # noqa: B018
    with pytest.raises(AttributeError, match="'spec.rate' is not a declared"):
        F.SPEC_AT.rate  # noqa: B018
    for names, flds in ((M, F.METRICS), (F.S, F.SPEC), (F.Q, F.QUALITY), (F.L, F.LOAD), (F.N, F.NOISE),
                        (F.W, F.WORKLOAD), (F.SMP, F.SAMPLE)):
        assert all(getattr(names, f.name) == f.name for f in flds)


# ---------------------------------------------------------------- the store validates before it writes

def test_store_refuses_an_undeclared_or_bad_field_and_writes_nothing(tmp_path):
    store = Store(tmp_path / "lab.sqlite")
    bad = _record({"decode_tok_s": 10.0, "spec": {"accepted": 1, "acceptance": 0.5}})  # a plain dict, not Metrics
    with pytest.raises(UserError, match=r"'metrics\.spec\.acceptance' is not a declared record field"):
        store.save_run(bad)
    with pytest.raises(UserError, match="run record field metrics.decode_tok_s should be a number or null"):
        store.save_run(_record({"decode_tok_s": "fast"}))
    with pytest.raises(UserError, match="kind 'evil'"):
        store.save_run(RunRecord(kind="evil", config={}, metrics={}, machine={}))
    assert store.list_runs() == []
    good = _record(Metrics({M.decode_tok_s: 10.0}))
    store.save_run(good)
    assert [r.run_id for r in store.list_runs()] == [good.run_id]


def test_stored_peer_records_pass_the_strict_check():
    """The peers' records the lab measured and kept in docs/ (transformers, llama.cpp, ours) are all declared."""
    body = json.loads((DOCS / "peers" / "peers.json").read_text())
    assert len(body["records"]) > 10
    for d in body["records"]:
        assert validate(d, strict=True)["kind"] == "peer"


# ---------------------------------------------------------------- older schemas keep opening

V2_QUALITY = {"tokens": 512, "kl_mean": 0.012, "kl_mean_err": 0.001, "kld_median": 0.004, "kld_p90": 0.02,
              "kld_p95": 0.03, "kl_p99": 0.09, "kld_p999": 0.3, "kl_max": 0.8, "top1_agreement": 0.93,
              "by_category": {"code": {"tokens": 256, "kl_mean": 0.02, "kl_max": 0.7, "documents": 3}}}


def _old(version, batch=1):
    return RunRecord(kind="bench", config={"model": "m", "precision": "int4", "batch_size": batch},
                     metrics={"decode_tok_s": 90.0, "bw_efficiency": 1.6, "token_latency_ms_median": 5.0,
                              "quality": copy.deepcopy(V2_QUALITY),
                              "intervals": {"quality.kl_mean": {"lo": 0.01, "hi": 0.014, "over": "prompts", "n": 2}}},
                     machine={}, schema_version=version).to_dict()


@pytest.mark.parametrize("version", [1, 2])
def test_schema_1_and_2_records_open_with_the_kld_names(version, tmp_path):
    d = _old(version, batch=4)
    rec = RunRecord.from_dict(d)
    q = rec.metrics["quality"]
    assert rec.schema_version == SCHEMA_VERSION == 3
    assert (q["kld_mean"], q["kld_mean_err"], q["kld_p99"], q["kld_max"]) == (0.012, 0.001, 0.09, 0.8)
    assert q["kld_median"] == 0.004 and not set(KL_RENAMES) & set(q)
    assert q["by_category"]["code"] == {"tokens": 256, "kld_mean": 0.02, "kld_max": 0.7, "documents": 3}
    assert rec.metrics["intervals"] == {"quality.kld_mean": {"lo": 0.01, "hi": 0.014, "over": "prompts", "n": 2}}
    # version 1's batch defects are corrected on the way, version 2's numbers are as stored
    assert rec.metrics["bw_efficiency"] == pytest.approx(0.4 if version == 1 else 1.6)
    assert ("schema 1" in rec.notes) == (version == 1)
    assert d["metrics"]["quality"]["kl_mean"] == 0.012  # the stored dict is not rewritten
    # and once read it is a current record: the strict store takes it, the columns show its KLD
    store = Store(tmp_path / "lab.sqlite")
    store.save_run(rec)
    from engine.present.rows import row

    assert row(store.get_run(rec.run_id))["quality_loss_kl"] == 0.012


def test_a_schema_2_record_with_a_bad_kld_value_is_refused_under_its_new_name():
    d = _old(2)
    d["metrics"]["quality"]["kl_mean"] = "low"
    with pytest.raises(UserError, match="metrics.quality.kld_mean should be a number"):
        RunRecord.from_dict(d)
