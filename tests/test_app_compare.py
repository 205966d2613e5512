"""Compare page: a sweep with progress and cancel, picking stored runs, the table, charts and Pareto view."""

from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, local_pool, problems, wait_job  # noqa: F401

PAGE = str(ROOT / "pages/compare.py")


def setup_sweep(at, precisions=("fp32", "int8"), drafts=("none", "ngram"), gammas=(2,), tokens=8, quality=False,
                workload="chat:3", reps=2):
    at.selectbox(key="cmp-model").set_value("tiny")
    at.multiselect(key="cmp-precisions").set_value(list(precisions))
    at.multiselect(key="cmp-drafts").set_value(list(drafts))
    at.multiselect(key="cmp-gammas").set_value(list(gammas))
    at.number_input(key="cmp-tokens").set_value(tokens)
    at.checkbox(key="cmp-quality").set_value(quality)
    at.text_input(key="cmp-workload").set_value(workload)
    at.number_input(key="cmp-reps").set_value(reps)
    return at.run()


def run_grid(at, n: int):
    """Check the grid size, press Run, wait for the job, redraw; the page must show no error."""
    assert any(f"{n} run(s) in this grid" in c.value for c in at.caption)
    at.button(key="cmp-run").click().run()
    job = wait_job(at, "sweep-job")
    assert not problems(at)
    return job


def test_empty_page():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    assert any("Run a sweep, or pick stored runs" in i.value for i in at.info)
    assert any("No stored runs yet" in i.value for i in at.info)


def test_sweep_runs_the_grid_and_draws_everything():
    at = setup_sweep(AppTest.from_file(PAGE, default_timeout=TIMEOUT).run(), quality=True)
    run_grid(at, 4)
    assert any("4 of 4 runs finished" in s.value for s in at.success)
    t = frame(at, "config", "tok_s", "usd_per_1m_out")
    assert len(t) == 4 and set(t["draft"]) == {"none", "ngram"}
    assert t["quality_loss_kl"].notna().all()
    # the workload's prompts, twice each: medians with their interval, the noise flag, per category
    assert set(t["workload"]) == {"chat:3 ×2 (1 skipped)"}  # the tiny model's context skips the long one
    assert t["tok_s_pm"].notna().all() and t["usd_per_1m_out_pm"].notna().all() and t["noise"].notna().all()
    cats = frame(at, "config", "category", "accept_rate")
    assert set(cats["category"]) == {"chat"} and cats["accept_rate"].notna().sum() == 2
    assert any("whiskers: its 95% interval" in c.value for c in at.caption)
    charts = at.get("plotly_chart")
    assert len(charts) >= 8
    # the Pareto figure marks its frontier
    import json

    figs = [json.loads(c.proto.spec) for c in charts]
    pareto = [f for f in figs if "frontier" in json.dumps(f.get("layout", {}).get("title", ""))]
    assert pareto and any(tr.get("name") == "Pareto frontier" for tr in pareto[0]["data"])


def test_cancel_keeps_finished_runs(lab_backend):
    from pages import _ui

    at = setup_sweep(AppTest.from_file(PAGE, default_timeout=TIMEOUT).run(), precisions=("fp32", "int8", "int4"))
    lock = lab_backend.pool.lock
    lock.acquire()  # hold the backend's pool so the sweep waits; let exactly one run through, then cancel
    try:
        at.button(key="cmp-run").click().run()
        job = at.session_state["sweep-job"]
        assert not job.finished and any(b.label == "Cancel" for b in at.button)
        backend_job = lab_backend.queue.get(job.job_id)
        orig = backend_job.add_run

        def add_then_cancel(run_id):
            orig(run_id)
            lab_backend.queue.cancel(backend_job)  # what the Cancel button asks, right after the first run is stored

        backend_job.add_run = add_then_cancel
    finally:
        lock.release()
    job = wait_job(at, "sweep-job")
    assert not problems(at)
    assert job.state == "cancelled"
    assert any("Cancelled: 1 of 6 runs finished and are kept" in w.value for w in at.warning)
    assert len(at.session_state["comparison"]) == 1
    stored = [r.run_id for r in _ui.get_store().list_runs()]
    assert stored == job.run_ids


