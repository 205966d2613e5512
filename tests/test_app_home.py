"""Home page and navigation (app.py), driven with Streamlit's AppTest on the tiny test models."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, problems  # noqa: F401

def test_app_navigation_renders_home():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    assert not problems(at)
    assert at.title[0].value == "Serving Cost Lab"
    subheaders = [s.value for s in at.subheader]
    assert "This machine" in subheaders and "Models" in subheaders and "Default comparison" in subheaders
    hw = at.table[0].value
    facts = dict(zip(hw.index, hw["value"]))
    assert facts["SIMD level"] and facts["measured read bandwidth"].endswith("GB/s")
    assert "GPU" in facts
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


def test_default_comparison_runs_and_shows_results():
    at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
    assert len(at.radio(key="home-pair").options) == 3  # default, small, and (test hook) tiny
    at.radio(key="home-pair").set_value("tiny")
    at.number_input(key="home-tokens").set_value(8)
    from pages import _ui

    with _ui.get_pool().lock:  # hold the pool: the job waits, so its progress and Cancel are on the page
        at.button(key="home-run").click().run()
        assert not problems(at)
        job = at.session_state["home-job"]
        assert at.button(key="home-run").disabled
        assert any(b.label == "Cancel" for b in at.button)
        assert "waiting for another run" in job.message or job.message == "starting"
    assert job.total == 4
    assert job.wait(TIMEOUT)
    at.run()
    assert not problems(at)
    assert any("4 of 4 runs finished" in s.value for s in at.success)
    ids = at.session_state["comparison"]
    assert len(ids) == 4 and ids == job.run_ids
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


def test_bad_model_pair_is_an_error_box_not_a_traceback(monkeypatch):
    at = AppTest.from_file(str(ROOT / "pages/home.py"), default_timeout=TIMEOUT).run()
    at.radio(key="home-pair").set_value("tiny")
    at.number_input(key="home-tokens").set_value(8)
    # an engine failure inside the job (here: the pool cannot load the model) is shown as one error line
    from pages import _ui

    def boom(*a, **k):
        from engine.common.errors import UserError

        raise UserError("model 'tiny' is broken", "pick another model")

    monkeypatch.setattr(_ui.get_pool(), "get", boom)
    at.button(key="home-run").click().run()
    assert at.session_state["home-job"].wait(TIMEOUT)
    at.run()
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
