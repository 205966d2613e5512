"""Cost & capacity page: $/1M from measured tokens/s, capacity for a daily volume, the planner, GPU prices."""

import pytest
from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, local_pool, problems  # noqa: F401

PAGE = str(ROOT / "pages/cost.py")


def with_runs():
    from engine.measure.runs import RunConfig, execute
    from pages import _ui

    ids = [execute(RunConfig.of(model="tiny", precision=p, max_new_tokens=6), local_pool(), _ui.get_store()).run_id
           for p in ("fp32", "int8")]
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["comparison"] = ids
    return at.run()


def test_no_runs_yet():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    assert any("No measured runs yet" in i.value for i in at.info)


def test_measured_cost_and_capacity_follow_price_and_volume():
    at = with_runs()
    assert not problems(at)
    cap = frame(at, "config", "machines", "usd_per_month")
    assert len(cap) == 2 and (cap["machines"] >= 1).all()
    import json

    titles = [json.dumps(json.loads(c.proto.spec)["layout"]["title"]) for c in at.get("plotly_chart")]
    assert any("one stream at the measured batch size" in t for t in titles)  # named for what it is
    at.number_input(key="price-cost").set_value(1.0).run()
    cap1 = frame(at, "config", "machines", "usd_per_month")
    at.number_input(key="price-cost").set_value(2.0).run()
    cap2 = frame(at, "config", "machines", "usd_per_month")
    assert (abs(cap2["usd_per_1m_out"] - 2 * cap1["usd_per_1m_out"]) < 1e-3).all()
    # the price is this machine's override for the planner too
    from pages import _ui

    ov = {o["name"]: o for o in _ui.get_store().gpu_overrides()}
    assert ov["this machine"]["price_usd_per_hr"] == 2.0
    at.number_input(key="cost-per-day").set_value(1e9).run()
    assert (frame(at, "config", "machines")["machines"] > cap2["machines"]).all()


def test_planner_plans_a_workload():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    at.number_input(key="plan-rate").set_value(2.0)
    at.multiselect(key="plan-gpus").set_value(["H100 SXM", "A100 80GB"])
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert not problems(at)
    labels = {m.label: m.value for m in at.metric}
    # the answer first: the savings waterfall against bf16 without speculation, with each step's cause
    answer = [m.value for m in at.markdown if m.value.startswith("**The answer on")]
    assert answer and ("saves $" in answer[0] or "already the cheapest" in answer[0])
    steps = frame(at, "step", "plan", "cause")
    # one answer: the recommended plan is the waterfall's last step, not a second "cheapest"
    assert labels["Recommended plan"] == steps["plan"].iloc[-1].removesuffix(" (not taken)")
    # and the page opens with it: the answer row is the first row of figures (issue 40.5)
    assert at.markdown[0].value.startswith("**Recommended: " + labels["Recommended plan"].replace("-", "\\-"))
    assert at.metric[0].label == "$ per 1M output"
    assert list(steps["step"]) == ["baseline", "+ quantization", "+ speculation"]
    assert steps["plan"].iloc[0].endswith("bf16") and all(steps["cause"].str.len() > 0)
    import json

    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert any(d["data"][0]["type"] == "waterfall" for d in charts)
    assert labels["$ per month"].startswith("$")
    plans = frame(at, "plan", "feasible", "usd_per_month")
    assert plans["feasible"].all() and len(plans) >= 1
    assert all(("H100" in p or "A100" in p) for p in plans["plan"])
    # a what-if acceptance goes through the same model, and the answer says it used it
    at.number_input(key="plan-acceptance").set_value(0.85)
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert not problems(at)
    cause = frame(at, "step", "plan", "cause").set_index("step")["cause"]["+ speculation"]
    assert "acceptance 0.85" in cause, cause
    at.number_input(key="plan-acceptance").set_value(1.0)  # every draft token forever: refused by name
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert any("acceptance_rate" in e.value and "[0, 1)" in e.value for e in at.error), [e.value for e in at.error]