def test_cancel_button_cancels_on_the_backend(lab_backend):
    at = setup_sweep(AppTest.from_file(PAGE, default_timeout=TIMEOUT).run())
    with lab_backend.pool.lock:
        at.button(key="cmp-run").click().run()
        job = at.session_state["sweep-job"]
        assert at.button(key="cmp-run").disabled  # one sweep at a time per session
        assert len(at.get("progress")) == 1  # the progress bar with the time left
        at.button(key="sweep-job-cancel").click().run()
        assert job.cancelled and lab_backend.queue.get(job.job_id).cancelled
    job = wait_job(at, "sweep-job")
    # the run the worker had started (blocked on the pool above) finishes and is kept; none after it
    assert job.state == "cancelled" and job.done <= 1
    assert any(f"Cancelled: {job.done} of 4" in w.value for w in at.warning)


def test_two_tabs_are_queued_and_each_sees_its_own_runs(lab_backend):
    """Two sessions submit at once: the backend runs one job, then the other; each page imports only its own."""
    from pages import _ui

    tabs = [setup_sweep(AppTest.from_file(PAGE, default_timeout=TIMEOUT).run(), precisions=(p,), drafts=("none",),
                        workload="", reps=1) for p in ("fp32", "int8")]
    with lab_backend.pool.lock:
        for at in tabs:
            at.button(key="cmp-run").click().run()
        first, second = (at.session_state["sweep-job"] for at in tabs)
        tabs[1].run()  # the second tab's poll: queued behind the first
        assert second.state == "queued" and second.status["position"] == 1
        assert any("Queued on the backend" in p.proto.text for p in tabs[1].get("progress"))
    jobs = [wait_job(at, "sweep-job") for at in tabs]
    a, b = (lab_backend.queue.get(j.job_id) for j in jobs)
    assert a.finished_at <= b.started_at  # one after the other, never interleaved
    assert [len(j.run_ids) for j in jobs] == [1, 1] and jobs[0].run_ids != jobs[1].run_ids
    for at, job, precision in zip(tabs, jobs, ("fp32", "int8")):
        assert at.session_state["comparison"] == job.run_ids
        assert list(frame(at, "config", "precision")["precision"]) == [precision]
    # each session's client id is its own, and the backend files each job under it
    clients = [at.session_state["backend-client"] for at in tabs]
    assert clients[0] != clients[1] and [a.client, b.client] == clients
    assert {r.run_id for r in _ui.get_store().list_runs()} >= set(jobs[1].run_ids)


def test_invalid_grid_says_what_is_missing():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.multiselect(key="cmp-precisions").set_value([]).run()
    assert any("pick at least one target precision" in w.value for w in at.warning)
    assert at.button(key="cmp-run").disabled


def test_pick_stored_runs():
    from engine.measure.runs import RunConfig, execute
    from pages import _ui

    ids = [execute(RunConfig.of(model="tiny", precision=p, max_new_tokens=4), local_pool(), _ui.get_store()).run_id
           for p in ("fp32", "int8")]
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.multiselect(key="cmp-picked").set_value(ids).run()
    at.button(key="cmp-use").click().run()
    assert not problems(at)
    assert at.session_state["comparison"] == ids
    assert len(frame(at, "config", "tok_s")) == 2
    # price changes flow into $/1M output tokens
    before = frame(at, "config", "usd_per_1m_out")["usd_per_1m_out"].tolist()
    at.number_input(key="price-cmp").set_value(0.2).run()
    after = frame(at, "config", "usd_per_1m_out")["usd_per_1m_out"].tolist()
    assert all(abs(b * 2 - a) < 1e-3 * max(1, a) for a, b in zip(after, before))
    # the answer first (issue 40.5): the page opens with the current comparison's row, from the table's figures
    first = at.metric[0]
    cheapest = frame(at, "config", "usd_per_1m_out").sort_values("usd_per_1m_out").iloc[0]
    assert first.label == "$ per 1M output" and first.value == f"${cheapest['usd_per_1m_out']:.4g}"
    assert any(m.value.startswith(f"**Recommended: {cheapest['config']}**") for m in at.markdown)


