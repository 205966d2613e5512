"""The savings waterfall: baseline bf16 without speculation, + quantization, + speculation,
each step's cause, the band, and the CLI and figure that lead with it."""
import json
import math
import statistics

import pytest

from engine import planner
from engine.common.formulas import HOURS_PER_MONTH
from engine.planner import counts, shapes
from engine.planner.roofline import GIB, activation_reserve, kv_shard
from engine.planner.savings import acceptance_band, efficiency_error, savings


@pytest.fixture(scope="module")
def catalog():
    return planner.load_gpus(), shapes.load_models()


def _smallest_tp(model, gpu, precision, tokens, mem_util=0.9):
    """The memory check by hand: weights / TP + activation reserve + one request's KV <= mem_util of the GPU."""
    for tp in (1, 2, 4, 8):
        need = (counts.weight_bytes(model, precision) / tp + activation_reserve(model, tp)
                + counts.kv_cache_bytes(model, tokens, "bf16") * kv_shard(model, tp))
        if need <= gpu.memory_gb * GIB * mem_util:
            return tp
    return None


def test_waterfall_matches_a_hand_computation(catalog):
    """Llama-3.1-70B on H100 SXM at a trickle of traffic: one replica each, so the bill is the GPUs memory
    needs. bf16 (141 GB) needs TP 2, int4 (43 GB) one GPU: half the bill, and the cause says memory."""
    gpus, models = catalog
    g, m = gpus["H100 SXM"], models["llama-3.1-70b"]
    w = planner.Workload(model=m.name, request_rate=0.01, input_tokens=1024, output_tokens=256, tpot_p90_s=0.05)
    sv = savings(w, gpus, models, None, "H100 SXM")
    tp_bf16, tp_int4 = _smallest_tp(m, g, "bf16", 1280), _smallest_tp(m, g, "int4", 1280)
    assert (tp_bf16, tp_int4) == (2, 1)
    base, quant, spec = sv.steps
    month = g.price_usd_per_hr * HOURS_PER_MONTH
    assert base.plan.label == "2x H100 SXM bf16" and base.plan.gpus_total == 2
    assert base.usd_per_month == pytest.approx(2 * month)
    assert quant.taken and quant.plan.precision in ("int4", "int8", "fp8") and quant.plan.gpus_total == 1
    assert quant.usd_per_month == pytest.approx(month) and quant.delta_usd_per_month == pytest.approx(-month)
    assert "memory: the weights shrink 141.1 ->" in quant.cause and "fits on 1 GPU(s) instead of 2" in quant.cause
    assert sv.saving_usd_per_month == pytest.approx(month) and sv.saving_pct == pytest.approx(50.0)
    assert not spec.taken and spec.delta_usd_per_month == 0 and spec.plan is quant.plan
    assert sv.best is quant.plan and "saves $5,022/month" in sv.headline and "50%" in sv.headline
    # the steps add up: baseline + changes = the best plan's bill
    assert base.usd_per_month + sum(s.delta_usd_per_month for s in sv.steps[1:]) == pytest.approx(sv.best.usd_per_month)


def test_speculation_step_names_tokens_per_target_pass(catalog):
    """A tight per-token SLO with a typed-in acceptance of 0.8: speculation is what lets one GPU do it."""
    gpus, models = catalog
    w = planner.Workload(model="llama-3.1-70b", request_rate=0.2, input_tokens=1024, output_tokens=256,
                         tpot_p90_s=0.015, acceptance_rate=0.8, gamma=4)
    sv = savings(w, gpus, models, None, "H100 SXM")
    base, quant, spec = sv.steps
    assert spec.taken and spec.plan.spec and spec.delta_usd_per_month < 0
    e = (1 - 0.8 ** 5) / (1 - 0.8)
    assert f"E = {e:.2f} tokens per target pass" in spec.cause
    assert quant.cause.startswith("latency: at TP")  # bf16 is wide for its latency floor, not its memory
    assert acceptance_band(spec.plan and planner.SpecConfig(0.8, 4, source="typed in"), None, "x")[:2] == (0.8, 0.8)
    assert sv.saving_pct == pytest.approx(100 * (base.usd_per_month - spec.usd_per_month) / base.usd_per_month)


def test_a_step_that_saves_nothing_is_not_taken(catalog):
    """Llama-3.1-8B on one H100 at 16 req/s: bf16 already fits and keeps up; quantization and speculation
    cost the same one GPU, so neither is taken, and the answer says so instead of claiming a saving.
    (At 20 req/s bf16 needs a second GPU since the per-prefill and per-sequence costs are fitted.)"""
    gpus, models = catalog
    w = planner.Workload(model="llama-3.1-8b", request_rate=16, input_tokens=1024, output_tokens=256)
    sv = savings(w, gpus, models, None, "H100 SXM")
    assert [s.taken for s in sv.steps] == [True, False, False]
    assert sv.saving_usd_per_month == 0 and "already the cheapest" in sv.headline
    assert "not taken: no quantized precision is cheaper here" in sv.steps[1].cause
    assert "costs $5,022/month" in sv.steps[1].cause  # the alternative is shown, with its cost


