"""$/1M at the SLO and the crossover, on hand-made `load` records whose answers are known."""
import json

import pytest

from engine.common.errors import UserError
from engine.common.formulas import usd_per_million_tokens
from engine.measure.records import RunRecord
from engine.present import load_cost as L
from engine.present import load_view as V

SLO = {"ttft": 2.0, "itl": 0.2, "e2e": None, "attainment": 0.9, "label": "ttft<=2s,itl<=0.2s"}


def point(label="ours int4", streams=1, met=(100,), missed=(), window=10.0, meets=None, kind="concurrent",
          rate=None, precision="int4", draft=None, model="qwen2.5-coder-0.5b", slo=SLO, samples=True):
    """One load point: `met` / `missed` are the output tokens of requests that met / missed the SLO."""
    ss = [{"ok": True, "met_slo": True, "output_tokens": n} for n in met] + \
         [{"ok": True, "met_slo": False, "output_tokens": n} for n in missed]
    done = len(ss)
    attain = len(met) / done if done else None
    out = sum(met) + sum(missed)
    profile = {"kind": kind, "streams": streams if kind != "constant" else None, "rate": rate,
               "label": f"constant:{rate:g}/s" if kind == "constant" else f"concurrent:{streams}"}
    load = {"requests": done, "completed": done, "failed": 0, "duration_s": window, "output_tok_s": out / window,
            "request_s": done / window, "goodput_req_s": len(met) / window, "slo_attainment": attain,
            "meets_slo": (attain is not None and attain >= 0.9) if meets is None else meets,
            "ttft_s_p90": 0.5 * streams, "itl_s_p90": 0.05 * streams, "itl_s_p50": 0.04 * streams}
    cfg = {"system": "serving-cost-lab", "label": label, "model": model, "precision": precision,
           "draft": {"kind": draft, "gamma": 4} if draft else None, "profile": profile, "slo": slo,
           "workload": {"spec": "chat:8"}}
    return RunRecord(kind="load", config=cfg, metrics={"load": load}, machine={"device": "cpu"},
                     output={"samples": ss} if samples else {})


def curve(label, tok_s_by_load, **kw):
    """A configuration whose every point meets the SLO at the given output tok/s (window 10 s)."""
    return [point(label, n, met=(int(t * 10),), **kw) for n, t in tok_s_by_load.items()]


def test_cost_at_slo_is_goodput_at_the_highest_load_meeting_the_slo():
    recs = [point(streams=1, met=[100]),                          # 10 tok/s, meets
            point(streams=4, met=[100] * 9, missed=[100]),        # 90% met: meets; goodput 90 of 100 tok/s
            point(streams=8, met=[100] * 5, missed=[100] * 5)]    # 50%: misses, though its goodput is higher
    c = L.cost_at_slo(recs, 0.5)
    assert c.feasible and c.point.load == 4 and c.point.profile == "concurrent:4"
    assert c.point.goodput_tok_s == pytest.approx(90.0) and c.point.output_tok_s == pytest.approx(100.0)
    assert c.usd_per_1m_out == pytest.approx(usd_per_million_tokens(90.0, 0.5))
    assert c.single_stream_usd_per_1m_out == pytest.approx(usd_per_million_tokens(10.0, 0.5))
    assert "concurrency 4" in c.answer and c.reason is None
    json.dumps(c.to_dict())  # the page and reports hand it around as plain data


def test_highest_load_wins_even_when_a_lower_one_had_more_goodput():
    recs = [point(streams=2, met=[300] * 10), point(streams=4, met=[100] * 10)]
    c = L.cost_at_slo(recs, 1.0)
    assert c.point.load == 4 and c.point.goodput_tok_s == pytest.approx(100.0)


def test_no_point_meets_the_slo_is_infeasible_not_a_number():
    recs = [point(streams=n, met=[100], missed=[100] * 3) for n in (1, 4, 8)]
    c = L.cost_at_slo(recs, 0.5)
    assert not c.feasible and c.usd_per_1m_out is None and c.point is None
    assert c.answer.startswith(L.INFEASIBLE) and "25%" in c.reason
    assert c.single_stream_usd_per_1m_out is not None  # the one-stream figure is still there, labelled apart
    row = L.cost_rows([c])[0]
    assert row["usd_per_1m_out_at_slo"] is None and row["at"] == L.INFEASIBLE


