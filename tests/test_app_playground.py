"""Speculative playground: streamed, origin-coloured tokens, acceptance charts, baseline speed, errors."""

from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, problems  # noqa: F401

PAGE = str(ROOT / "pages/playground.py")


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def generate(draft="model", draft_precision="int4", tokens=16, **extra):
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    at.selectbox(key="pg-model").set_value("tiny")
    at.selectbox(key="pg-precision").set_value("fp32")
    at.selectbox(key="pg-draft").set_value(draft)
    at.selectbox(key="pg-draft-model").set_value("tiny-draft")
    at.selectbox(key="pg-draft-precision").set_value(draft_precision)
    at.number_input(key="pg-tokens").set_value(tokens)
    for k, v in extra.items():
        at.get_by_key(k).set_value(v)
    at.button[0].click().run()  # the form's Generate button
    return at


def stream_html(at) -> str:
    return next(m.value for m in at.markdown if "scl-stream" in m.value)


def test_legend_is_always_shown():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    legend = next(m.value for m in at.markdown if "scl-legend" in m.value)
    for words in ("accepted draft token", "bonus token", "resampled by the target", "target"):
        assert words in legend


def test_model_draft_streams_coloured_tokens_and_acceptance():
    at = generate("model")
    assert not problems(at)
    html = stream_html(at)
    assert html.count('class="tok tok-') == 16
    assert "tok-target" in html  # the first token always comes from the target
    m = metrics(at)
    assert {"Tokens/s", "TTFT", "Without speculation", "Acceptance rate", "Mean acceptance length",
            "Theoretical (1-a^(g+1))/(1-a)"} <= set(m)
    assert m["Without speculation"].endswith("tok/s")  # the same target timed without a draft
    assert len(at.get("plotly_chart")) == 2  # acceptance by position + expected length vs gamma
    assert any("One generation, timed once: no interval" in c.value for c in at.caption)
    rid = at.session_state["pg-last"]["run_id"]
    from pages import _ui

    # measured by the backend as a "playground" record, imported into the dashboard's store
    rec = _ui.get_store().get_run(rid)
    assert rec.kind == "playground"
    assert rec.config["draft"]["kind"] == "model" and rec.metrics["spec"]["baseline_tok_s"]
    assert rec.label == "tiny@fp32 + tiny-draft@int4 g=4"  # EngineSetup.label, the one name of a configuration
    assert at.session_state["pg-job"].title == "playground: tiny@fp32 + tiny-draft@int4 g=4"
    # origins streamed from the backend are the run's trace, in order
    assert [o for _, o in at.session_state["pg-last"]["pieces"]] == rec.output["trace"][0]


def test_self_draft_must_be_cheaper_than_its_target():
    # a self-draft at the target's own precision would accept every token and save nothing: refused, with why
    at = generate("self", draft_precision="fp32", tokens=12)
    assert not at.exception
    assert any("a self-draft at fp32 is the target itself" in e.value and "Fix: draft at a cheaper precision" in e.value
               for e in at.error)
    assert "pg-job" not in at.session_state  # refused by the backend before anything was queued
    # its int8 weights drafting for the fp32 target: drafted tokens streamed, acceptance measured
    at = generate("self", draft_precision="int8", tokens=12)
    assert not problems(at)
    html = stream_html(at)
    assert html.count('class="tok tok-') == 12 and "tok-target" in html
    assert metrics(at)["Acceptance rate"].endswith("%")


def test_no_draft_plain_target():
    at = generate("none", tokens=8)
    assert not problems(at)
    assert stream_html(at).count("tok-target") == 8
    assert any("No draft" in c.value for c in at.caption)


def test_add_to_current_comparison():
    at = generate("ngram", tokens=8)
    at.button(key="pg-add").click().run()
    assert at.session_state["comparison"] == [at.session_state["pg-last"]["run_id"]]


def test_engine_errors_are_messages():
    at = generate("self", draft_precision="fp8")
    assert not at.exception
    assert any("fp8 needs an NVIDIA GPU" in e.value for e in at.error)
    at = generate("model", **{"pg-prompt": "   "})
    assert not at.exception
    assert any("a prompt is empty" in e.value for e in at.error)
