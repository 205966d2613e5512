"""engine/present.py: the pure data shaping behind the dashboard's charts and tables."""
import math

import pytest

from engine import present
from engine.common.formulas import expected_length
from engine.common.errors import UserError
from engine.measure.records import RunRecord


def rec(precision="fp32", tok_s=10.0, weight=1e9, kl=None, draft=None, spec=None, rss=2e9, **cfg):
    metrics = {"decode_tok_s": tok_s, "weight_bytes": weight, "peak_rss_bytes": rss, "ttft_s": 0.5,
               "token_latency_ms_median": 1000 / tok_s if tok_s else None, "kv_bytes": 1e6}
    if kl is not None:
        metrics["quality"] = {"kld_mean": kl, "top1_agreement": 0.9, "perplexity": 3.0}
    if spec is not None:
        metrics["spec"] = spec
        metrics["draft_weight_bytes"] = 5e8
    config = {"model": "m", "precision": precision, "batch_size": 1, "draft": draft, **cfg}
    return RunRecord(kind="bench", config=config, metrics=metrics, machine={"device": "cpu"})


# ---------------------------------------------------------------- memory

def test_kv_cache_bytes_formula():
    # 2 (K and V) * layers * kv_heads * head_dim * context * batch * bytes
    assert present.kv_cache_bytes(24, 2, 64, 1024, 1, 4) == 2 * 24 * 2 * 64 * 1024 * 4
    assert present.kv_cache_bytes(28, 2, 128, 4096, 8, 2) == 2 * 28 * 2 * 128 * 4096 * 8 * 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_kv_cache_bytes_refuses_bad_sizes(bad):
    with pytest.raises(UserError, match="context"):
        present.kv_cache_bytes(2, 2, 8, bad, 1)


def test_kv_grid_scales_linearly():
    g = present.kv_grid(2, 2, 8, [512, 1024], [1, 4], 4)
    assert len(g) == 4
    by = {(r["context"], r["batch"]): r["kv_bytes"] for r in g}
    assert by[(1024, 1)] == 2 * by[(512, 1)]
    assert by[(512, 4)] == 4 * by[(512, 1)]


def test_memory_breakdown_orders_and_shares():
    w = {"mlp": 600, "embedding": 300, "head": 50, "attention": 40, "norm": 10}
    rows = present.memory_breakdown(w, kv_bytes=1000, overhead_bytes=0)
    assert [r["part"] for r in rows] == ["weights: embedding", "weights: attention", "weights: mlp", "weights: norm",
                                         "weights: head", "KV cache", "activations (estimate)"]
    assert math.isclose(sum(r["share"] for r in rows), 1.0)
    assert rows[5]["bytes"] == 1000 and rows[5]["share"] == 0.5


def test_activation_estimate_grows_with_context_and_batch():
    a = present.activation_bytes(64, 128, 100, 4, 128, 1)
    assert present.activation_bytes(64, 128, 100, 4, 256, 1) > a
    assert present.activation_bytes(64, 128, 100, 4, 128, 2) == 2 * a


# ---------------------------------------------------------------- comparison rows

def test_comparison_row_cost_and_memory():
    r = present.row(rec(tok_s=10.0, weight=1e9), 3.6)
    # $3.6/h at 10 tok/s: 36000 tokens per hour -> $100 per 1M
    assert r["usd_per_1m_out"] == pytest.approx(100.0)
    assert r["weights_total_MB"] == 1000.0
    assert r["quality_loss_kl"] is None


def test_comparison_row_counts_the_draft_weights():
    spec = {"acceptance_rate": 0.5, "mean_acceptance_length": 1.8, "gamma": 4, "mean_gamma": 4.0}
    r = present.row(rec(draft={"kind": "self", "precision": "int4", "gamma": 4}, spec=spec), 1.0)
    assert r["weights_total_MB"] == 1500.0
    assert r["accept_rate"] == 0.5


def test_the_memory_chart_shows_each_runs_own_memory_not_the_process():
    """Issue 40.6: a backend that holds fp32 and then loads int4 peaks higher during the int4 run, so the process's
    RSS read int4 above fp32; the chart shows each run's weights + KV instead, the RSS stays a column."""
    rows = present.comparison_rows([rec("fp32", weight=4e9, rss=5e9), rec("int4", weight=1e9, rss=6e9)], 1.0)
    assert [r["run_memory_MB"] for r in rows] == [4001.0, 1001.0]
    charts = [c[0] for c in present.available_charts(rows)]
    assert "run_memory_MB" in charts and "peak_rss_MB" not in charts
    assert rows[1]["peak_rss_MB"] == 6000.0


def test_charts_available_and_missing():
    rows = present.comparison_rows([rec(), rec("int4", 20.0)], 1.0)
    cols = [c[0] for c in present.available_charts(rows)]
    assert "tok_s" in cols and "usd_per_1m_out" in cols and "accept_rate" not in cols
    assert any("acceptance" in m for m in present.missing_charts(rows))


# ---------------------------------------------------------------- Pareto

