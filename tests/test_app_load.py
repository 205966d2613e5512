"""Load test page (AppTest): a real short load test against our engine (0.5B int4) started once for the module,
reached as a URL; progress and Cancel; results, $/1M at the SLO, the crossover; the Cost page beside it."""
import os

import pytest
from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, problems, wait_job  # noqa: F401
from tests.test_load_view import curve, point

PAGE = str(ROOT / "pages/load.py")
REAL_CACHE = os.environ.get("SCL_CACHE_DIR")  # the converted 0.5B: the client's tokenizer comes from there


@pytest.fixture(scope="module")
def server():
    from engine.peers import servers
    from engine.peers.servers import ServerSpec

    spec = ServerSpec.of("serving-cost-lab", model="default-draft", precision="int4", slots=2, max_model_len=1024)
    reason = servers.unavailable_reason(spec)
    if reason:
        pytest.skip(reason)
    rs = servers.start(spec)
    yield rs
    rs.stop()


@pytest.fixture(autouse=True)
def real_models(app_env, monkeypatch):
    if REAL_CACHE:
        monkeypatch.setenv("SCL_CACHE_DIR", REAL_CACHE)
    else:
        monkeypatch.delenv("SCL_CACHE_DIR", raising=False)
    import streamlit as st

    st.cache_data.clear()  # the page caches which servers can run


def blocker(lab_backend) -> str:
    """Another tab's job, running on the backend (the caller holds its pool): what a load test queues behind."""
    from engine.backend.client import Backend
    from engine.common.setup import EngineSetup

    cfg = {"setup": EngineSetup(model="tiny").to_dict(), "max_new_tokens": 2, "reps": 1, "warmup": False}
    return Backend(lab_backend.url, timeout_s=30).submit("another tab's run", {"items": [{"kind": "run", **cfg}]},
                                                         client="another tab")


def page(url: str = "", loads: str = "1,2") -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.multiselect(key="load-precisions").set_value([])  # nothing of ours started: the module's server is a URL
    at.text_area(key="load-urls").set_value(url)
    at.text_input(key="load-workload").set_value("chat:3")
    at.number_input(key="load-requests").set_value(3)
    at.number_input(key="load-max-out").set_value(8)
    at.number_input(key="load-ttft").set_value(60.0)
    at.number_input(key="load-itl").set_value(5.0)
    at.text_input(key="load-concurrency").set_value(loads)
    return at.run()


def test_a_load_test_runs_in_the_background_and_draws_every_chart(server, lab_backend):
    from pages import _ui

    at = page(server.url)
    assert not problems(at)
    with lab_backend.pool.lock:  # another tab's run holds the backend: this job queues, its progress and Cancel shown
        blocker(lab_backend)
        at.button(key="load-run").click().run()
        assert not problems(at)
        job = at.session_state["load-job"]
        assert at.button(key="load-run").disabled and any(b.label == "Cancel" for b in at.button)
        assert job.total == 2 and job.state == "queued"
    job = wait_job(at, "load-job")
    assert not problems(at), job.message
    assert any("load test: 2 of 2 runs finished" in s.value for s in at.success)
    ids = at.session_state["comparison"]
    assert ids == job.run_ids and len(ids) == 2  # the current comparison: saved as a report like any other
    recs = [_ui.get_store().get_run(i) for i in ids]
    assert all(r.kind == "load" and r.metrics["load"]["completed"] == 3 for r in recs)
    assert [r.config["profile"]["label"] for r in recs] == ["concurrent:1", "concurrent:2"]
    assert all(r.metrics["load"]["lengths_forced"] == "forced" for r in recs)
    table = frame(at, "system", "profile", "out_tok_s")
    assert list(table["profile"]) == ["concurrent:1", "concurrent:2"] and (table["out_tok_s"] > 0).all()
    costs = frame(at, "configuration", "usd_per_1m_out_at_slo")
    assert len(costs) == 1 and costs["usd_per_1m_out_at_slo"].iloc[0] > 0  # a loose SLO: every point meets it
    assert costs["at"].iloc[0] == "concurrent:2 (concurrency 2)"
    assert len(at.get("plotly_chart")) == 4  # latency against load, tokens/s per user, goodput, $/1M at the SLO (no
    # pair: no crossover)
    assert any("No pair to compare" in c.value for c in at.caption)