def test_peer_rows_join_the_comparison(monkeypatch):
    """A real peer (transformers fp32 on the 0.5B) measured from the page lands in the peers' own table, whose
    caption says how peers are measured (another method than the lab's runs)."""
    from pages import _ui

    monkeypatch.delenv("SCL_CACHE_DIR")  # the real converted 0.5B, not the scratch cache of the tiny models
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.selectbox(key="cmp-model").set_value("default-draft").run()
    opts = at.multiselect(key="cmp-peers").options
    assert "transformers fp32" in opts
    at.multiselect(key="cmp-precisions").set_value([]).run()
    at.multiselect(key="cmp-peers").set_value(["transformers fp32"])
    at.number_input(key="cmp-tokens").set_value(4).run()
    run_grid(at, 1)
    t = frame(at, "config", "system", "tok_s")
    assert list(t["system"]) == ["transformers"] and t["tok_s"].iloc[0] > 0
    assert any(c.value == _ui.PEER_METHOD for c in at.caption)
    stored = _ui.get_store().list_runs()
    assert [r.kind for r in stored] == ["peer"] and stored[0].metrics["new_tokens"] == 4


def test_unavailable_peers_are_listed_with_the_reason(monkeypatch):
    from engine.peers import peer
    real = peer._has
    monkeypatch.setattr(peer, "_has", lambda m: False if m == "llama_cpp" else real(m))
    import streamlit as st

    st.cache_data.clear()  # the page caches the backend's /v1/info, which says which peers its machine has
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.selectbox(key="cmp-model").set_value("default").run()
    assert "llama.cpp Q4_K_M" not in at.multiselect(key="cmp-peers").options
    shown = [c.value.replace("\\", "") for c in at.caption]  # captions are markdown-escaped
    assert any("llama.cpp Q4_K_M" in c and "make peers" in c for c in shown)
    at.selectbox(key="cmp-model").set_value("tiny").run()
    assert at.multiselect(key="cmp-peers").options == []
    assert any("catalog model" in c.value.replace("\\", "") for c in at.caption)


def test_noisy_runs_are_offered_again_and_replaced():
    import copy
    import uuid

    from engine.measure.records import RunRecord
    from engine.measure.runs import RunConfig, execute
    from pages import _ui

    store = _ui.get_store()

    def stored(precision, noisy, reasons):  # a real run, its verdict set (this machine may be busy or quiet)
        d = copy.deepcopy(execute(RunConfig.of(model="tiny", precision=precision, max_new_tokens=4, reps=2),
                                  local_pool(), None).to_dict())
        d["run_id"] = uuid.uuid4().hex[:12]
        d["metrics"]["noise"].update(noisy=noisy, reasons=reasons, cpu_pressure_share=0.9 if noisy else 0.01,
                                     probe_drop=0.0, interval_half_width={})
        rec = RunRecord.from_dict(d)
        store.save_run(rec)
        return rec

    quiet = stored("fp32", False, [])
    noisy = stored("int8", True, ["CPU pressure: a task waited for a CPU 90% of the run (limit 25%)"])
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["comparison"] = [quiet.run_id, noisy.run_id]
    at.run()
    assert not problems(at)
    t = frame(at, "config", "noise")
    assert list(t["noise"]) == ["quiet", "⚠ noisy: CPU waits 90%"]
    assert any("1 of 2 runs were measured on a noisy machine" in w.value for w in at.warning)
    text = " ".join(m.value for m in at.markdown)
    assert "Measured under different noise flags" in text  # compare.highlights
    at.button(key="cmp-rerun").click().run()
    job = wait_job(at, "sweep-job")
    assert job.total == 1
    assert not problems(at)
    ids = at.session_state["comparison"]
    assert ids[0] == quiet.run_id and len(ids) == 2 and ids[1] not in (quiet.run_id, noisy.run_id)
    again = store.get_run(ids[1])
    assert again.config["run_config"] == noisy.config["run_config"]  # the same settings, measured again
    assert store.get_run(noisy.run_id)  # the noisy run stays stored
