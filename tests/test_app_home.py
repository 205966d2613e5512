"""Home page and navigation (app.py), driven with Streamlit's AppTest on the tiny test models."""

from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, problems, wait_job  # noqa: F401

def test_app_navigation_renders_home(lab_backend):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    assert not problems(at)
    assert at.title[0].value == "Serving Cost Lab"
    subheaders = [s.value for s in at.subheader]
    assert "The backend's machine" in subheaders and "Models" in subheaders and "Default comparison" in subheaders
    hw = at.table[0].value
    facts = dict(zip(hw.index, hw["value"]))
    assert facts["SIMD level"] and facts["measured read bandwidth"].endswith("GB/s")
    assert "GPU" in facts
    # which backend the page drives, and that machine's facts as its /v1/info reported them
    assert facts["backend"].startswith(lab_backend.url) and facts["measures on"] == "cpu"
    assert at.text_input(key="home-backend").value == lab_backend.url
    assert any(lab_backend.url in c.value.replace("\\", "") for c in at.caption)
    models = frame(at, "name", "hf_name")
    assert {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(models["name"])
    assert at.button(key="home-run").label == "Run default comparison"


def test_every_page_is_reachable_from_navigation():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    for page, title in [("pages/precision.py", "Precision"), ("pages/playground.py", "Speculative playground"),
                        ("pages/compare.py", "Compare (sweep)"), ("pages/reports.py", "Reports"),
                        ("pages/cost.py", "Cost & capacity")]:
        at.switch_page(page).run()
        assert not problems(at), page
        assert at.title[0].value == title


def test_default_comparison_runs_and_shows_results(lab_backend):
    at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
    assert len(at.radio(key="home-pair").options) == 3  # default, small, and (test hook) tiny
    # the small pair's self-draft is cheaper than its target: int8 drafted by its own int4 weights
    at.radio(key="home-pair").set_value("small").run()
    assert any("default-draft@int8 + self@int4 g=4" in c.value.replace("\\", "") for c in at.caption)
    at.radio(key="home-pair").set_value("tiny")
    at.number_input(key="home-tokens").set_value(8)
    at.run()
    with lab_backend.pool.lock:  # the backend's run waits for the pool: its progress and Cancel are on the page
        at.button(key="home-run").click().run()
        assert not problems(at)
        job = at.session_state["home-job"]
        assert at.button(key="home-run").disabled
        assert any(b.label == "Cancel" for b in at.button)
        assert len(at.get("progress")) == 1
        assert job.total == 4 and not job.finished
    job = wait_job(at, "home-job")
    assert not problems(at)
    assert any("4 of 4 runs finished" in s.value for s in at.success)
    ids = at.session_state["comparison"]
    assert len(ids) == 4 and ids == job.run_ids
    from pages import _ui

    # measured by the backend, stored there, and imported into the dashboard's own store
    assert {r.run_id for r in lab_backend.store.list_runs(limit=1000)} >= set(ids)
    assert {r.run_id for r in _ui.get_store().list_runs()} == set(ids)
    table = frame(at, "config", "tok_s")
    assert list(table["precision"][:3]) == ["fp32", "int8", "int4-g64"]
    # the default workload, each prompt 3 times; the tiny model's 256-token context skips the long prompts
    assert at.text_input(key="home-workload").value == "chat:2,code:2"
    assert set(table["workload"]) == {"chat:2,code:2 ×3 (3 skipped)"}
    assert table["tok_s_pm"].notna().all() and table["noise"].notna().all()  # ± and the noise flag beside it
    cols = list(table.columns)
    assert cols.index("tok_s_pm") == cols.index("tok_s") + 1 and cols.index("noise") == cols.index("tok_s") + 2
    assert table["draft"].iloc[3] == "model"
    assert table["speedup"].notna().iloc[3]  # the spec run was timed against the same target
    assert table["quality_loss_kl"].notna().all()  # quality was measured (default on)
    charts = at.get("plotly_chart")
    assert len(charts) >= 8  # the metric charts plus the Pareto view
    text = " ".join(m.value for m in at.markdown)
    assert "Cheapest per output token" in text and "frontier" in text


def test_bad_model_pair_is_an_error_box_not_a_traceback(lab_backend, monkeypatch):
    at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
    at.radio(key="home-pair").set_value("tiny")
    at.number_input(key="home-tokens").set_value(8)
    # an engine failure inside the backend's job (here: its pool cannot load the model) is shown as one error line
    from engine.common.errors import UserError

    def boom(*a, **k):
        raise UserError("model 'tiny' is broken", "pick another model")

    monkeypatch.setattr(lab_backend.pool, "get", boom)
    at.button(key="home-run").click().run()
    job = wait_job(at, "home-job")
    assert job.state == "failed"
    assert not at.exception
    assert any("model 'tiny' is broken. Fix: pick another model" in e.value for e in at.error)


def test_bad_workload_is_refused_before_a_job_starts():
    at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
    at.radio(key="home-pair").set_value("tiny")
    at.text_input(key="home-workload").set_value("poetry:1")
    at.button(key="home-run").click().run()
    assert not at.exception
    assert any("unknown workload 'poetry'" in e.value and "Fix: use one of: chat, code" in e.value for e in at.error)
    assert "home-job" not in at.session_state


def test_no_backend_is_a_banner_with_the_fix(monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("SCL_BACKEND_URL", f"http://127.0.0.1:{port}")
    at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
    assert not at.exception
    assert any(f"no backend answers at http://127.0.0.1:{port}" in e.value and "python -m engine backend" in e.value
               and "make run" in e.value for e in at.error)
    assert at.button(key="home-run").disabled


def test_a_remote_backend_on_another_port_with_its_token(tmp_path, monkeypatch):
    """A second backend standing in for another machine: it needs a token; a wrong one is a 401 banner, nothing
    runs; the right one (from SCL_BACKEND_TOKEN_FILE) drives it, and the Backend field switches between them."""
    from tests.app_helpers import backend_in_thread

    token = "t" * 32
    with backend_in_thread(tmp_path / "remote.sqlite", token=token) as remote:
        monkeypatch.setenv("SCL_BACKEND_URL", remote.url)
        monkeypatch.setenv("SCL_BACKEND_TOKEN", "wrong-token-wrong-token")
        at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
        assert not at.exception
        assert any("refused" in e.value and "401" in e.value and "SCL_BACKEND_TOKEN_FILE" in e.value for e in at.error)
        assert not remote.queue.jobs  # nothing ran
        monkeypatch.delenv("SCL_BACKEND_TOKEN")
        (tmp_path / "token").write_text(token)
        monkeypatch.setenv("SCL_BACKEND_TOKEN_FILE", str(tmp_path / "token"))
        at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
        assert not problems(at)
        hw = at.table[0].value
        assert dict(zip(hw.index, hw["value"]))["backend"].startswith(remote.url)


def test_a_backend_killed_mid_run_fails_the_job_and_keeps_the_finished_runs(tmp_path, monkeypatch):
    import signal
    import time

    from tests.test_browser_e2e import running_backend

    with running_backend(tmp_path, {"SCL_CACHE_DIR": str(tmp_path / "cache")}, tiny=True) as backend:
        monkeypatch.setenv("SCL_BACKEND_URL", backend["url"])
        at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
        at.radio(key="home-pair").set_value("tiny")
        at.number_input(key="home-tokens").set_value(8)
        at.checkbox(key="home-quality").set_value(False)
        at.button(key="home-run").click().run()
        job = at.session_state["home-job"]
        deadline = time.time() + TIMEOUT
        while not job.run_ids and time.time() < deadline:  # the page's polls, until the first run has landed
            time.sleep(0.5)
            at.run()
        assert job.run_ids and not job.finished
        backend["proc"].send_signal(signal.SIGKILL)  # the backend dies mid-run
        backend["proc"].wait(10)
        for _ in range(4):  # a few polls without an answer
            at.run()
    assert job.state == "failed"
    assert not at.exception
    errs = [e.value for e in at.error]
    assert any("stopped answering mid-run" in e and "the run in progress failed" in e and "kept" in e
               and "python -m engine backend" in e for e in errs), errs
    from pages import _ui

    kept = [r.run_id for r in _ui.get_store().list_runs()]
    assert kept and set(kept) == set(job.run_ids)  # the finished runs stay, imported before the backend died
    assert at.session_state["comparison"] == job.run_ids