def test_planner_compares_a_peak_sized_fleet_with_an_autoscaled_one():
    """Issue 24.2: a diurnal day whose busiest hour is the rate: the fleet sized for the peak against the
    autoscaled one, in dollars, GPU-hours and the hours that miss the SLO while scaling."""
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.selectbox(key="plan-model").set_value("llama-3.1-8b")
    at.number_input(key="plan-rate").set_value(200.0)
    at.multiselect(key="plan-gpus").set_value(["H200"])
    at.selectbox(key="plan-traffic").set_value("diurnal")
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert not problems(at)
    m = {x.label: x for x in at.metric}
    peak = float(m["Sized for the peak"].value.strip("$/month").replace(",", ""))
    auto = float(m["Autoscaled"].value.strip("$/month").replace(",", ""))
    assert 0 < auto < peak
    assert any("A day of diurnal traffic" in x.value for x in at.markdown)
    # issue 40.2: the best configuration per hour against the best single one, never dearer
    per_hour = float(m["Best configuration per hour"].value.strip("$/day").replace(",", ""))
    single = float(m["Best single configuration, autoscaled"].value.strip("$/day").replace(",", ""))
    assert 0 < per_hour <= single and any(x.value.startswith("**By the hour:**") for x in at.markdown)
    import json

    titles = [json.dumps(json.loads(c.proto.spec)["layout"].get("title")) for c in at.get("plotly_chart")]
    assert any("A day of diurnal" in t for t in titles)


def test_a_fleet_of_models_shares_gpus_where_quantization_makes_them_fit():
    """Issue 24.3: three 7-8B models on L40S: shared GPUs against one model per GPU, per precision."""
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.number_input(key="plan-tpot").set_value(50.0)  # the fleet plans at the planner form's SLOs, once submitted
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    at.button(key="FormSubmitter:cost-fleet-Plan the fleet").click().run()
    assert not problems(at)
    rows = frame(at, "precision", "GPUs shared").set_index("precision")
    assert rows.loc["int4", "GPUs shared"] == 1 and rows.loc["int4", "GPUs, one model each"] == 3
    assert rows.loc["bf16", "GPUs shared"] == 2
    assert any("shared against 3 with one model per GPU" in m.value for m in at.markdown)
    at.text_input(key="fleet-models").set_value("llama-3.1-8b:fast")
    at.button(key="FormSubmitter:cost-fleet-Plan the fleet").click().run()
    assert any("is not model:rate" in e.value for e in at.error)


def test_the_defaults_show_a_decision():
    """Issue 40.8: the page opens on a workload where quantization and speculation change the answer on a
    production GPU: each step of the waterfall is taken and saves."""
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert not problems(at)
    steps = frame(at, "step", "plan", "change $/month").set_index("step")
    assert not any(p.endswith("(not taken)") for p in steps["plan"])
    assert (steps["change $/month"].iloc[1:] < 0).all(), steps
    assert at.markdown[0].value.startswith("**Recommended: ") and "+spec" in at.markdown[0].value
    import json

    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    trade = next(c for c in charts if "tokens/s per user" in c["layout"]["title"]["text"])  # InferenceMAX's view
    assert {t["name"] for t in trade["data"]} >= {"bf16", "fp8", "fp8 + model draft"}


def test_planner_refuses_impossible_slo_with_a_message():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.number_input(key="plan-tpot").set_value(0.1)  # 0.1 ms per token: no GPU does that
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert not at.exception
    assert any("No plan meets these SLOs" in w.value for w in at.warning)


