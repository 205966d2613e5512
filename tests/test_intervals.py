"""Repetitions, intervals and the noise rule, on constructed samples (no model): each checks a definition."""
import csv
import io
import json

import pytest

from engine import present
from engine.common.errors import UserError
from engine.measure import noise, stats
from engine.measure.records import RunRecord
from engine.measure.summary import acceptance, aggregate, speed


def smp(rep, pid, tok_s, cat="code", ttft=0.5, lat=None, **spec):
    return {"rep": rep, "category": cat, "prompt_id": pid, "prompt_tokens": 100, "new_tokens": 16, "ttft_s": ttft,
            "decode_s": 15 / tok_s, "decode_tok_s": tok_s, "token_latency_ms": lat or 1000 / tok_s, **spec}


# ---------------------------------------------------------------- stats

def test_bootstrap_is_deterministic_and_needs_two_groups():
    groups = [1.0, 2.0, 3.0, 4.0, 10.0]
    a = stats.bootstrap(groups, stats.mean)
    assert a == stats.bootstrap(groups, stats.mean)  # fixed seed
    assert a[0] < stats.mean(groups) < a[1]
    assert stats.bootstrap([5.0], stats.mean) is None
    assert stats.bootstrap([], stats.mean) is None


def test_stratified_bootstrap_keeps_the_mix():
    # one 'b' prompt among three 'a': drawing within categories always holds exactly one 'b'
    groups, strata = [0.0, 0.0, 0.0, 10.0], ["a", "a", "a", "b"]
    assert stats.bootstrap(groups, stats.mean, strata) == (2.5, 2.5)
    lo, hi = stats.bootstrap(groups, stats.mean)
    assert lo < 2.5 < hi  # without strata the mix itself varies


def test_half_width_is_the_larger_side():
    assert stats.half_width(10.0, 9.0, 12.0) == 2.0
    assert stats.relative_half_width(10.0, 9.0, 12.0) == pytest.approx(0.2)
    assert stats.half_width(10.0, None, 12.0) is None


# ---------------------------------------------------------------- speed: intervals over repetitions

def test_repetition_interval_measures_drift_between_passes():
    steady = [smp(r, p, 10.0 + 0.1 * p) for r in range(3) for p in range(4)]
    v, iv = speed(steady)
    assert iv["decode_tok_s"]["lo"] == iv["decode_tok_s"]["hi"]  # the same pass three times: no machine noise
    assert iv["decode_tok_s"]["over"] == "repetitions" and iv["decode_tok_s"]["n"] == 3
    slowed = [smp(r, p, (5.0 if r == 1 else 10.0) + 0.1 * p) for r in range(3) for p in range(4)]
    v, iv = speed(slowed)
    assert iv["decode_tok_s"]["lo"] < 6 and iv["decode_tok_s"]["hi"] > 10  # one slow pass widens it


def test_fewer_than_five_repetitions_give_a_range_labelled_as_one():
    """Below stats.MIN_INTERVAL_REPS the ± is the lowest and highest repetition's own median, kind "range",
    and the tables' 'speed ±' column says so; from 5 on it is a bootstrap interval."""
    from engine.present.columns import BY_NAME

    class Rec:
        def __init__(self, ivs):
            self.metrics = {"intervals": ivs}

    few = [smp(r, p, 10.0 + r + 0.01 * p) for r in range(3) for p in range(4)]
    _, iv = speed(few)
    t = iv["decode_tok_s"]
    assert t["kind"] == "range" and t["n"] == 3
    assert t["lo"] == pytest.approx(10.015) and t["hi"] == pytest.approx(12.015)  # the passes' own medians
    assert BY_NAME["spread"].value(Rec(iv)) == "range of 3 reps"
    many = [smp(r, p, 10.0 + r + 0.01 * p) for r in range(stats.MIN_INTERVAL_REPS) for p in range(4)]
    _, iv = speed(many)
    assert iv["decode_tok_s"]["kind"] == "interval"
    assert BY_NAME["spread"].value(Rec(iv)) == f"95% interval, {stats.MIN_INTERVAL_REPS} reps"
    old = {"decode_tok_s": {"lo": 9.0, "hi": 11.0, "over": "repetitions", "n": 3}}  # stored before ranges
    assert BY_NAME["spread"].value(Rec(old)) == "bootstrap of 3 reps (about their range)"