def test_cancel_stops_before_the_next_point(server, lab_backend):
    from pages import _ui

    at = page(server.url, loads="1,1,1")
    with lab_backend.pool.lock:
        blocker(lab_backend)
        at.button(key="load-run").click().run()
        at.button(key="load-job-cancel").click().run()
    job = wait_job(at, "load-job")
    assert job.cancelled and job.state == "cancelled"
    assert not at.exception
    assert any("Cancelled: 0 of 3 runs finished" in w.value for w in at.warning)
    assert not _ui.get_store().list_runs(kind="load")


def test_missing_peers_are_listed_with_the_fix_and_bad_input_is_an_error_box(monkeypatch):
    from engine.peers import servers

    monkeypatch.setattr(servers, "vllm_python", lambda: None)
    at = page("not a url")
    assert not at.exception
    assert any("make peers-vllm" in c.value.replace("\\", "") for c in at.caption)  # markdown-escaped
    assert not any("vLLM" in c.label for c in at.checkbox)  # offered only when installed
    at.button(key="load-run").click().run()
    assert any("not an http(s) URL" in e.value for e in at.error)
    at.text_area(key="load-urls").set_value("").run()
    at.button(key="load-run").click().run()
    assert any("Nothing to measure" in e.value for e in at.error)
    at.text_area(key="load-urls").set_value("http://127.0.0.1:9").run()
    at.text_input(key="load-concurrency").set_value("1,x").run()
    at.button(key="load-run").click().run()
    assert any("'x' in the loads" in e.value for e in at.error)


def _stored(recs):
    from pages import _ui

    for r in recs:
        _ui.get_store().save_run(r)
    return [r.run_id for r in recs]


def test_crossover_and_the_cost_page_from_stored_load_runs():
    recs = (curve("ours int4", {1: 10, 4: 30, 8: 50}) + curve("ours int4 + ngram", {1: 15, 4: 36, 8: 40},
                                                             draft="ngram")
            + [point("hopeless", 1, met=[], missed=[100])])
    from engine.load.metrics import spec_by_category

    def answer(category, drafted, accepted):  # an answer's own stats, as vLLM's per-request summary has them
        return {"ok": True, "category": category, "spec": {"num_spec_steps": drafted // 4, "num_draft_tokens": drafted,
                                                           "num_accepted_draft_tokens": accepted, "policy": "adaptive"}}
    for r in recs[3:6]:  # the n-gram curve: code accepts more than chat
        r.metrics["load"]["spec_by_category"] = spec_by_category(
            [answer("code", 40, 30), answer("code", 40, 26), answer("chat", 40, 8)])
    ids = _stored(recs)
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["load-runs"] = ids
    at.run()
    assert not problems(at)
    assert len(at.get("plotly_chart")) == 5  # latency panels, tokens/s per user, goodput, cost, crossover
    verdicts = " ".join(m.value for m in at.markdown)
    assert "stops paying at 8" in verdicts
    costs = frame(at, "configuration", "usd_per_1m_out_at_slo")
    assert "infeasible at this SLO on this machine" in set(costs["at"])
    # the answer first (issue 40.5): the cheapest at the SLO, from the cost table's own figure
    cheapest = costs.dropna(subset=["usd_per_1m_out_at_slo"]).sort_values("usd_per_1m_out_at_slo").iloc[0]
    assert at.metric[0].label == "$ per 1M output at the SLO"
    assert at.metric[0].value == f"${cheapest['usd_per_1m_out_at_slo']:.4g}"
    assert any(m.value.startswith("**Recommended: ") and cheapest["configuration"].split(" ·")[0] in m.value
               for m in at.markdown)
    assert at.metric[-1].value == "pays until 8"
    acc = frame(at, "system", "load", "category", "acceptance", "acceptance length")
    assert len(acc) == 9 and set(acc["system"]) == {"ours int4 + ngram"}  # 3 loads x (code, chat, all)
    row = acc[(acc["load"] == "concurrent:4") & (acc["category"] == "code")].iloc[0]
    assert row["acceptance"] == pytest.approx(56 / 80) and row["acceptance length"] == pytest.approx(1 + 56 / 20)
    assert acc[acc["category"] == "all"]["acceptance"].iloc[0] == pytest.approx(64 / 120)
    # Cost & capacity: $/1M at the SLO beside the single-stream figure, from the same records
    cost = AppTest.from_file(str(ROOT / "pages/cost.py"), default_timeout=TIMEOUT)
    cost.session_state["comparison"] = ids
    cost.run()
    assert not problems(cost)
    slo = frame(cost, "configuration", "usd_per_1m_out_at_slo", "usd_per_1m_out_single_stream")
    assert len(slo) == 3 and slo["usd_per_1m_out_single_stream"].notna().all()
    assert any("at the SLO" in m.value for m in cost.markdown)


