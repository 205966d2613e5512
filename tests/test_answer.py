"""The answer first (issue 40, item 5): one summary row per results page, every figure a record's or the planner's."""
from __future__ import annotations

import pytest

from engine import planner, present
from engine.present.answer import load_answer, plan_answer, runs_answer
from tests.test_load_view import curve, point
from tests.test_ui_data import rec


def test_runs_answer_names_baseline_and_cheapest_with_their_figures():
    spec = {"acceptance_rate": 0.7, "speedup": 1.4}
    recs = [rec("fp32", 5.0, weight=4e9), rec("bf16", 8.0, weight=2e9), rec("int4", 20.0, weight=6e8, kl=0.012),
            rec("int4", 26.0, weight=6e8, kl=0.012, draft={"kind": "ngram", "gamma": 4}, spec=spec)]
    rows = present.comparison_rows(recs, 3.6)
    a = runs_answer(rows)
    base = next(r for r in rows if r["precision"] == "bf16")
    best = min(rows, key=lambda r: r["usd_per_1m_out"])
    assert a.recommended == best["config"] == "m@int4 + ngram g=4"
    assert a.baseline == base["config"]   # bf16 before fp32
    assert a.cell("$ per 1M output").value == f"${best['usd_per_1m_out']:.4g}"
    assert a.cell("Saved").value == f"{100 * (1 - best['usd_per_1m_out'] / base['usd_per_1m_out']):.0f}%"
    assert a.cell("Saved").note == "no interval (one repetition)"
    assert a.cell("Quality").value == "KLD 0.012"
    assert a.cell("Speculation").value == "pays 1.40x"
    # without a draft or quality, the row says so rather than guessing
    b = runs_answer(present.comparison_rows(recs[:3], 3.6))
    assert b.cell("Speculation").value == "—" and b.cell("Quality").value == "KLD 0.012"


def test_runs_answer_interval_takes_both_ends():
    rows = [{"config": "b", "precision": "bf16", "usd_per_1m_out": 10.0, "usd_per_1m_out_lo": 9.0,
             "usd_per_1m_out_hi": 11.0},
            {"config": "q", "precision": "int4", "usd_per_1m_out": 5.0, "usd_per_1m_out_lo": 4.0,
             "usd_per_1m_out_hi": 6.0}]
    a = runs_answer(rows)
    # at worst 6 against 9 (33%), at best 4 against 11 (64%)
    assert a.cell("Saved").value == "50%" and a.cell("Saved").note == "95% interval 33% to 64%"


def test_load_answer_prices_at_the_slo():
    recs = curve("ours bf16", {1: 10, 4: 20}, precision="bf16") + curve("ours int4", {1: 15, 4: 40}) \
        + curve("ours int4 + ngram", {1: 20, 4: 35}, draft="ngram")
    costs = present.load_cost.costs_at_slo(recs, 3.6)
    a = load_answer(recs, costs, present.load_cost.crossover_pairs(recs))
    by = {c.configuration: c for c in costs}
    int4 = next(n for n in by if n.startswith("ours int4 ·"))
    assert a.recommended == int4 and a.baseline.startswith("ours bf16")
    assert a.cell("$ per 1M output at the SLO").value == f"${by[int4].usd_per_1m_out:.4g}"
    assert a.cell("Speculation").value == "pays until 4"
    hopeless = [point("x", 1, met=[], missed=[9])]
    assert load_answer(hopeless, present.load_cost.costs_at_slo(hopeless, 1.0)) is None


def test_plan_answer_is_the_waterfall():
    from engine.planner.savings import plan_with_savings

    w = planner.Workload(model="llama-3.1-70b", request_rate=0.01, input_tokens=512, output_tokens=256,
                         gpus=["H100 SXM"])
    _, sv = plan_with_savings(w, planner.load_gpus(), planner.shapes.load_models())
    d = sv.to_dict()
    a = plan_answer(d)
    assert a.recommended == d["steps"][-1]["plan"] and a.baseline == d["steps"][0]["plan"]
    assert a.cell("Saved").value == f"{d['saving_pct']:.0f}%"
    assert a.cell("Quality").value == "—" and a.cell("Quality").note.startswith("not budgeted")


@pytest.mark.parametrize("rows", [[], [{"config": "x", "usd_per_1m_out": None}]])
def test_no_cost_no_answer(rows):
    assert runs_answer(rows) is None