def test_paired_speedup_cancels_drift_that_hits_both():
    # repetition 1 ran on a busy machine: both the speculative and the plain runs are half as fast
    spec = [smp(r, p, 20.0 * (0.5 if r == 1 else 1.0)) for r in range(3) for p in range(3)]
    base = [smp(r, p, 10.0 * (0.5 if r == 1 else 1.0)) for r in range(3) for p in range(3)]
    v, iv = speed(spec, base)
    assert v["spec.speedup"] == pytest.approx(2.0)
    assert iv["spec.speedup"]["lo"] == pytest.approx(2.0) and iv["spec.speedup"]["hi"] == pytest.approx(2.0)
    assert iv["decode_tok_s"]["hi"] / iv["decode_tok_s"]["lo"] >= 2  # each alone is wide


# ---------------------------------------------------------------- acceptance: intervals over prompts

def test_token_and_request_weighted_acceptance():
    # a long completion that accepts a lot and a short one that accepts little (vLLM issue #42690)
    s = [smp(r, "long", 10, drafted=100, accepted=90, rounds=25, emitted=115) for r in range(2)]
    s += [smp(r, "short", 10, drafted=10, accepted=1, rounds=3, emitted=4) for r in range(2)]
    v, iv = acceptance(s)
    assert v["spec.acceptance_rate"] == pytest.approx(91 / 110)  # token-weighted
    assert v["spec.acceptance_rate_request_mean"] == pytest.approx((0.9 + 0.1) / 2)
    assert v["spec.mean_acceptance_length"] == pytest.approx(119 / 28)
    assert v["spec.mean_acceptance_length_request_mean"] == pytest.approx((115 / 25 + 4 / 3) / 2)
    assert v["spec.prompts"] == 2 and v["spec.drafted"] == 220  # counters summed over repetitions
    assert iv["spec.acceptance_rate"]["over"] == "prompts" and iv["spec.acceptance_rate"]["n"] == 2
    one = acceptance([x for x in s if x["rep"] == 0])[0]
    assert one["spec.acceptance_rate"] == v["spec.acceptance_rate"]  # greedy repetitions change no ratio


def test_aggregate_by_category_and_medians():
    gens = [{"ttft_s": t, "decode_tok_s": 10.0, "prompt_tokens": 100, "new_tokens": 16, "kv_bytes": k,
             "weight_bytes": 1, "spec": None} for t, k in ((0.1, 5), (0.3, 9), (0.2, 7))]
    samples = [smp(0, "a", 10.0, "chat"), smp(0, "b", 12.0, "code"), smp(0, "c", 14.0, "code")]
    m = aggregate(gens, samples)
    assert m["ttft_s"] == pytest.approx(0.2) and m["kv_bytes"] == 9 and m["prompt_tokens"] == 100
    assert set(m["by_category"]) == {"chat", "code"}
    assert m["by_category"]["code"]["decode_tok_s"] == 13.0 and m["by_category"]["code"]["prompts"] == 2
    assert m["samples"] == samples and m["intervals"] == {}  # one repetition: no interval


# ---------------------------------------------------------------- the noise rule

def _state(t, some_us, probe=20.0, load=0.5):
    return {"t": t, "cpu_some_us": some_us, "probe_gbs": probe, "loadavg": load}


def _metrics(lo=9.8, hi=10.2):
    return {"decode_tok_s": 10.0, "token_latency_ms_median": 100.0,
            "intervals": {"decode_tok_s": {"lo": lo, "hi": hi}, "token_latency_ms_median": {"lo": 99.0, "hi": 101.0}}}


def test_quiet_run_is_not_noisy():
    v = noise.verdict(_state(0, 0), _state(10, 200_000), _metrics(), cores=2)
    assert not v["noisy"] and v["reasons"] == [] and v["cpu_pressure_share"] == pytest.approx(0.02)


