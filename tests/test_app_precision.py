"""Precision page: load a (tiny) model at a precision, memory breakdown, quality vs fp32, errors."""

from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, problems  # noqa: F401

PAGE = str(ROOT / "pages/precision.py")


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def load(precision="int8"):
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    assert any("press **Load**" in i.value for i in at.info)
    at.selectbox(key="prec-model").set_value("tiny")
    at.selectbox(key="prec-precision").set_value(precision)
    at.button(key="prec-load").click().run()
    return at


def test_load_shows_weights_memory_and_load_time():
    at = load("int8")
    assert not problems(at)
    assert at.subheader[0].value.startswith("tiny@int8 on cpu")
    m = metrics(at)
    assert m["Weights"].endswith(" MB") and m["Load time"].endswith(" s")
    assert m["Layers × KV heads × head dim"] == "2 × 2 × 8"
    parts = frame(at, "part", "MB", "share")
    assert list(parts["part"][:5]) == ["weights: embedding", "weights: attention", "weights: mlp", "weights: norm",
                                       "weights: head"]
    assert "KV cache" in set(parts["part"])
    assert len(at.get("plotly_chart")) >= 2  # memory bar + KV grid


def test_context_and_batch_change_the_kv_cache():
    at = load("fp32")
    kv = lambda: float(frame(at, "part", "MB").set_index("part").loc["KV cache", "MB"])  # noqa: E731
    # tiny: 2 layers x 2 kv heads x head dim 8, fp32 -> 2*2*2*8*4 = 256 bytes per token per sequence;
    # its context is 256 tokens, so that is the only (and largest) context offered
    assert at.select_slider(key="prec-context").options == ["256"]
    at.select_slider(key="prec-batch").set_value(1).run()
    assert kv() == round(256 * 256 / 1e6, 2)
    at.select_slider(key="prec-batch").set_value(4).run()
    assert kv() == round(4 * 256 * 256 / 1e6, 2)
    assert not problems(at)


def test_quality_against_fp32():
    at = load("int4")
    at.button(key="prec-quality").click().run()
    assert not problems(at)
    m = metrics(at)
    assert {"Perplexity", "KL mean", "KL p99", "Top-1 agreement"} <= set(m)
    assert float(m["KL mean"]) > 0  # int4 of random weights differs from fp32
    assert m["Top-1 agreement"].endswith("%")


def test_unsupported_precision_is_an_error_message():
    at = load("fp8")
    assert not at.exception
    assert any("fp8 needs an NVIDIA GPU" in e.value and "Fix:" in e.value for e in at.error)


def test_quality_against_bytes_marks_each_method():
    """Three precisions of the tiny model scored through the page (int8, bf16, int4 round-to-nearest), each measured
    on the backend for real: the methods plot and its table show each configuration's newest quality record at its
    weight bytes, and the frontier is the records' own Pareto set. (GPTQ and AWQ need a real model folder to
    calibrate on: tests/test_calibrated.py.)"""
    from engine.measure.store import Store
    from engine.present.compare import pareto_frontier

    at = load("int8")
    at.button(key="prec-quality").click().run()
    for precision in ("bf16", "int4"):
        at.selectbox(key="prec-precision").set_value(precision).run()
        at.button(key="prec-load").click().run()
        assert at.session_state["prec-loaded"]["label"].startswith(f"tiny@{precision}")
        at.button(key="prec-quality").click().run()
        assert not problems(at)
    t = frame(at, "config", "method", "weight_MB", "kld_median", "frontier")
    assert set(t["method"]) == {"int8", "bf16", "int4 rtn"} and list(t["weight_MB"]) == sorted(t["weight_MB"])
    recs = {r.label: r for r in Store().list_runs(100) if r.kind == "quality"}
    assert len(recs) == 3
    for _, row in t.iterrows():
        rec = recs[f"tiny@{row['config']}"]
        assert row["kld_median"] == rec.metrics["quality"]["kld_median"]
        assert row["weight_MB"] == rec.metrics["weight_bytes"] / 1e6
    assert [bool(x) for x in t["frontier"]] == pareto_frontier(t.to_dict("records"), "weight_MB", "kld_median")
    assert t["frontier"].iloc[0] and t["frontier"].sum() >= 2  # the fewest bytes, and bf16's near-zero KLD
    assert any("Quality against weight bytes" in c.proto.spec for c in at.get("plotly_chart"))


def test_a_load_left_running_shows_its_progress_and_cancel(lab_backend):
    """A load the page started and left (its script run stopped while the backend loads or calibrates): the page
    shows the job's progress and a Cancel button that reaches the backend; Load waits for it."""
    from engine.backend.client import Backend
    from pages._backend import RemoteJob

    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    b = Backend(lab_backend.url)
    with lab_backend.pool.lock:  # the load blocks on the pool, as a long calibration holds it
        item = {"kind": "load", "setup": {"model": "tiny", "precision": "int8"}}
        job_id = b.submit("load tiny@int8", {"items": [item]})
        at.session_state["prec-job"] = RemoteJob(b, job_id, "load tiny@int8")
        at.run()
        assert at.button(key="prec-load").disabled and len(at.get("progress")) == 1
        at.button(key="prec-job-cancel").click().run()
        assert lab_backend.queue.get(job_id).cancelled
    assert b.wait(job_id, timeout_s=120)["state"] in ("cancelled", "finished")  # a plain load has no layer to stop at
    at.run()
    assert not at.button(key="prec-load").disabled and not problems(at)
