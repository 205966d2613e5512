"""A day of traffic: hourly profiles, and the fleet sized for the peak against an autoscaled one."""
import math

import pytest

from engine import planner
from engine.common.formulas import HOURS_PER_MONTH
from engine.planner import traffic
from engine.planner.errors import PlanError


def test_named_shapes_peak_where_they_say():
    d = traffic.shape("diurnal", 100, 4)
    assert max(d) == pytest.approx(100) and d.index(max(d)) == 16
    assert min(d) == pytest.approx(25) and d.index(min(d)) == 4
    b = traffic.shape("business-hours", 10)
    assert b[9] == b[17] == 10 and b[8] == b[18] == 1
    assert traffic.shape("flat", 3) == [3.0] * 24
    assert max(traffic.shape("bursty", 50)) == 50


def test_autoscaled_fleet_uses_fewer_gpu_hours_and_meets_the_slo_outside_scale_ups():
    """A diurnal day, 4:1, peak 100 req/s, 12 req/s per replica of 2 GPUs: the peak-sized fleet keeps
    ceil(100/12) = 9 replicas all day; the autoscaled one follows the hour's need, so it uses fewer GPU-hours,
    and the only hours short of capacity are those where it grows, for the scale-up delay."""
    rates = traffic.shape("diurnal", 100, 4)
    day = traffic.fleet_day(rates, 12.0, 2, 3.0, traffic.Autoscale(1, None, 7))
    need = [math.ceil(r / 12.0) for r in rates]
    assert day.peak_replicas == 9 and day.auto_replicas == need
    assert day.peak_gpu_hours == 9 * 2 * 24 and day.auto_gpu_hours == sum(need) * 2
    assert day.auto_gpu_hours < day.peak_gpu_hours
    assert day.peak_usd_per_month == pytest.approx(9 * 2 * 24 * 3.0 * HOURS_PER_MONTH / 24)
    grows = [h for h in range(24) if need[h] > need[h - 1]]
    assert day.missed_hours == grows and all(day.missed_minutes[h] == 7 for h in grows)
    for h in range(24):  # outside those hours the replicas up carry the hour's rate
        if h not in grows:
            assert rates[h] <= day.auto_replicas[h] * 12.0 and day.missed_minutes[h] == 0


def test_a_ceiling_below_the_peak_misses_the_slo_all_hour():
    rates = traffic.shape("business-hours", 60)
    day = traffic.fleet_day(rates, 10.0, 1, 1.0, traffic.Autoscale(1, 4, 5))
    assert max(day.auto_replicas) == 4 and all(day.missed_minutes[h] == 60 for h in range(9, 18))
    assert any("stops at 4" in n for n in day.notes)


def test_fleet_for_a_plan_uses_its_capacity_tp_and_price():
    w = planner.Workload(model="llama-3.1-8b", request_rate=200, input_tokens=512, output_tokens=256, gpus=["H200"])
    best = planner.plan(w).best
    day = traffic.day_for_plan(best, traffic.shape("diurnal", 200, 4))
    assert day.capacity_per_replica == best.max_rate_per_replica and day.gpus_per_replica == best.tp
    assert day.peak_replicas == math.ceil(200 / best.max_rate_per_replica)
    assert day.usd_per_gpu_hr == pytest.approx(best.usd_per_hr / best.gpus_total)


CSV = "hour,rate\n" + "".join(f"{h},{1 + h}\n" for h in range(24))


def test_csv_profile_and_its_errors_name_the_row():
    assert traffic.from_csv(CSV.encode()) == [float(1 + h) for h in range(24)]
    for data, where, words in [
        ("when,how\n0,1\n", "profile", "header hour,rate"),
        (CSV.replace("5,6\n", "5,-6\n"), "profile row 7", ">= 0"),
        (CSV.replace("5,6\n", "5,nan\n"), "profile row 7", "finite"),
        (CSV.replace("5,6\n", "5,lots\n"), "profile row 7", "not an hour"),
        (CSV.replace("5,6\n", "25,6\n"), "profile row 7", "not 0-23"),
        (CSV.replace("5,6\n", ""), "profile", "hours 5 have no rate"),
        (CSV.replace("5,6\n", "5,6\n5,7\n"), "profile row 8", "appears twice"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "profile", "not"),
        ("", "profile", "empty"),
    ]:
        with pytest.raises(PlanError) as e:
            traffic.from_csv(data)
        (field, msg), = e.value.problems
        assert field == where and words in msg, (field, msg)
    with pytest.raises(PlanError, match="24 hourly rates"):
        traffic.check_profile([1.0] * 23)
    with pytest.raises(PlanError, match="unknown traffic shape"):
        traffic.shape("weekly", 1)
    with pytest.raises(PlanError):
        traffic.Autoscale(3, 2).validate()


