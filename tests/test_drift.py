"""Drift canaries (issue 40, item 3): a run beyond the interval of the earlier run of its setup on its machine is
flagged, naming what changed; runs of another setup or machine are not compared.

The earlier run is real (the tiny model, three repetitions, so decode tok/s has an interval); the later ones are
copies of it with the figure and the facts a later run would carry, so the test knows which must be flagged."""
from __future__ import annotations

import copy

import pytest

from engine.measure.records import RunRecord
from engine.present.drift import changes, drifts, interval


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    from engine.measure.runs import RunConfig, execute
    from engine.measure.store import Store
    from tests.app_helpers import local_pool

    store = Store(tmp_path_factory.mktemp("drift") / "lab.sqlite")
    rec = execute(RunConfig.of(model="tiny", precision="int8", max_new_tokens=6, reps=3), local_pool(), store)
    assert rec.versions.get("lab"), "records carry the lab's commit"
    return rec


def later(rec: RunRecord, tok_s: float, **changed) -> RunRecord:
    d = copy.deepcopy(rec.to_dict())
    d["run_id"], d["created_at"] = "later" + str(tok_s).replace(".", ""), "2999-01-01T00:00:00+00:00"
    d["metrics"]["decode_tok_s"] = tok_s
    for where, (k, v) in changed.items():
        d[where][k] = v
    return RunRecord(**d)


def test_a_run_beyond_the_earlier_interval_is_flagged_naming_the_commit(earlier):
    lo, hi = interval(earlier, "decode_tok_s")
    assert lo <= earlier.metrics["decode_tok_s"] <= hi
    slow = later(earlier, lo * 0.7, versions=("lab", "0123456789ab"))
    inside = later(earlier, (lo + hi) / 2, versions=("lab", "0123456789ab"))
    flags = drifts([slow, inside, earlier], [earlier, slow, inside])
    assert [(f.run_id, f.metric) for f in flags] == [(slow.run_id, "decode tok/s")]
    words = flags[0].words
    assert f"the lab commit {earlier.versions['lab']} -> 0123456789ab" in words and earlier.run_id in words
    assert f"{100 * (lo * 0.7 / earlier.metrics['decode_tok_s'] - 1):+.1f}%" in words


def test_another_machine_or_setup_is_not_compared(earlier):
    other_cpu = later(earlier, 1e-3, machine=("cpu_model", "Some Other CPU"))
    other_batch = later(earlier, 1e-3, config=("batch_size", 4))
    assert drifts([other_cpu, other_batch], [earlier, other_cpu, other_batch]) == []


def test_a_change_of_method_or_threads_is_named(earlier):
    d = copy.deepcopy(earlier.to_dict())
    d["config"]["setup"]["method"] = "gptq"   # what a GPTQ run of the same int4 setup would differ by
    t = earlier.machine["torch_threads"]
    d["machine"]["torch_threads"] = t + 1
    assert changes(earlier, RunRecord(**d)) == [f"machine torch_threads {t} -> {t + 1}", "precision method rtn -> gptq"]
    v2, v3 = copy.deepcopy(d), copy.deepcopy(d)  # the same GPTQ setup calibrated by two versions of the algorithm
    v2["config"]["calibration"], v3["config"]["calibration"] = {"version": 2}, {"version": 3}
    v2["machine"]["torch_threads"] = t + 1
    assert changes(RunRecord(**v2), RunRecord(**v3)) == ["calibration gptq version 2 -> 3"]
    other = copy.deepcopy(v3)  # the same version and key calibrated under other float rounding: other codes
    v3["config"]["calibration"]["codes"], other["config"]["calibration"]["codes"] = "a1b2", "c3d4"
    assert changes(RunRecord(**v3), RunRecord(**other)) == ["calibration gptq codes a1b2 -> c3d4"]


def test_int8_weights_taking_int8_activations_is_named(earlier):
    """A record from before int8 weights took int8 activations (its kernels lack the key) against one after."""
    assert "int8" in earlier.kernels["int8_activations"]
    old = copy.deepcopy(earlier.to_dict())
    del old["kernels"]["int8_activations"]
    now = earlier.kernels["int8_activations"]
    assert changes(RunRecord(**old), earlier) == [f"int8 weights' activations fp32 -> {now}"]
    assert changes(earlier, earlier) == []