def test_pareto_frontier_minimises_both():
    pts = [{"c": 1, "q": 5}, {"c": 2, "q": 2}, {"c": 3, "q": 3}, {"c": 4, "q": 1}, {"c": None, "q": 0},
           {"c": 2, "q": 2}]
    flags = present.pareto_frontier(pts, "c", "q")
    # (3,3) is dominated by (2,2); equal points do not dominate each other; missing values are off it
    assert flags == [True, True, False, True, False, True]
    line = present.frontier_line(pts, "c", "q")
    assert [p["c"] for p in line] == [1, 2, 2, 4]


def test_pareto_single_and_empty():
    assert present.pareto_frontier([], "a", "b") == []
    assert present.pareto_frontier([{"a": 1, "b": 1}], "a", "b") == [True]


def test_pareto_axes_fall_back_to_memory_without_quality():
    rows = present.comparison_rows([rec(), rec("int4", 20.0, 3e8)], 1.0)
    assert present.pareto_axes(rows)[1] == "weights_total_MB"
    rows = present.comparison_rows([rec(kl=0.0), rec("int4", 20.0, 3e8, kl=0.02)], 1.0)
    assert present.pareto_axes(rows)[1] == "quality_loss_kl"
    fig = present.pareto_figure(rows)
    assert fig is not None and len(fig.data) == 2


# ---------------------------------------------------------------- report diffs

def test_pct_diff():
    assert present.pct_diff(10, 15) == pytest.approx(50.0)
    assert present.pct_diff(10, 5) == pytest.approx(-50.0)
    assert present.pct_diff(-10, -5) == pytest.approx(50.0)
    assert present.pct_diff(0, 5) is None
    assert present.pct_diff(None, 5) is None
    assert present.pct_diff(float("nan"), 5) is None


def test_report_diff_matches_by_label_and_marks_better():
    base = [{"config": "a", "tok_s": 10.0, "ttft_ms": 100.0}, {"config": "b", "tok_s": 5.0}]
    other = [{"config": "a", "tok_s": 12.0, "ttft_ms": 150.0}, {"config": "c", "tok_s": 1.0}]
    d = {r["config"]: r for r in present.report_diff(base, other)}
    assert d["a"]["tok_s_pct"] == pytest.approx(20.0) and d["a"]["tok_s_better"] is True
    assert d["a"]["ttft_ms_pct"] == pytest.approx(50.0) and d["a"]["ttft_ms_better"] is False
    assert d["b"]["in_other"] is False and d["b"]["tok_s_pct"] is None
    assert d["c"]["in_base"] is False
    table = present.diff_table(list(d.values()))
    assert table[0]["tok_s %"] == pytest.approx(20.0)


def test_report_diff_numbers_duplicate_labels():
    base = [{"config": "a", "tok_s": 1.0}, {"config": "a", "tok_s": 2.0}]
    other = [{"config": "a", "tok_s": 2.0}, {"config": "a", "tok_s": 2.0}]
    d = present.report_diff(base, other)
    assert [r["config"] for r in d] == ["a", "a #2"]
    assert d[1]["tok_s_pct"] == 0.0 and d[1]["tok_s_better"] is None


# ---------------------------------------------------------------- speculation

def test_expected_length_matches_formula():
    assert expected_length(0.5, 4) == pytest.approx((1 - 0.5 ** 5) / 0.5)
    assert expected_length(1.0, 4) == 5.0
    assert expected_length(0.0, 4) == 1.0
    assert expected_length(None, 4) is None
    curve = present.expected_length_curve(0.8, 3)
    assert [c["gamma"] for c in curve] == [1, 2, 3]


def test_acceptance_rows_and_spec_summary():
    spec = {"position_rate": [0.9, 0.5, None], "position_drafted": [10, 10, 0], "acceptance_rate": 0.7,
            "mean_acceptance_length": 2.4, "gamma": 3, "mean_gamma": 3.0, "speedup": 1.5, "baseline_tok_s": 4.0,
            "draft_s": 1.0, "verify_s": 2.0, "rounds": 10}
    rows = present.acceptance_rows(spec)
    assert rows[0] == {"position": 1, "acceptance": 0.9, "proposed": 10}
    assert rows[2]["acceptance"] is None
    s = present.spec_summary(rec(spec=spec, draft={"kind": "model"}))
    assert s["theoretical_length"] == pytest.approx((1 - 0.7 ** 4) / 0.3)
    assert s["speedup"] == 1.5
    assert present.spec_summary(rec()) is None


def test_token_spans_escape_and_colour():
    out = present.token_spans_html([("<script>alert(1)</script>", "accepted"), ("x", "bonus"), ("y", "weird")])
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert present.ORIGINS["accepted"][1] in out and present.ORIGINS["bonus"][1] in out
    legend = present.legend_html()
    assert all(label in legend for label, _ in present.ORIGINS.values())
    assert present.origin_counts(["target", "accepted", "accepted"]) == {"target": 1, "accepted": 2, "bonus": 0,
                                                                       "resample": 0}


# ---------------------------------------------------------------- capacity, planner rows, misc

