"""A fleet of models: several models share a GPU where memory allows, against one model per GPU."""
import pytest

from engine import planner
from engine.planner import fleet, shapes
from engine.planner import counts
from engine.planner.errors import PlanError
from engine.planner.roofline import GIB, activation_reserve

FLEET = [fleet.FleetModel("llama-3.1-8b", 1.0), fleet.FleetModel("qwen2.5-7b", 0.5),
         fleet.FleetModel("mistral-7b", 0.5)]


@pytest.fixture(scope="module")
def catalog():
    return planner.load_gpus(), shapes.load_models()


def test_three_quantized_models_share_one_gpu_where_bf16_needs_two(catalog):
    """On an L40S (48 GB): at int4 the three 7-8B models fit on one GPU, against three with one model per GPU;
    at bf16 they need two. The memory check by hand: weights + activation reserve + KV at each replica's peak
    concurrency, summed per GPU, within 90% of the GPU's memory."""
    gpus, models = catalog
    fp = fleet.plan_fleet(FLEET, "L40S", gpus, models)
    by = {o.precision: o for o in fp.options}
    assert by["int4"].gpus_separate == 3 and by["int4"].gpus_packed == 1
    assert by["bf16"].gpus_packed == 2
    usable = 48 * 0.9
    for prec in ("int4", "bf16"):
        for b in by[prec].bins:
            total = 0.0
            for r in b:
                m = models[r.model]
                fm = next(f for f in FLEET if f.model == r.model)
                kv = counts.kv_cache_bytes(m, fm.input_tokens + fm.output_tokens, "bf16") * r.peak_concurrency
                mem = (counts.weight_bytes(m, prec) + activation_reserve(m, 1) + kv) / GIB
                assert r.memory_gib == pytest.approx(mem, rel=1e-9)
                total += mem
            assert total <= usable and sum(r.share for r in b) <= 1
    bf16 = sorted(r.memory_gib for b in by["bf16"].bins for r in b)
    assert sum(bf16) > usable  # why bf16 cannot share one GPU: memory
    assert by["int4"].usd_per_month_packed * 3 == pytest.approx(by["int4"].usd_per_month_separate)


def test_busy_models_take_their_own_replicas_and_time_shares_add(catalog):
    gpus, models = catalog
    busy = [fleet.FleetModel("llama-3.1-8b", 40.0), fleet.FleetModel("qwen2.5-7b", 0.2)]
    fp = fleet.plan_fleet(busy, "L4", gpus, models, ["int4"])
    o = fp.best
    llama = [r for b in o.bins for r in b if r.model == "llama-3.1-8b"]
    assert len(llama) > 1 and all(r.share <= 1 for r in llama)
    assert all(sum(r.share for r in b) <= 1 for b in o.bins)


def test_a_model_that_fits_no_gpu_is_named(catalog):
    gpus, models = catalog
    with pytest.raises(PlanError, match="llama-3.1-70b does not fit on one L4"):
        fleet.plan_fleet([fleet.FleetModel("llama-3.1-70b", 1.0), *FLEET], "L4", gpus, models)
    with pytest.raises(PlanError) as e:
        fleet.plan_fleet([fleet.FleetModel("nope", -1)], "L4", gpus, models)
    assert {f for f, _ in e.value.problems} == {"fleet[0].model", "fleet[0].request_rate"}


def test_plan_cli_fleet(capsys):
    from engine.present.plan_cli import main

    args = ["plan", "--gpus", "L40S", "fleet", "llama-3.1-8b:1,qwen2.5-7b:0.5,mistral-7b:0.5", "--no-store"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1 GPU(s) shared against 3 with one model per GPU" in out
    assert main(["plan", "fleet", "llama-3.1-8b:fast", "--gpus", "L40S", "--no-store"]) == 2
    assert "is not model:rate" in capsys.readouterr().err