def test_goodput_without_samples_is_scaled_and_says_so():
    r = point(streams=4, met=[100] * 9, missed=[300], samples=False)
    g, how = L.goodput_tok_s(r)
    assert g == pytest.approx(120.0 * 9 / 10) and "scaled" in how
    assert L.goodput_tok_s(point(streams=4, met=[100] * 9, missed=[300]))[0] == pytest.approx(90.0)


def test_rate_profiles_are_ranked_by_rate():
    recs = [point(kind="constant", rate=r, met=[100] * (10 if r < 2 else 5), missed=[100] * (0 if r < 2 else 5))
            for r in (0.5, 1.5, 3.0)]
    c = L.cost_at_slo(recs, 0.5)
    assert c.axis == "rate" and c.point.load == 1.5


def test_several_configurations_are_priced_one_by_one_and_bad_input_refused():
    recs = curve("ours int4", {1: 10, 4: 30}) + curve("ours int8", {1: 8, 4: 20}, precision="int8")
    assert "2 configurations" in L.cost_at_slo(recs, 0.5).reason
    costs = L.costs_at_slo(recs, 0.5)
    assert [c.configuration for c in costs] == ["ours int4 · qwen2.5-coder-0.5b", "ours int8 · qwen2.5-coder-0.5b"]
    assert costs[0].usd_per_1m_out < costs[1].usd_per_1m_out
    assert L.cost_at_slo([], 0.5).reason == "no load records"
    with pytest.raises(UserError):
        L.cost_at_slo(recs[:2], 0.0)
    # the same server at another SLO is another configuration, named apart
    other = curve("ours int4", {1: 10}, slo={**SLO, "label": "ttft<=1s"})
    assert len(L.configurations(recs + other)) == 3


def test_crossover_is_the_first_load_where_the_candidate_loses_its_lead():
    spec = curve("ours int4 + ngram", {1: 15, 4: 36, 8: 40}, draft="ngram")
    plain = curve("ours int4", {1: 10, 4: 30, 8: 50})
    x = L.crossover(spec, plain, "spec", "plain", kind="speculation")
    assert x.loads == [1, 4, 8] and x.leads == [True, True, False]
    assert x.stops_paying_at == 8 and x.ratios[0] == pytest.approx(1.5)
    assert "up to concurrency 4" in x.verdict and "stops paying at 8" in x.verdict
    always = L.crossover(plain, curve("slow", {1: 5, 4: 6, 8: 7}))
    assert always.stops_paying_at is None and "every measured" in always.verdict
    never = L.crossover(curve("a", {1: 9, 4: 40}), plain)
    assert never.stops_paying_at == 1 and "leads at 4" in never.verdict
    # lower-is-better metrics lead by being smaller; a tie does not lead
    itl = L.crossover(spec, plain, metric="itl_s_p50")
    assert itl.leads == [False, False, False]
    tie = L.crossover(plain, curve("twin", {1: 10}))
    assert tie.stops_paying_at == 1
    assert "common" in L.crossover(plain, curve("c16", {16: 80})).verdict
    with pytest.raises(UserError):
        L.crossover(spec, plain, metric="vibes")


def test_crossover_pairs_spec_and_precision_measured_side_by_side():
    recs = (curve("int4", {1: 10, 8: 50}) + curve("int4 ngram", {1: 14, 8: 40}, draft="ngram")
            + curve("int8", {1: 8, 8: 45}, precision="int8") + curve("bf16", {1: 5, 8: 30}, precision="bf16")
            + curve("int4 tight", {1: 10}, slo={**SLO, "label": "ttft<=1s"}))
    pairs = {(x.kind, x.candidate.split(" · ")[0], x.baseline.split(" · ")[0]): x for x in L.crossover_pairs(recs)}
    assert set(pairs) == {("speculation", "int4 ngram", "int4"), ("precision", "int4", "int8"),
                          ("precision", "int4", "bf16"), ("precision", "int8", "bf16")}
    assert pairs[("speculation", "int4 ngram", "int4")].stops_paying_at == 8
    assert pairs[("precision", "int4", "int8")].stops_paying_at is None