def test_capacity_rows():
    rows = [{"config": "a", "tok_s": 10.0}, {"config": "b", "tok_s": None}]
    cap = present.capacity_rows(rows, usd_per_hour=1.0, tokens_per_day=1_000_000)
    # 10 tok/s = 864000 tokens/day -> 2 machines for 1M/day
    assert cap[0]["machines"] == 2 and cap[0]["usd_per_month"] == pytest.approx(2 * 730.0)
    assert cap[1]["machines"] is None
    with pytest.raises(UserError):
        present.capacity_rows(rows, 1.0, 0)
    with pytest.raises(UserError):
        present.capacity_rows(rows, -1.0, 10)


def test_plan_rows_shape():
    p = {"label": "1x H100 int4", "feasible": True, "gpus_total": 1, "usd_per_hr": 2.5, "usd_per_month": 1825.0,
         "usd_per_1m_output": 0.1234567, "ttft_p90_s": 0.2, "tpot_p90_s": 0.01, "reasons": []}
    r = present.plan_rows([p])[0]
    assert r["plan"] == "1x H100 int4" and r["ttft_p90_ms"] == 200.0 and r["usd_per_1m_out"] == 0.1235


def test_highlights_and_eta():
    rows = present.comparison_rows([rec(kl=0.0), rec("int4", 20.0, 3e8, kl=0.02)], 1.0)
    hl = present.highlights(rows)
    assert any("Cheapest" in h and "int4" in h for h in hl)
    assert any("frontier" in h for h in hl)
    assert present.eta_text(1, 4, 125) == "1/4 runs done, about 2 min 05 s left"
    assert present.eta_text(4, 4, 0) == "4/4 runs done"


def test_bar_figure_escapes_labels():
    rows = [{"config": "<b onmouseover=x>evil</b>", "tok_s": 3.0}]
    fig = present.bar_figure(rows, "tok_s", "Decode", "tok/s", "higher")
    assert "<b" not in fig.data[0].x[0] and "&lt;b" in fig.data[0].x[0]


def test_machine_rows_say_when_there_is_no_gpu():
    rows = present.machine_rows({"cpu_model": "X", "simd": "avx2+fma", "cores": 2, "torch_threads": 2,
                                 "memory_bytes": 2**33}, 12.5, [], {"cpu": "avx2"})
    d = {r["what"]: r["value"] for r in rows}
    assert d["SIMD level"] == "avx2+fma" and d["measured read bandwidth"] == "12.5 GB/s"
    assert "none detected" in d["GPU"]


# ---------------------------------------------------------------- the page tables and this machine's price

def test_page_tables_are_views_of_the_columns():
    """Every table a page draws is a named view of present.columns: its labels, help and formats come from there."""
    page = present.table_cells("page")
    names = [c.name for c in page]
    assert names[:2] == ["config", "system"] and "tok_s" in names and "run" in names
    assert names[names.index("tok_s") + 1] == "tok_s_pm" and "precision_pm" not in names  # ± after interval columns
    by = {c.name: c for c in page}
    assert by["tok_s"].label == present.COLUMNS_BY_NAME["tok_s"].label
    assert by["usd_per_1m_out"].fmt == "$%.4f" and by["quality_loss_kl"].fmt == "%.5f" and by["config"].text
    assert "[tokens/s]" in by["tok_s"].help and by["tok_s_pm"].help == present.PM_DEFINITION
    assert [c.name for c in present.table_cells("category") if not c.name.endswith("_pm")] == [
        "config", "category", "prompts", "ttft_ms", "tok_s", "accept_rate", "accept_rate_req", "accept_len",
        "accept_len_req", "speedup"]
    with pytest.raises(KeyError, match="no view 'nope'"):
        present.table_cells("nope")


def test_prices_live_with_the_planners_price_table(tmp_path):
    from engine.measure.store import Store
    from engine.planner import load_gpus
    from engine.present import planning

    store = Store(tmp_path / "lab.sqlite")
    assert planning.machine_price(store) == 0.10  # the default until the user sets one
    store.set_gpu_override(planning.THIS_MACHINE, {"memory_gb": 64})
    assert planning.set_machine_price(store, 0.5) == 0.5
    assert planning.machine_price(store) == 0.5
    ov = {o["name"]: o for o in store.gpu_overrides()}[planning.THIS_MACHINE]
    assert ov["memory_gb"] == 64 and ov["price_source"] == "set in the dashboard"  # the row's other fields kept
    assert load_gpus(store.gpu_overrides())[planning.THIS_MACHINE].price_usd_per_hr == 0.5  # what the planner prices
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(UserError, match="not a positive number"):
            planning.set_machine_price(store, bad)
    assert planning.machine_price(store) == 0.5
    # any GPU of the table: priced the same way, an unknown one refused by name before anything is stored
    assert planning.set_gpu_price(store, "L4", 0.9, "our contract") == 0.9
    assert load_gpus(store.gpu_overrides())["L4"].price_source == "our contract"
    from engine.planner import CatalogError

    with pytest.raises(CatalogError, match="new GPU 'no such gpu' needs"):
        planning.set_gpu_price(store, "no such gpu", 1.0, "typo")
    assert "no such gpu" not in {o["name"] for o in store.gpu_overrides()}
