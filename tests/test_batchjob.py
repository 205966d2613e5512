"""Batch jobs: N output tokens a day within a deadline, no latency SLO, the most tokens per dollar."""
import math

import pytest

from engine import planner
from engine.planner import batchjob, shapes
from engine.planner.errors import PlanError
from engine.planner.roofline import Deployment, decode_step, prefill_step


@pytest.fixture(scope="module")
def catalog():
    return planner.load_gpus(), shapes.load_models()


def test_tokens_per_dollar_follow_the_formula(catalog):
    """One configuration by hand: c users in a closed loop give c*O / (c*T_prefill + O*T_step(c)) tokens/s;
    tokens per $ = that x 3600 / (TP x $/GPU-hour); replicas = ceil(N / (tok/s x D x 3600))."""
    gpus, models = catalog
    job = batchjob.BatchJob("llama-3.1-8b", 5e8, 512, 256, 6.0, gpus=["L40S"], precisions=["int4"], tp_options=(1,))
    bp = batchjob.plan_batch(job, gpus, models)
    g, m = gpus["L40S"], models["llama-3.1-8b"]
    dep = Deployment(m, g, "int4", 1, max_batch=256)
    for o in bp.options:
        c = o.batch
        thr = c * 256 / (c * prefill_step(dep, 512).total + 256 * decode_step(dep, c, 512 + 128).total)
        assert o.output_tok_s == pytest.approx(thr, rel=1e-9)
        assert o.tok_per_usd == pytest.approx(thr * 3600 / g.price_usd_per_hr, rel=1e-9)
        assert o.replicas == math.ceil(5e8 / (thr * 6 * 3600))
        assert o.usd_per_day == pytest.approx(o.replicas * g.price_usd_per_hr * 6)
        assert o.usd_per_1m_output == pytest.approx(o.usd_per_day / 5e8 * 1e6)
    assert bp.best.usd_per_day == min(o.usd_per_day for o in bp.options)
    assert bp.best.batch > 1  # batching is what a job without a latency SLO buys


def test_cheaper_gpus_and_precisions_compete(catalog):
    gpus, models = catalog
    bp = batchjob.plan_batch(batchjob.BatchJob("llama-3.1-8b", 1e9, deadline_hours=8), gpus, models)
    assert len({o.gpu for o in bp.options}) >= 4 and len({o.precision for o in bp.options}) >= 3
    assert bp.best.tok_per_usd >= 0.9 * max(o.tok_per_usd for o in bp.options)


def test_impossible_deadlines_and_bad_input_are_refused_by_name(catalog):
    gpus, models = catalog
    with pytest.raises(PlanError, match="no configuration finishes one request within"):
        batchjob.plan_batch(batchjob.BatchJob("llama-3.1-70b", 1e6, 512, 100_000, 0.01, gpus=["L4"]), gpus, models)
    with pytest.raises(PlanError) as e:
        batchjob.plan_batch(batchjob.BatchJob("nope", -5, deadline_hours=30), gpus, models)
    fields = {f for f, _ in e.value.problems}
    assert fields == {"model", "tokens_per_day", "deadline_hours"}


def test_plan_cli_batch_job(capsys):
    from engine.present.plan_cli import main

    assert main(["plan", "batch-job", "1e9", "--model", "llama-3.1-8b", "--deadline", "8", "--no-store"]) == 0
    out = capsys.readouterr().out
    assert "a batch job of 1,000,000,000 output tokens a day" in out and "the answer:" in out
    assert "tokens per $" in out