@pytest.mark.parametrize("before,after,metrics,word", [
    (_state(0, 0), _state(10, 9_000_000), _metrics(), "CPU pressure"),
    (_state(0, 0), _state(10, 0, probe=15.0), _metrics(), "bandwidth probe dropped"),
    (_state(0, 0), _state(10, 0), _metrics(8.5, 10.5), "decode tok/s interval ±15%"),
    ({"t": 0, "cpu_some_us": None, "loadavg": 1.0}, {"t": 10, "cpu_some_us": None, "loadavg": 3.5}, _metrics(),
     "load average 3.50 above 2 cores"),
])
def test_each_rule_flags_with_its_reason(before, after, metrics, word):
    v = noise.verdict(before, after, metrics, cores=2)
    assert v["noisy"] and len(v["reasons"]) == 1 and word in v["reasons"][0], v["reasons"]


def test_the_probe_is_judged_within_the_run():
    """A probe low at both ends is the machine's own level (a quiet VM probes 34-83 GB/s from one
    process to the next); a drop between the two ends is something that started meanwhile."""
    steady = noise.verdict(_state(0, 0, probe=40.0), _state(10, 0, probe=38.0), _metrics(), cores=2)
    assert not steady["noisy"] and steady["probe_drop"] == pytest.approx(0.05)
    rose = noise.verdict(_state(0, 0, probe=50.0), _state(10, 0, probe=80.0), _metrics(), cores=2)
    assert not rose["noisy"] and rose["probe_drop"] == pytest.approx(-0.6)
    v = noise.verdict(_state(0, 0, probe=80.0), _state(10, 0, probe=50.0), _metrics(), cores=2)
    assert v["noisy"] and v["reasons"] == ["bandwidth probe dropped 38% during the run, 80.0 -> 50.0 GB/s (limit 15%)"]


def test_both_probes_read_the_same_buffer():
    noise.before("cpu")
    buf = noise._buffer.get("cpu")
    assert buf is not None and buf.numel() * 4 == noise.PROBE_MB << 20
    noise.after("cpu")
    assert "cpu" not in noise._buffer  # released after the run


def test_one_repetition_is_judged_without_an_interval():
    m = {"decode_tok_s": 10.0, "intervals": {}}
    v = noise.verdict(_state(0, 0), _state(10, 0), m, cores=2)
    assert not v["noisy"] and not v["interval_checked"]


# ---------------------------------------------------------------- tables and charts show the interval

def _rec(tok_s=10.0, lo=9.0, hi=12.0, noisy=False, label_model="m"):
    m = {"decode_tok_s": tok_s, "ttft_s": 0.5, "token_latency_ms_median": 100.0, "weight_bytes": 1e9,
         "intervals": {"decode_tok_s": {"lo": lo, "hi": hi, "over": "repetitions", "n": 3},
                       "ttft_s": {"lo": 0.4, "hi": 0.55, "over": "repetitions", "n": 3}},
         "noise": noise.verdict(_state(0, 0), _state(10, 9_000_000 if noisy else 0), _metrics(), 2),
         "workload": {"name": "code:8", "reps": 3, "prompts": 8, "skipped": 1}}
    return RunRecord(kind="bench", config={"model": label_model, "precision": "int4", "workload": "code:8"},
                     metrics=m, machine={})


def test_rows_carry_bounds_and_tables_show_plus_minus():
    r = present.row(_rec(), 0.36)
    assert (r["tok_s"], r["tok_s_lo"], r["tok_s_hi"]) == (10.0, 9.0, 12.0)
    assert (r["ttft_ms"], r["ttft_ms_lo"], r["ttft_ms_hi"]) == (500.0, 400.0, 550.0)
    # cost falls as speed rises: its interval is the speed interval's ends, swapped
    assert r["usd_per_1m_out_lo"] == pytest.approx(0.36 / (12 * 3600) * 1e6, rel=1e-3)
    assert r["usd_per_1m_out_hi"] == pytest.approx(0.36 / (9 * 3600) * 1e6, rel=1e-3)
    assert r["workload"] == "code:8 ×3 (1 skipped)" and r["noise"] == "quiet"
    names = present.view_columns([r], "cli")
    md = present.format_rows(present.display_rows([r], names), "md", names)
    assert "10.0 ± 2.0" in md and "500.0 ± 100.0" in md
    csv_text = present.format_rows([r], "csv", present.with_bounds(names, [r]))
    head = next(csv.reader(io.StringIO(csv_text)))
    assert head[head.index("tok_s") + 1:head.index("tok_s") + 3] == ["tok_s_lo", "tok_s_hi"]
    assert present.with_half_widths([r])[0]["tok_s_pm"] == 2.0


