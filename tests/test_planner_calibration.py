"""The planner calibrated from the lab's run and load records: fractions, prefill, acceptance, batches."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import planner  # noqa: E402
from engine.planner import counts, shapes  # noqa: E402
from engine.planner import (Deployment, Workload, calibrate, decode_step,  # noqa: E402
                            expected_tokens_per_step, plan)
from engine.planner.gpus import load_gpus  # noqa: E402

MODELS = shapes.load_models()
GPUS = load_gpus()


# ---------------------------------------------------------------- calibration

def _record(precision, bpt, bw, frac, overhead=0.0, device="cpu", run_id="r", model="qwen2.5-coder-1.5b"):
    t = bpt / (frac * bw * 1e9) + overhead
    return {"run_id": run_id, "config": {"model": model, "precision": precision},
            "metrics": {"decode_tok_s": 1 / t, "bytes_per_token": bpt, "mem_bw_gbs": bw, "spec": None},
            "machine": {"device": device}}


def test_calibration_recovers_known_fractions():
    recs = []
    for i, (bpt, bw) in enumerate([(1.0e9, 20), (3.1e9, 20), (0.5e9, 25), (1.5e9, 18)]):
        recs.append(_record("int8", bpt, bw, 0.62, run_id=f"a{i}"))
        recs.append(_record("fp32", bpt * 4, bw, 0.81, run_id=f"b{i}"))
    cal = calibrate(recs)
    assert cal.fit_for("cpu", "int8").mem_bw_frac == pytest.approx(0.62, rel=1e-9)
    assert cal.fit_for("cpu", "fp32").mem_bw_frac == pytest.approx(0.81, rel=1e-9)
    assert cal.fit_for("cpu", "int8").rmse_rel == pytest.approx(0.0, abs=1e-9)
    assert cal.machine_bw_gbs == 20


def test_calibration_fits_prefill_compute_and_uses_it_on_this_machine():
    m = MODELS["qwen2.5-coder-1.5b"]
    recs = []
    for i, prompt in enumerate((57, 200, 512)):
        r = _record("int8", 1.6e9, 20, 0.5, run_id=f"p{i}")
        r["metrics"].update(prompt_tokens=prompt, prefill_s=counts.prefill_flops(m, prompt) / 0.8e12)
        recs.append(r)
    cal = calibrate(recs)
    assert cal.prefill_tflops[("cpu", "int8")] == pytest.approx(0.8)
    here = load_gpus(probe={"mem_bw_gbs": 20})["this machine"]
    d = Deployment(m, here, "int8", calibration=cal)
    eff, src = d.efficiency()
    assert eff.compute * here.fp32_tflops == pytest.approx(0.8) and "prefill 0.8 TFLOP/s measured" in src
    assert eff.mem_bw == pytest.approx(0.5)


def test_calibration_with_noise_and_overhead_reports_residuals():
    rng = random.Random(0)
    recs = []
    for i in range(12):
        bpt = rng.uniform(0.3e9, 3e9)
        r = _record("int4", bpt, 20, 0.5, overhead=0.02, run_id=f"n{i}")
        r["metrics"]["decode_tok_s"] *= 1 + rng.uniform(-0.01, 0.01)
        recs.append(r)
    fit = calibrate(recs, fit_overhead=True).fit_for("cpu", "int4")
    assert fit.mem_bw_frac == pytest.approx(0.5, rel=0.08)
    assert fit.overhead_s == pytest.approx(0.02, abs=0.005)
    assert len(fit.residuals) == 12 and 0 < fit.rmse_rel < 0.02
    no_oh = calibrate(recs).fit_for("cpu", "int4")
    assert no_oh.rmse_rel > fit.rmse_rel            # ignoring a real overhead fits worse


def test_calibration_handles_missing_keys_and_spec_records():
    recs = [
        {"run_id": "x1", "config": {"model": "qwen2.5-coder-1.5b", "precision": "int8"}, "metrics": {},
         "machine": {"device": "cpu"}},
        {"run_id": "x2", "config": {}, "metrics": {"decode_tok_s": 10}, "machine": {}},
        {"run_id": "x3", "config": {"model": "qwen2.5-coder-1.5b", "precision": "int8"},
         "metrics": {"decode_tok_s": 12.0, "mem_bw_gbs": 20.0}, "machine": {"device": "cpu"}},   # bytes computed
        {"run_id": "s1", "config": {"model": "qwen2.5-coder-1.5b", "precision": "int8",
                                    "draft": {"kind": "model", "model": "qwen2.5-coder-0.5b", "gamma": 4}},
         "metrics": {"decode_tok_s": 20.0, "spec": {"acceptance_rate": 0.72, "mean_acceptance_length": 2.9,
                                                    "gamma": 4, "draft_kind": "model"}},
         "machine": {"device": "cpu"}},
        {"run_id": "s2", "config": {"model": "qwen2.5-coder-1.5b", "precision": "int8"},
         "metrics": {"spec": {"mean_acceptance_length": expected_tokens_per_step(0.5, 4), "gamma": 4,
                              "draft_kind": "ngram"}}, "machine": {"device": "cpu"}},
        "not a record",
    ]
    recs.append({"run_id": "g1", "config": {"model": "qwen2.5-coder-1.5b", "precision": "int4-g64",
                                             "quant": {"precision": "int4", "group_size": 64}, "device": "cpu"},
                 "metrics": {"decode_tok_s": 9.0, "bytes_per_token": 1.2e9, "mem_bw_gbs": 20.0}, "machine": {}})
    cal = calibrate(recs)
    assert cal.fit_for("cpu", "int4").n == 1          # the record's label 'int4-g64' is int4
    skipped = dict(cal.skipped)
    assert "no decode_tok_s" in skipped["x1"] and "x2" in skipped
    assert cal.fit_for("cpu", "int8").n == 1
    a, g, n, desc = cal.acceptance_for("qwen2.5-coder-1.5b", "model", "qwen2.5-coder-0.5b")
    assert (a, g, n) == (0.72, 4, 1) and "measured" in desc
    a2, *_ = cal.acceptance_for("qwen2.5-coder-1.5b", "ngram")
    assert a2 == pytest.approx(0.5, abs=1e-9)
    json.dumps(cal.to_dict())


def test_measured_acceptance_and_calibration_flow_into_plans():
    recs = [_record("int8", 1.6e9, 20, 0.55, run_id="c1"),
            {"run_id": "s1", "config": {"model": "qwen2.5-coder-1.5b", "precision": "int8",
                                        "draft": {"kind": "model", "model": "qwen2.5-coder-0.5b", "gamma": 4}},
             "metrics": {"spec": {"acceptance_rate": 0.8, "gamma": 4, "draft_kind": "model"}},
             "machine": {"device": "cpu"}}]
    cal = calibrate(recs)
    w = Workload("qwen2.5-coder-1.5b", 0.2, 256, 128, ttft_p90_s=10, tpot_p90_s=1.0, gpus=["this machine", "L4"],
                 precisions=["int8"], tp_options=[1], draft_model="qwen2.5-coder-0.5b")
    res = plan(w, models=MODELS, calibration=cal)
    spec_plans = [p for p in res.plans if p.spec]
    assert spec_plans and all(p.spec_config["acceptance_rate"] == 0.8 for p in spec_plans)
    assert "measured by the lab" in spec_plans[0].spec_config["source"]
    here = next(p for p in res.plans if p.gpu == "this machine" and not p.spec)
    eff = next(y for y in here.why if y.term == "efficiency")
    assert eff.value == pytest.approx(0.55) and "calibrated" in eff.formula
    gpu_plan = next(p for p in res.plans if p.gpu == "L4" and not p.spec)
    assert "serving default" in next(y for y in gpu_plan.why if y.term == "efficiency").formula


def _load_record(batch, step_s, system="serving-cost-lab", draft=None, run_id="L", precision="int4"):
    return {"run_id": run_id, "kind": "load", "machine": {"device": "cpu"},
            "config": {"system": system, "model": "qwen2.5-coder-0.5b", "precision": precision, "draft": draft,
                       "server": {"slots": 8},
                       "workload": {"requests": 8, "prompt_tokens_total": 8 * 200,
                                    "requested_output_tokens_total": 8 * 64}},
            "metrics": {"load": {"itl_s_p50": step_s, "concurrency_mean": batch}}}


def test_load_records_calibrate_the_batch_model_and_plans_say_so():
    m = MODELS["qwen2.5-coder-0.5b"]
    flops = 2.0 * counts.matmul_params_per_token(m) + 4.0 * m.layers * m.q_dim * (200 + 32)
    fam = planner.FAMILIES["cpu"]
    over = (fam.step_overhead_ms + fam.per_layer_overhead_ms * m.layers) / 1e3
    rate = 0.05e12  # the step's FLOP rate at batch > 1, as measured on this 2-core machine (~0.05 TFLOP/s)
    recs = [_load_record(b, b * flops / rate + over, run_id=f"L{b}") for b in (2, 4, 7.5)]
    recs += [_load_record(1.0, 0.034, run_id="L1"),
             _load_record(8, 0.1, system="llama-server", run_id="llama"),
             _load_record(8, 0.1, draft={"kind": "ngram", "gamma": 4}, run_id="spec"),
             _load_record(8, 0.1, run_id="full")]
    recs[-1]["metrics"] = {"load": {"concurrency_mean": 8}}  # no step time
    cal = calibrate(recs + [_record("int4", 0.5e9, 20, 0.5, run_id="bw", model="qwen2.5-coder-0.5b")])
    bf = cal.batch[("cpu", "int4")]
    assert bf.decode_tflops == pytest.approx(0.05, rel=1e-6) and bf.n == 3
    assert bf.slope_s > 0 and bf.step_s(4) == pytest.approx(4 * flops / rate + over, rel=0.15)
    why = dict(cal.skipped)
    assert "llama-server" in why["llama"] and "speculative" in why["spec"] and "itl_s_p50" in why["full"]
    json.dumps(cal.to_dict())
    # the plan on this machine uses it: the decode step at batch 8 costs what the load test measured
    here = load_gpus(probe={"mem_bw_gbs": 20})["this machine"]
    d = Deployment(m, here, "int4", calibration=cal)
    eff, src = d.efficiency()
    assert "decode step measured under load" in src and "ms per sequence" in src
    for b in (1, 4, 8):  # the step is the measured line (the KV term adds < 2% at this context)
        assert decode_step(d, b, 232).total == pytest.approx(bf.step_s(b), rel=0.02)
    # another model on this machine scales the line by its bytes (weights term) and FLOPs (per sequence)
    big = Deployment(MODELS["qwen2.5-coder-1.5b"], here, "int4", calibration=cal)
    weights_s, per_seq_s = bf.line
    wb = lambda mm: counts.weight_bytes_breakdown(mm, "int4")  # noqa: E731
    s1, s2 = decode_step(d, 1, 232), decode_step(big, 1, 232)
    assert s1.additive and s2.t_weights / s1.t_weights == pytest.approx(
        (wb(big.model).blocks + wb(big.model).embedding + wb(big.model).small)
        / (wb(m).blocks + wb(m).embedding + wb(m).small), rel=0.01)
    assert s1.t_weights == pytest.approx(weights_s, rel=0.01)
    w = Workload("qwen2.5-coder-0.5b", 0.5, 200, 64, ttft_p90_s=20, tpot_p90_s=2.0, gpus=["this machine"],
                 precisions=["int4"], spec="off", tp_options=[1])
    with_load = plan(w, models=MODELS, calibration=cal).plans[0]
    term = next(y for y in with_load.why if y.term == "efficiency")
    assert "under load" in term.formula
    without = plan(w, models=MODELS, calibration=calibrate(recs[-1:] + [_record("int4", 0.5e9, 20, 0.5, run_id="bw",
                                                                                  model="qwen2.5-coder-0.5b")])).plans[0]
    assert "under load" not in next(y for y in without.why if y.term == "efficiency").formula
    assert with_load.max_rate_per_replica < without.max_rate_per_replica  # the measured batch cost, not a placeholder


def test_load_points_give_the_decode_step_less_the_prefills_other_requests_shared_it_with():
    """Closed loop at C: the measured inter-token latency holds the prefills of the C - 1 other users (each
    replaced about once per request); the calibrated step takes them out at the prefill rate measured at
    concurrency 1 (its time to first token), and the closed-loop model adds them back once."""
    m = MODELS["qwen2.5-coder-0.5b"]
    ttft1, out = 0.5, 48

    def rec(c, itl, request_s=1.0):
        r = _load_record(c, itl, run_id=f"C{c}")
        r["config"]["profile"] = {"kind": "concurrent", "streams": c}
        r["config"]["workload"]["requested_output_tokens_total"] = 8 * out
        r["metrics"]["load"].update(ttft_s_p50=ttft1 if c == 1 else 2.0, request_s=request_s)
        return r

    cal = calibrate([rec(1, 0.02), rec(4, 0.08), rec(8, 0.16)])
    pf = cal.prefill_tflops[("cpu", "int4")]
    assert pf == pytest.approx(counts.prefill_flops(m, 200) / ttft1 / 1e12)
    steps = {b: t for b, t, _ in cal.batch[("cpu", "int4")].points}
    assert steps[1] == pytest.approx(0.02)  # alone: nothing to take out
    for c, itl in ((4, 0.08), (8, 0.16)):
        assert steps[c] == pytest.approx(itl - (c - 1) * ttft1 / (out - 1), rel=1e-6)
    # timed arrivals: a share rate * T_p of the time went to prefills
    r = _load_record(3, 0.1, run_id="P")
    r["metrics"]["load"]["request_s"] = 0.4
    cal2 = calibrate([rec(1, 0.02), rec(8, 0.16), r])
    assert {round(b): t for b, t, _ in cal2.batch[("cpu", "int4")].points}[3] == pytest.approx(0.1 * (1 - 0.4 * ttft1))


def test_a_line_that_does_not_rise_passes_through_the_batch_1_point_at_the_batched_rate():
    """The fresh-clone CI run of 2026-12-07 (tests/test_planner_selfcheck.py, twice): at C=8 the other users'
    prefills taken out (7 x 0.276 s / 47 tokens = 41 ms) were most of the 49.8 ms measured, the steps left read
    13.6 / 17.0 / 10.0 ms at batch 1 / 3.9 / 7.7, the least-squares line fell, and the plan fell back to the CPU
    family's default (61.6 ms a token at C=1 against 13.6 measured). A step never costs less at a larger batch:
    the line passes through the batch-1 point (nothing taken out of it) and rises at the points' batched rate."""
    from engine.planner.selfcheck import check_load

    out, prompt = 48, 128
    measured = {1: (1.0, 0.0136, 0.276, 48.4), 4: (3.9, 0.0346, 0.344, 91.7), 8: (7.7, 0.0498, 0.436, 115.3)}

    def rec(c):
        batch, itl, ttft, tok_s = measured[c]
        r = _load_record(batch, itl, run_id=f"C{c}")
        r["config"]["profile"] = {"kind": "concurrent", "streams": c}
        r["config"]["workload"].update(prompt_tokens_total=8 * prompt, requested_output_tokens_total=8 * out)
        r["metrics"]["load"].update(ttft_s_p50=ttft, output_tok_s=tok_s, completed=8, request_s=tok_s / out)
        return r

    recs = [rec(c) for c in measured]
    bf = calibrate(recs).batch[("cpu", "int4")]
    steps = [t for _, t, _ in bf.points]
    assert steps[0] == pytest.approx(0.0136) and steps[2] < steps[0]  # what the subtraction left
    assert bf.anchored and bf.line is not None and "did not rise" in bf.words()
    assert bf.step_s(1.0) == pytest.approx(0.0136)
    assert bf.slope_s == pytest.approx(bf.flops_per_token / (bf.decode_tflops * 1e12))
    rows = check_load(recs, probe={"mem_bw_gbs": 20}, held_out=False)
    assert [round(r["output_tok_s_error_pct"]) for r in rows] == [6, 8, 2]   # -69 / -49 / -36 before
    # a line that rises is left as least squares gave it
    rising = [rec(1), rec(4), rec(8)]
    rising[2]["metrics"]["load"]["itl_s_p50"] = 0.0598  # this host's C=8 the same day
    assert not calibrate(rising).batch[("cpu", "int4")].anchored


def test_a_consumer_card_is_planned_only_when_named():
    """The RTX 4090 (in the catalog for the published rows measured on it) is never among "every GPU": its
    drivers are not licensed for data-center use; named, it is planned like any other."""
    gpus = load_gpus()
    assert gpus["RTX 4090"].kind == "consumer"
    w = Workload("llama-3.1-8b", 5, 1024, 256, ttft_p90_s=1, tpot_p90_s=0.05, spec="off")
    every = plan(w, models=MODELS)
    assert every.plans and all(p.gpu != "RTX 4090" for p in every.plans)
    named = plan(Workload("llama-3.1-8b", 5, 1024, 256, ttft_p90_s=1, tpot_p90_s=0.05, spec="off",
                          gpus=["RTX 4090"]), models=MODELS)
    assert named.plans and all(p.gpu == "RTX 4090" for p in named.plans)
