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