def test_this_machine_price_from_the_gpu_form_reaches_the_price_input():
    at = with_runs()
    at.number_input(key="price-cost").set_value(0.5).run()
    at.selectbox(key="ov-gpu").set_value("this machine")
    at.number_input(key="ov-price").set_value(0.75)
    at.button(key="FormSubmitter:gpu-override-Save price").click().run()
    assert not problems(at)
    assert at.number_input(key="price-cost").value == 0.75
    from pages import _ui

    ov = {o["name"]: o for o in _ui.get_store().gpu_overrides()}
    assert ov["this machine"]["price_usd_per_hr"] == 0.75  # not overwritten by the stale input


def test_gpu_price_override():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.selectbox(key="ov-gpu").set_value("H100 SXM")
    at.number_input(key="ov-price").set_value(2.49)
    at.text_input(key="ov-src").input("our contract")
    at.button(key="FormSubmitter:gpu-override-Save price").click().run()
    assert not problems(at)
    prices = frame(at, "gpu", "usd_per_hr").set_index("gpu")
    assert prices.loc["H100 SXM", "usd_per_hr"] == 2.49
    at.selectbox(key="ov-del-name").set_value("H100 SXM")
    at.button(key="ov-del").click().run()
    prices = frame(at, "gpu", "usd_per_hr").set_index("gpu")
    assert prices.loc["H100 SXM", "usd_per_hr"] != 2.49


def test_kv_budget_table_follows_the_budget_and_shows_int8_about_twice_bf16():
    """The KV panel: sequences a budget holds per KV precision, from the formula the paged cache allocates by."""
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    t = frame(at, "kv_dtype", "sequences", "vs_bf16").set_index("kv_dtype")
    assert 1.9 <= t.loc["int8", "vs_bf16"] < 2.0 and t.loc["fp32", "vs_bf16"] == pytest.approx(0.5, abs=0.01)
    at.number_input(key="kv-gib").set_value(16.0).run()
    t2 = frame(at, "kv_dtype", "sequences").set_index("kv_dtype")
    assert t2.loc["bf16", "sequences"] in (2 * t.loc["bf16", "sequences"], 2 * t.loc["bf16", "sequences"] + 1)


def test_planner_plans_within_a_quality_budget():
    """Issue 40.1: the same records the CLI test plans from, in the page's store: the same answer."""
    from engine.measure.records import RunRecord
    from pages import _ui
    from tests.test_quality_budget import MODEL, records

    for d in records():
        _ui.get_store().save_run(RunRecord.from_dict(d | {"machine": {}, "schema_version": 3}))
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.selectbox(key="plan-model").set_value(MODEL)
    at.number_input(key="plan-tpot").set_value(50.0)
    at.number_input(key="plan-rate").set_value(15.0)
    at.number_input(key="plan-in").set_value(512)
    at.multiselect(key="plan-gpus").set_value(["L4"])
    at.multiselect(key="plan-precisions").set_value(["bf16", "int8", "int4"])
    at.selectbox(key="plan-spec").set_value("off")
    at.number_input(key="plan-max-kld").set_value(0.012)
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert not problems(at)
    answer = [m.value for m in at.markdown if m.value.startswith("**The answer on")]
    assert answer and "1x L4 int4\\-awq\\-g32 saves" in answer[0] and "within the quality budget" in answer[0]
    plans = frame(at, "plan", "feasible", "kld_mean")
    assert plans.iloc[0]["plan"] == "1x L4 int4-awq-g32" and plans.iloc[0]["kld_mean"] == 0.011122
    notes = [c.value for c in at.caption]
    assert any("within budget: int4\\-awq\\-g32: KLD mean 0\\.01112" in n for n in notes), notes
    # the same budget on the median: RTN g64 (median 0.00967, mean 0.0326) is within 0.01 and the fewest bytes
    at.selectbox(key="plan-kld-stat").set_value("median")
    at.number_input(key="plan-max-kld").set_value(0.01)
    at.button(key="FormSubmitter:cost-plan-Plan").click().run()
    assert not problems(at)
    plans = frame(at, "plan", "kld_median")
    assert plans.iloc[0]["plan"] == "1x L4 int4-g64" and plans.iloc[0]["kld_median"] == 0.00967