def test_the_band_is_the_planners_published_error_and_the_acceptance_range(catalog):
    gpus, models = catalog
    from engine.planner import fit
    rows = [r for r in fit.check_with_loo() if not r["excluded"]]
    err, words = efficiency_error()
    assert err == pytest.approx(statistics.median(abs(r.get("loo_error_pct", r["error_pct"])) / 100 for r in rows))
    assert f"{len(rows)} published measurements" in words
    # an assumed acceptance (0.6) is banded +/- 0.2
    w = planner.Workload(model="llama-3.1-8b", request_rate=2, input_tokens=1024, output_tokens=256, tpot_p90_s=0.03)
    sv = savings(w, gpus, models, None, "L4")
    assert any("acceptance 0.40 to 0.80 (assumed 0.6 +/- 0.2)" in n for n in sv.notes)
    for s in sv.steps:
        assert s.low_usd_per_month <= s.usd_per_month <= s.high_usd_per_month
    assert sv.saving_low_usd_per_month <= sv.saving_usd_per_month <= sv.saving_high_usd_per_month
    # the band's edge scales both efficiencies
    dep = planner.make_deployment(models["llama-3.1-8b"], gpus["L4"], "bf16")
    base, _ = dep.efficiency()
    from dataclasses import replace

    hi, src = replace(dep, efficiency_scale=1.1).efficiency()
    assert hi.mem_bw == pytest.approx(min(1, base.mem_bw * 1.1)) and "x 1.10" in src


def test_a_measured_acceptance_is_banded_by_its_runs():
    from engine.planner.calibration import AcceptanceObs, Calibration

    obs = [AcceptanceObs("m", "model", "d", 0.7, 4, None, "r1", drafted=400),
           AcceptanceObs("m", "model", "d", 0.8, 4, None, "r2", drafted=100)]
    cal = Calibration(acceptance=obs)
    sc = planner.SpecConfig(0.72, 4, "model", "d", source="measured by the lab (2 run(s))")
    lo, hi, words = acceptance_band(sc, cal, "m")
    assert lo == pytest.approx(0.7 - 1.96 * math.sqrt(0.7 * 0.3 / 400))
    assert hi == pytest.approx(0.8 + 1.96 * math.sqrt(0.8 * 0.2 / 100))
    assert "2 run(s)" in words


def test_plan_cli_leads_with_the_answer(capsys):
    from engine.present.plan_cli import main

    args = ["plan", "--model", "llama-3.1-70b", "--rate", "0.01", "--gpus", "H100 SXM", "--no-store"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("the answer on H100 SXM: 1x H100 SXM") and "saves $5,022/month" in out[2]
    assert out[3].split()[:2] == ["step", "plan"] and out.index("every plan that meets the SLOs, cheapest first:") > 6
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in d["savings"]["steps"]] == ["baseline", "+ quantization", "+ speculation"]
    assert d["savings"]["saving_pct"] == pytest.approx(50.0)


def test_the_waterfall_figure_draws_the_steps(catalog):
    from engine.present import planning

    gpus, models = catalog
    sv = savings(planner.Workload(model="llama-3.1-70b", request_rate=0.01, input_tokens=1024, output_tokens=256),
                 gpus, models, None, "H100 SXM").to_dict()
    fig = planning.savings_figure(sv)
    wf = fig.data[0]
    assert list(wf.measure) == ["absolute", "relative", "relative", "total"]
    assert wf.y[0] == pytest.approx(sv["steps"][0]["usd_per_month"])
    assert wf.y[1] == pytest.approx(sv["steps"][1]["delta_usd_per_month"])
    assert "(not taken)" in wf.x[2] and wf.x[3].startswith("best: 1x H100 SXM")
    rows = planning.savings_rows(sv)
    assert [r["step"] for r in rows] == ["baseline", "+ quantization", "+ speculation"] and rows[1]["cause"]


def test_break_even_acceptance_is_where_speculation_stops_paying(catalog):
    """Issue 24.5: at the break-even acceptance, a round's tokens E(a, g) times a plain step's time equals
    the round's time (verify + drafting); above it speculation pays, below it does not."""
    from dataclasses import replace

    from engine.planner.acceptance import expected_tokens_per_step
    from engine.planner.roofline import decode_step, spec_step
    from engine.planner.sweep import batch_sweep, break_even_acceptance, crossovers

    gpus, models = catalog
    m, d = models["llama-3.1-8b"], models["llama-3.2-1b"]
    sc = planner.SpecConfig(0.6, 4, "model", d.name, source="typed in")
    dep = planner.make_deployment(m, gpus["H100 SXM"], "bf16", spec=sc, draft=d)
    for batch in (1, 16):
        a = break_even_acceptance(dep, batch, 512)
        plain = decode_step(replace(dep, spec=None, draft=None), batch, 512).total
        assert expected_tokens_per_step(a, 4) * plain == pytest.approx(spec_step(dep, batch, 512).total, rel=1e-6)
    rows = batch_sweep(m, gpus["H100 SXM"], ["bf16"], [1, 1024], 512, sc, d)
    small, large = rows[0]["break_even_acceptance"], rows[1]["break_even_acceptance"]
    assert large is None or small < large  # larger batches need more acceptance, or none pays
    assert any("needs an acceptance above" in x for x in crossovers(rows))