def test_bar_figure_draws_the_interval_and_marks_noise():
    rows = present.comparison_rows([_rec(), _rec(8.0, 4.0, 9.0, noisy=True, label_model="n")], 1.0)
    fig = present.bar_figure(rows, "tok_s", "Decode throughput", "tokens/s", "higher")
    err = fig.data[0].error_y
    assert list(err.array) == [2.0, 1.0] and list(err.arrayminus) == [1.0, 4.0]
    assert fig.data[0].text[1].startswith("⚠") and not fig.data[0].text[0].startswith("⚠")
    assert rows[1]["noise"].startswith("⚠ noisy") and "CPU waits" in rows[1]["noise"]


def test_highlights_say_when_noise_flags_differ():
    rows = present.comparison_rows([_rec(), _rec(8.0, 4.0, 9.0, noisy=True, label_model="n")], 1.0)
    hl = present.highlights(rows)
    assert any("different noise flags" in h and "n@int4 noisy" in h for h in hl), hl
    assert any("Fastest decode: m@int4 at 10 ± 2 tokens/s" in h and "overlaps n@int4" in h for h in hl), hl
    assert any("one stream at the measured batch size" in h for h in hl)
    assert present.noise_note(present.comparison_rows([_rec(), _rec(label_model="n")], 1.0)) is None


def test_category_rows_read_each_category():
    rec = _rec()
    rec.metrics["by_category"] = {"code": {"decode_tok_s": 11.0, "prompts": 5, "spec": {"acceptance_rate": 0.4}},
                                  "edit": {"decode_tok_s": 9.0, "prompts": 3, "spec": {"acceptance_rate": 0.8}}}
    rows = present.category_rows([rec])
    assert [(r["category"], r["tok_s"], r["accept_rate"], r["prompts"]) for r in rows] == [
        ("code", 11.0, 0.4, 5), ("edit", 9.0, 0.8, 3), ("all", 10.0, None, 8)]


# ---------------------------------------------------------------- the record validates its new fields

def test_record_with_samples_round_trips_and_bad_samples_are_refused():
    rec = _rec()
    rec.metrics["samples"] = [smp(0, "humaneval:HumanEval/0", 10.0)]
    back = RunRecord.from_json(rec.to_json())
    assert back.metrics["samples"][0]["prompt_id"] == "humaneval:HumanEval/0"
    d = json.loads(rec.to_json())
    d["metrics"]["samples"][0]["prompt_id"] = 7
    with pytest.raises(UserError, match="metrics.samples.0.prompt_id"):
        RunRecord.from_dict(d)
    d = json.loads(rec.to_json())
    d["metrics"]["intervals"]["decode_tok_s"]["lo"] = "low"
    with pytest.raises(UserError, match="intervals.decode_tok_s.lo"):
        RunRecord.from_dict(d)
    d = json.loads(rec.to_json())
    d["metrics"]["noise"]["noisy"] = "yes"
    with pytest.raises(UserError, match="noise.noisy"):
        RunRecord.from_dict(d)


def test_one_prompt_per_category_gives_no_prompt_interval():
    # nothing can vary when every category holds one prompt: no interval rather than a false ± 0
    assert stats.bootstrap([0.2, 0.6], stats.mean, ["code", "chat"]) is None
    s = [smp(0, "a", 10, "code", drafted=10, accepted=5, rounds=3, emitted=8),
         smp(0, "b", 10, "chat", drafted=10, accepted=1, rounds=3, emitted=4)]
    assert "spec.acceptance_rate" not in {k for k, v in acceptance(s)[1].items() if v}