def test_figures_draw_every_configuration():
    recs = curve("int4", {1: 10, 4: 30, 8: 50}) + curve("int4 ngram", {1: 15, 4: 36, 8: 40}, draft="ngram")
    fig = V.throughput_figure(recs)
    assert len(fig.data) == 6 and list(fig.data[0].x) == [1, 4, 8]  # 2 configurations x 3 panels
    # latencies in ms as the table shows them, and every axis from zero (issue 40.6)
    ttft = next(t for t in fig.data if t.xaxis == "x2")
    assert list(ttft.y) == [500.0, 2000.0, 4000.0] and "TTFT p90, ms" in fig.layout.annotations[1].text
    assert all(fig.layout[f"yaxis{i or ''}"].rangemode == "tozero" for i in (0, 2, 3))
    goodput = next(c for c in V.LOAD_COLUMNS if c.name == "goodput_tok_s")
    assert goodput.value(recs[0], None) == pytest.approx(10.0)  # the chart's goodput, in the table too
    labels = V.column_labels(["goodput", "goodput_tok_s", "ttft_p90_ms", "requests"])
    assert labels == {"goodput": "goodput req/s", "goodput_tok_s": "goodput tok/s", "ttft_p90_ms": "TTFT p90 ms",
                      "requests": "requests"}
    assert len(V.goodput_figure(recs).data) == 2
    # the SLO the points were judged against, on the latency panels (issue 40.7)
    assert [(sh.y0, sh.y1) for sh in fig.layout.shapes] == [(2000.0, 2000.0), (200.0, 200.0)]
    tf = V.tradeoff_figure(recs)   # tokens/s per user against the server's: one line per configuration
    assert len(tf.data) == 2 and list(tf.data[0].text) == ["1", "4", "8"]
    assert list(tf.data[0].y) == [10.0, 30.0, 50.0] and list(tf.data[0].x) == [1 / 0.04, 1 / 0.16, 1 / 0.32]
    assert tf.data[0].marker.symbol == "circle" and tf.data[1].marker.symbol == "diamond"
    costs = L.costs_at_slo(recs + [point("hopeless", 1, met=[], missed=[100])], 0.5)
    cf = V.slo_cost_figure(costs)
    assert L.INFEASIBLE in list(cf.data[0].text)
    xf = V.crossover_figure(L.crossover_pairs(recs))
    assert len(xf.data) == 2 and list(xf.data[1].x) == [8]  # the ratio line and the stops-paying marker


def test_a_report_shows_its_load_records_in_their_own_section_escaped():
    from engine.present import reports

    evil = "<script>alert('x')</script>"
    recs = curve(f"ours int4 {evil}", {1: 10, 8: 50}) + curve("ours int4 + ngram", {1: 15, 8: 40}, draft="ngram")
    html = reports.export_html(reports.Report("load report", "", recs, 0.5))
    section = html[html.index('id="under-load"'):html.index("<h3>Definitions</h3>")]
    assert 'id="load-runs"' in section and 'id="load-costs"' in section and "stops paying at 8" in section
    assert section.count('class="plotly-graph-div"') == 4  # latency, goodput, $/1M at the SLO, crossover
    assert evil not in html and "&lt;script&gt;" in section


def with_kv(recs, asked, stored, blocks, gib=0.25, ctx=1024):
    """Our server's KV cache on each record, as the load client keeps its /v1/models account."""
    for r in recs:
        r.config["server"] = {"kv_dtype": asked, "kv_cache_gib": gib, "lab": {
            "kv": {"kv_cache": "paged", "kv_dtype": stored, "num_blocks": blocks, "block_size": 64},
            "settings": {"kv_cache": "paged", "kv_dtype": asked, "kv_cache_gib": gib, "max_model_len": ctx,
                         "max_seqs": 8}}}
    return recs


