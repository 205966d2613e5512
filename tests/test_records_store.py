"""The run record and the SQLite store."""
import json
import sqlite3

import pytest

from engine.common.errors import UserError
from engine.measure.records import SCHEMA_VERSION, RunRecord
from engine.measure.stats import percentile
from engine.measure.pool import ModelPool
from engine.measure.runs import RunConfig, execute


def _rec(**kw):
    d = dict(kind="bench", config={"model": "m", "precision": "int4"}, metrics={"decode_tok_s": 10.0},
             machine={"device": "cpu"})
    d.update(kw)
    return RunRecord(**d)


def test_json_round_trip():
    r = _rec()
    back = RunRecord.from_json(r.to_json())
    assert back == r and back.schema_version == SCHEMA_VERSION


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d.pop("metrics"), "lacks the field 'metrics'"),
    (lambda d: d.update(schema_version=99), "schema version 99"),
    (lambda d: d.update(kind="evil"), "kind 'evil'"),
    (lambda d: d.update(config="x"), "field config should be an object, got str"),
])
def test_invalid_records_refused(mutate, msg):
    d = _rec().to_dict()
    mutate(d)
    with pytest.raises(UserError, match=msg):
        RunRecord.from_dict(d)
    with pytest.raises(UserError, match="not valid JSON"):
        RunRecord.from_json("{nope")


def test_nan_metrics_never_written():
    r = _rec(metrics={"x": float("nan")})
    with pytest.raises(ValueError):
        r.to_json()


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0


def test_store_keeps_runs_and_reports(store):
    a, b = _rec(), _rec(config={"model": "m", "precision": "fp32"})
    store.save_run(a)
    store.save_run(b)
    assert {r.run_id for r in store.list_runs()} == {a.run_id, b.run_id}
    assert store.get_run(a.run_id) == a
    with pytest.raises(sqlite3.IntegrityError):
        store.save_run(a)  # a saved run is never overwritten
    rid = store.save_report("cmp", "notes <b>", {"runs": [a.run_id]})
    assert store.get_report(rid)["notes"] == "notes <b>"
    store.delete_report(rid)
    assert store.list_reports() == []
    with pytest.raises(UserError, match="needs a name"):
        store.save_report("  ", "", {})
    store.set_gpu_override("H100 SXM", {"price_usd_per_hr": 2.5})
    store.set_gpu_override("H100 SXM", {"price_usd_per_hr": 2.0})
    assert store.gpu_overrides() == [{"name": "H100 SXM", "price_usd_per_hr": 2.0}]


def test_execute_stores_a_complete_record(store, pool, small_int4):
    cfg = RunConfig.of(model="default-draft", precision="int4", draft="ngram", gamma=3, max_new_tokens=16,
                    baseline=True, device="cpu")
    rec = execute(cfg, pool, store)
    saved = store.get_run(rec.run_id)
    m = saved.metrics
    for k in ("ttft_s", "decode_tok_s", "token_latency_ms_median", "token_latency_ms_p90", "token_latency_ms_p99",
              "weight_bytes", "kv_bytes", "peak_rss_bytes", "bw_floor_ms", "bw_efficiency", "mem_bw_gbs"):
        assert m[k] is not None and m[k] > 0, k
    assert m["spec"]["baseline_tok_s"] > 0 and m["spec"]["speedup"] > 0
    assert saved.machine["simd"] and saved.versions["torch"] and saved.kernels
    assert saved.config["draft"]["kind"] == "ngram"
    json.loads(saved.to_json())


def test_bad_config_refused_before_loading():
    for kw, msg in [(dict(precision="int3"), "unknown precision"), (dict(draft="medusa"), "draft kind"),
                    (dict(draft="ngram", gamma=0), "gamma"), (dict(batch_size=0), "batch size")]:
        with pytest.raises(UserError, match=msg):
            execute(RunConfig.of(**kw), ModelPool(), None)