def test_engine_configurations_leave_out_a_draft_that_is_its_target():
    from engine.peers.load_sweep import engine_specs

    specs, notes = engine_specs("default-draft", ["int4", "int8"], ["none", "ngram", "model"])
    assert [(s.setup.precision, s.setup.draft) for s in specs] == [("int4", "none"), ("int4", "ngram"),
                                                                   ("int8", "none"), ("int8", "ngram")]
    assert len(notes) == 2 and "the draft is the target itself" in notes[0]
    specs, notes = engine_specs("default", ["int4"], ["model"])
    assert specs[0].setup.draft_model == "default-draft" and not notes


def test_kv_cache_quantized_or_not_priced_on_the_load_and_cost_pages():
    from tests.test_load_view import with_kv

    q = with_kv(curve("ours int4", {1: 10, 4: 30, 8: 50}), "int8", "int8", 160)
    b = with_kv(curve("ours int4", {1: 10, 4: 28}) + [point("ours int4", 8, met=(100,), missed=(300,))],
                "auto", "fp32", 40)
    ids = _stored(q + b)
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["load-runs"] = ids
    at.run()
    assert not problems(at)
    kv = frame(at, "KV quantized", "KV not", "sequences (quantized)", "not / quantized")
    assert list(kv["KV quantized"]) == ["int8"] and list(kv["KV not"]) == ["fp32"]
    assert list(kv["sequences (quantized)"]) == [10]
    assert kv["not / quantized"].iloc[0] == pytest.approx(50 / 28, rel=1e-3)
    verdict = next(m.value.replace("\\", "") for m in at.markdown if "does not lead" in m.value)  # markdown-escaped
    assert "KV int8 paged 0.25 does not lead ours int4 · qwen2.5-coder-0.5b · KV auto paged 0.25 on output tok/s" \
        in verdict and "it leads at 4, 8" in verdict
    cost = AppTest.from_file(str(ROOT / "pages/cost.py"), default_timeout=TIMEOUT)
    cost.session_state["comparison"] = ids
    cost.run()
    assert not problems(cost)
    assert list(frame(cost, "KV quantized", "$/1M out at the SLO (quantized)")["KV quantized"]) == ["int8"]


def test_engine_configurations_at_each_kv_precision_share_one_budget():
    from engine.peers.load_sweep import engine_specs

    specs, _ = engine_specs("default-draft", ["int4"], ["none"], kv_dtypes=["auto", "int8"], kv_cache_gib=0.25)
    assert [(s.kv_dtype, s.kv_cache_gib) for s in specs] == [("auto", 0.25), ("int8", 0.25)]
    assert specs[1].label.endswith("(8 seqs, KV int8 in 0.25 GiB)")