def test_kv_quantized_and_not_are_two_configurations_priced_side_by_side():
    """int8 KV holds 4x the sequences in the budget and keeps meeting the SLO at concurrency 8, where the
    fp32 cache preempts and misses it: $/1M at the SLO is read at 8 for int8 and at 4 for fp32."""
    q = with_kv(curve("ours int4", {1: 10, 4: 30, 8: 50}), "int8", "int8", 160)
    b = with_kv(curve("ours int4", {1: 10, 4: 28}) + [point("ours int4", 8, met=(100,), missed=(300,))],
                "auto", "fp32", 40)
    bf16 = with_kv(curve("ours bf16", {1: 5, 4: 20, 8: 30}, precision="bf16"), "auto", "bf16", 80)
    names = list(L.configurations(q + b + bf16))
    assert len(names) == 3 and {n.split(" · KV ")[-1] for n in names[:2]} == {"int8 paged 0.25", "auto paged 0.25"}
    assert L.kv_of(q[0])["sequences"] == 10 and L.kv_of(b[0])["sequences"] == 2  # 160 and 40 blocks of 16
    pairs = {(x.kind, x.candidate.split(" · ")[-1], x.baseline.split(" · ")[-1])
             for x in L.crossover_pairs(q + b + bf16)}
    # int4 at auto vs bf16 at auto is like-for-like (each at its compute dtype); int4 at int8 KV vs bf16 is not
    assert pairs == {("kv-cache", "KV int8 paged 0.25", "KV auto paged 0.25"),
                     ("precision", "KV auto paged 0.25", "qwen2.5-coder-0.5b")}
    (row,) = L.kv_cost_rows(q + b + bf16, 0.5)
    assert (row["kv_quantized"], row["kv_unquantized"], row["sequences_quantized"], row["sequences_unquantized"]) \
        == ("int8", "fp32", 10, 2)
    assert row["usd_per_1m_out_at_slo_quantized"] == pytest.approx(usd_per_million_tokens(50, 0.5), rel=1e-3)
    assert row["usd_per_1m_out_at_slo_unquantized"] == pytest.approx(usd_per_million_tokens(28, 0.5), rel=1e-3)
    assert row["unquantized_over_quantized"] == pytest.approx(50 / 28, rel=1e-3)
    assert row["at_quantized"] == "concurrency 8" and row["at_unquantized"] == "concurrency 4"
    table = V.load_rows(q + b)
    assert table[0]["kv"] == "int8 paged, 0.25 GiB (160 blocks)"
    assert table[-1]["kv"] == "fp32 paged, 0.25 GiB (40 blocks)"

    from engine.present import reports
    html = reports.export_html(reports.Report("kv", "", q + b, 0.5))
    kv = html[html.index('id="load-kv-costs"'):]
    assert "int8" in kv and "fp32" in kv and f"{50 / 28:.3f}"[:4] in kv


def test_records_without_kv_facts_group_as_before():
    recs = curve("int4", {1: 10, 8: 50}) + curve("int4 ngram", {1: 14, 8: 40}, draft="ngram")
    assert L.kv_of(recs[0]) is None and list(L.configurations(recs)) == ["int4 · qwen2.5-coder-0.5b",
                                                                         "int4 ngram · qwen2.5-coder-0.5b"]
    assert L.kv_cost_rows(recs, 0.5) == []


def test_the_kv_text_says_which_layers_hold_a_window():
    kv_text = L.kv_text
    base = {"dtype": "fp32", "cache": "paged", "blocks": 10}
    assert kv_text(base) == "fp32 paged (10 blocks)"
    assert kv_text({**base, "window": 4096}) == "fp32 paged (10 blocks), holds a 4096-token window"
    assert kv_text({**base, "window": 4096, "window_layers": 5}) == \
        "fp32 paged (10 blocks), 5 windowed layers hold a 4096-token window"