def test_plan_cli_compares_the_peak_and_the_autoscaled_fleet(tmp_path, capsys):
    import json

    from engine.present.plan_cli import main

    args = ["plan", "--model", "llama-3.1-8b", "--rate", "200", "--traffic", "diurnal", "--gpus", "H200", "--no-store"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "a day of diurnal traffic (peak 200 req/s, lowest 50)" in out and "sized for the peak:" in out
    assert "autoscaled (min 1, max none, 5 min to scale up)" in out and "saving $" in out
    assert main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)["day"]
    assert d["auto_gpu_hours"] < d["peak_gpu_hours"] and len(d["rows"]) == 24
    bad = tmp_path / "day.csv"
    bad.write_text(CSV.replace("5,6\n", "5,-6\n"))
    assert main(["plan", "--model", "llama-3.1-8b", "--traffic-csv", str(bad), "--no-store"]) == 2
    assert "profile row 7" in capsys.readouterr().err


def _opt(label, cap, tp=1, price=2.0, loaded=None):
    from engine.planner.day_policy import Option

    return Option(label, tp, cap, price, loaded or label)


def _plans(model, gpu, peak):
    from engine.planner.savings import plan_with_savings

    w = planner.Workload(model=model, request_rate=peak, input_tokens=1024, output_tokens=256, gpus=[gpu])
    res, sv = plan_with_savings(w, planner.load_gpus(), planner.shapes.load_models())
    return res, sv


def test_day_policy_switches_where_rounding_pays_and_counts_the_switch():
    """Three configurations by hand: A carries 10 req/s per 1-GPU replica at $2/GPU-hour, B 25 req/s per 4-GPU
    replica at $1.5, C 100 req/s per 8-GPU replica at $1.2. At 8 req/s A costs $2 an hour (B $6, C $9.60); at
    100 req/s C costs $9.60 (A $20, B $24). A switch bills the previous hour's fleet for the 6 minutes the new
    one loads."""
    from engine.planner import day_policy as dp

    rates = [8.0] * 12 + [100.0] * 12
    opts = [_opt("A", 10.0), _opt("B", 25.0, 4, 1.5), _opt("C", 100.0, 8, 1.2)]

    class P:  # the fields of a Plan that options() reads
        def __init__(self, o):
            self.feasible, self.max_rate_per_replica, self.label, self.tp = True, o.capacity, o.label, o.tp
            self.gpus_total, self.usd_per_hr, self.config, self.precision = o.tp, o.usd_per_gpu_hr * o.tp, "", o.label

    pol = dp.day_policy([P(o) for o in opts], rates, traffic.Autoscale(1, None, 6), "G")
    assert pol.hours == ["A"] * 12 + ["C"] * 12
    # into C at hour 12: A's fleet of hour 11 (1 replica, $2/hour) for 6 min; back to A at hour 0: C's for 6 min
    assert [(s["hour"], s["from"], s["to"]) for s in pol.switches] == [(0, "C", "A"), (12, "A", "C")]
    assert pol.switch_usd_per_day == pytest.approx(2.0 * 0.1 + 9.6 * 0.1)
    assert pol.usd_per_day == pytest.approx(12 * 2.0 + 12 * 9.6 + 0.2 + 0.96)
    assert pol.single["plan"] == "C" and pol.single_usd_per_day == pytest.approx(24 * 9.6)
    assert pol.saving_usd_per_day == pytest.approx(24 * 9.6 - pol.usd_per_day)
    # the SLO: hour 12 grows from A's 10 req/s to 100 while C loads, so those 6 minutes are short
    assert pol.missed_minutes[12] == 6.0 and sum(pol.missed_minutes) == 6.0
    # one configuration is one of the policies weighed: alone, it costs its autoscaled day
    one = dp.day_policy([P(opts[1])], rates, traffic.Autoscale(1, None, 6), "G")
    assert one.usd_per_day == pytest.approx(one.single_usd_per_day) and not one.switches
    assert "saves nothing here" in one.headline


@pytest.mark.parametrize("model,gpu,peak", [("llama-3.1-70b", "A100 80GB", 10.0), ("llama-3.1-8b", "L4", 10.0)])
def test_day_policy_is_never_dearer_than_the_best_single_configuration(model, gpu, peak):
    from engine.planner.day_policy import plan_day

    res, sv = _plans(model, gpu, peak)
    for name in ("diurnal", "business-hours", "bursty"):
        fleet, pol = plan_day(res, sv.best, traffic.shape(name, peak, 4), traffic.Autoscale())
        assert pol.usd_per_day <= pol.single_usd_per_day + 1e-9
        # the best single configuration is at most the waterfall's best plan's own autoscaled day
        assert pol.single_usd_per_day <= fleet.auto_usd_per_month * 24 / HOURS_PER_MONTH + 1e-9
    if model == "llama-3.1-70b":  # the 70B on A100s: changing by the hour pays on the diurnal day, and says so
        _, pol = plan_day(res, sv.best, traffic.shape("diurnal", peak, 4), traffic.Autoscale())
        assert pol.saving_usd_per_day > 0 and pol.switches
        assert f"({100 * pol.saving_usd_per_day / pol.single_usd_per_day:.1f}%) less" in pol.headline
