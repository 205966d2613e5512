"""The Cost & capacity page's planner calls: inputs from the store, a plan as dicts, its chart.

The page draws; this module asks the planner (which it may import: presentation sits above it) and
hands back plain data, so the page never imports the planner itself.
"""
from __future__ import annotations

from typing import Sequence

from engine import planner
from engine.planner.gpus import GPU_KINDS, THIS_MACHINE  # noqa: F401
# the pages set and read the user's prices through these (they never import the planner themselves)
from engine.planner.price_overrides import machine_price, set_gpu_price, set_machine_price  # noqa: F401
from engine.common.vocab import PRECISIONS
from engine.present.figures import _safe

PLAN_PRECISIONS = PRECISIONS + (planner.shapes.INT4_MIXED,)  # int4-mixed: the Q4_K_M layer rule (shapes)


def planner_inputs(stored_runs: Sequence[dict], overrides: list[dict]) -> dict:
    """Model shapes, GPUs (with the user's price overrides and this machine's measured bandwidth) and
    the calibration from stored runs (None when there are none)."""
    cal = planner.calibrate(stored_runs) if stored_runs else None
    probe = {"mem_bw_gbs": cal.machine_bw_gbs} if cal and cal.machine_bw_gbs else None
    return {"models": planner.shapes.load_models(), "gpus": planner.load_gpus(overrides, probe), "calibration": cal}


def _workload(model, rate, input_tokens, output_tokens, ttft_p90_s, tpot_p90_s, gpus, precisions, spec,
              acceptance=None, max_kld=None, max_pass_drop=None, kld_stat="mean"):
    """The Cost page's form as a Workload (the plan and the savings answer plan the same one); `acceptance`: a
    what-if draft acceptance rate in [0, 1), projected through the planner's speculation model (None: measured
    by the lab where it has a run, else assumed); max_kld / max_pass_drop: the quality budget (None: none), max_kld
    limiting the KLD statistic `kld_stat`."""
    return planner.Workload(model=model, request_rate=float(rate), input_tokens=int(input_tokens),
                            output_tokens=int(output_tokens), ttft_p90_s=float(ttft_p90_s),
                            tpot_p90_s=float(tpot_p90_s), gpus=gpus or None, precisions=precisions or None, spec=spec,
                            acceptance_rate=acceptance, max_kld=max_kld, max_pass_drop=max_pass_drop,
                            kld_stat=kld_stat)


def plan_workload(inputs: dict, model: str, rate: float, input_tokens: int, output_tokens: int, ttft_p90_s: float,
                  tpot_p90_s: float, gpus: list[str] | None, precisions: list[str] | None, spec: str,
                  use_calibration: bool, day: dict | None = None, acceptance: float | None = None,
                  max_kld: float | None = None, max_pass_drop: float | None = None,
                  kld_stat: str = "mean") -> tuple[dict, dict | None]:
    """The planner's answer for one workload (PlanResult.to_dict()) and its savings waterfall
    (planner.savings.Savings.to_dict(), None when no plan meets the SLOs), from one search, so the two agree;
    with `day` ({"rates", "name", "min_replicas", "max_replicas", "scale_up_min"}) the savings also hold the best
    plan's day of traffic, sized for the peak and autoscaled, under "day"."""
    from engine.planner.savings import plan_with_savings

    w = _workload(model, rate, input_tokens, output_tokens, ttft_p90_s, tpot_p90_s, gpus, precisions, spec, acceptance,
                  max_kld, max_pass_drop, kld_stat)
    res, sv = plan_with_savings(w, inputs["gpus"], inputs["models"], inputs["calibration"] if use_calibration else None)
    return res.to_dict(), (None if sv is None else _with_day(res, sv, day))


def _with_day(res, sv, day: dict | None) -> dict:
    out = sv.to_dict()
    if day is not None and sv.best is not None:
        from engine.planner import traffic
        from engine.planner.day_policy import plan_day

        fleet, policy = plan_day(res, sv.best, day["rates"], traffic.Autoscale(
            day.get("min_replicas", 1), day.get("max_replicas"), day.get("scale_up_min", 5.0)))
        out["day"] = fleet.to_dict() | {"traffic": day.get("name", "")}
        out["day_policy"] = policy.to_dict()
    return out


TRAFFIC_CHOICES = ("constant", "business-hours", "diurnal", "bursty", "my CSV")


def traffic_rates(kind: str, peak: float, peak_to_trough: float = 4.0, csv_bytes: bytes | None = None
                  ) -> list[float] | None:
    """The day's hourly rates: None for a constant rate, a named shape peaking at `peak`, or an uploaded CSV."""
    from engine.planner import traffic

    if kind == "constant":
        return None
    if kind == "my CSV":
        if csv_bytes is None:
            raise planner.PlanError("profile", "upload a CSV of hour,rate (24 rows, requests/s) for 'my CSV'")
        return traffic.from_csv(csv_bytes)
    return traffic.shape(kind, peak, peak_to_trough)


def day_figure(day: dict):
    """The day's fleet: replicas per hour sized for the peak and autoscaled (left), the rate (right), the
    hours that miss the SLO while scaling up marked."""
    import plotly.graph_objects as go

    rows = day["rows"]
    hours = [r["hour"] for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=hours, y=[r["rate"] for r in rows], name="requests/s", marker_color="#dee2e6",
                         yaxis="y2"))
    fig.add_trace(go.Scatter(x=hours, y=[r["peak_replicas"] for r in rows], name="replicas sized for the peak",
                             mode="lines", line=dict(color="#c92a2a", dash="dash")))
    fig.add_trace(go.Scatter(x=hours, y=[r["auto_replicas"] for r in rows], name="replicas autoscaled",
                             mode="lines+markers", line=dict(color="#2b8a3e", shape="hv")))
    miss = [r for r in rows if r["slo_missed_min"] > 0]
    if miss:
        fig.add_trace(go.Scatter(x=[r["hour"] for r in miss], y=[r["auto_replicas"] for r in miss], mode="markers",
                                 name="SLO missed while scaling up", marker=dict(color="#e67700", size=12,
                                                                                 symbol="x")))
    fig.update_layout(title=_safe(f"A day of {day.get('traffic') or 'traffic'} on {day['plan']}"), height=360,
                      margin=dict(l=50, r=50, t=50, b=40), xaxis=dict(title="hour of day", dtick=2),
                      yaxis=dict(title="replicas", rangemode="tozero"),
                      yaxis2=dict(title="requests/s", overlaying="y", side="right", rangemode="tozero",
                                  showgrid=False), legend=dict(orientation="h", y=-0.2))
    return fig


def savings_figure(sv: dict):
    """The waterfall: the bf16 baseline, what quantization and speculation each change, the best plan; the
    whiskers on the ends are the band (planner.savings)."""
    import plotly.graph_objects as go

    steps = sv["steps"]
    base = steps[0]
    x = [_safe(f"baseline: {base['plan'] or 'none'}")]
    y, measure, text = [base["usd_per_month"] or 0.0], ["absolute"], [_money(base["usd_per_month"])]
    for s in steps[1:]:
        what = s["step"] + ("" if s["taken"] else " (not taken)")
        if s["taken"] and s["plan"]:
            what += f": {s['precision']}" if s["step"] == "+ quantization" else ""
        x.append(_safe(what))
        y.append(s["delta_usd_per_month"] or 0.0)
        measure.append("relative")
        text.append(_money(s["delta_usd_per_month"], signed=True))
    best = steps[-1]
    x.append(_safe(f"best: {best['plan'] or 'none'}"))
    y.append(0.0)
    measure.append("total")
    text.append(_money(best["usd_per_month"]))
    fig = go.Figure(go.Waterfall(x=x, y=y, measure=measure, text=text, textposition="outside",
                                 decreasing=dict(marker_color="#2b8a3e"), increasing=dict(marker_color="#c92a2a"),
                                 totals=dict(marker_color="#4c6ef5"), connector=dict(line=dict(color="#868e96"))))
    ends = [(x[0], base), (x[-1], best)]
    lo = [e[1].get("low_usd_per_month") for e in ends]
    hi = [e[1].get("high_usd_per_month") for e in ends]
    if all(v is not None for v in lo + hi):
        mid = [e[1]["usd_per_month"] or 0.0 for e in ends]
        fig.add_trace(go.Scatter(x=[e[0] for e in ends], y=mid, mode="markers", marker=dict(size=1, color="#212529"),
                                 error_y=dict(type="data", symmetric=False, array=[h - m for h, m in zip(hi, mid)],
                                              arrayminus=[m - lo_ for m, lo_ in zip(mid, lo)], color="#212529"),
                                 name="band", showlegend=False, hoverinfo="skip"))
    fig.update_layout(title=_safe(f"What quantization and speculation save on {sv['gpu']} ($/month)"), height=380,
                      margin=dict(l=50, r=10, t=50, b=120), xaxis=dict(tickangle=-20), yaxis=dict(title="$/month"),
                      showlegend=False)
    return fig


PRECISION_LABELS = {"precision": "precision", "speculation": "speculation", "plan": "plan",
                    "feasible": "meets the SLOs", "gpus": "GPUs", "usd_per_month": "$/month",
                    "usd_per_1m_output": "$/1M output", "why_not": "why not"}
KV_FIT_LABELS = {"kv_dtype": "KV precision", "kib_per_token": "KiB per token", "sequences": "sequences",
                 "vs_bf16": "× bf16", "engine": "runs on"}
DAY_POLICY_LABELS = {"hour": "hour", "rate": "requests/s", "configuration": "configuration", "replicas": "replicas",
                     "usd": "$ this hour", "slo_missed_min": "SLO missed (min)"}


def savings_rows(sv: dict) -> list[dict]:
    """The waterfall's steps as table rows: plan, GPUs, $/month, change, band, $/1M output, cause."""
    return [{"step": s["step"], "plan": (s["plan"] or "none") + ("" if s["taken"] else " (not taken)"),
             "GPUs": s["gpus"], "$/month": s["usd_per_month"], "change $/month": s["delta_usd_per_month"],
             "band low": s["low_usd_per_month"], "band high": s["high_usd_per_month"],
             "$/1M output": s["usd_per_1m_output"], "cause": s["cause"]} for s in sv["steps"]]


def _money(v, signed: bool = False) -> str:
    if v is None:
        return "n/a"
    return (f"{'+' if v > 0 else '-' if v < 0 else ''}${abs(v):,.0f}" if signed else f"${v:,.0f}")


def fleet_plan(inputs: dict, text: str, gpu: str, input_tokens: int, output_tokens: int, ttft_p90_s: float,
               tpot_p90_s: float) -> dict:
    """A fleet of models from 'model:rate, model:rate' on one GPU kind (planner.fleet), as a dict."""
    from engine.planner import fleet

    items = fleet.parse_fleet(text, input_tokens, output_tokens, ttft_p90_s, tpot_p90_s)
    return fleet.plan_fleet(items, gpu, inputs["gpus"], inputs["models"]).to_dict()


def fleet_rows(fp: dict) -> list[dict]:
    """One row per precision: GPUs one model each against shared, $/month, what each GPU holds."""
    return [{"precision": o["precision"], "GPUs, one model each": o["gpus_separate"], "GPUs shared": o["gpus_packed"],
             "$/month one each": o["usd_per_month_separate"], "$/month shared": o["usd_per_month_packed"],
             "each GPU": " | ".join(" + ".join(f"{r['model']} {r['memory_gib']:.1f} GiB {r['share']:.0%}" for r in b)
                                    for b in o["bins"])} for o in fp["options"]]


def fleet_figure(fp: dict):
    """GPUs per precision: one model per GPU against shared."""
    import plotly.graph_objects as go

    x = [o["precision"] for o in fp["options"]]
    fig = go.Figure([go.Bar(x=x, y=[o["gpus_separate"] for o in fp["options"]], name="one model per GPU",
                            marker_color="#adb5bd"),
                     go.Bar(x=x, y=[o["gpus_packed"] for o in fp["options"]], name="models sharing GPUs",
                            marker_color="#2b8a3e")])
    fig.update_layout(title=_safe(f"A fleet of models on {fp['gpu']}: GPUs needed"), barmode="group", height=320,
                      margin=dict(l=40, r=10, t=50, b=40), yaxis=dict(title="GPUs", dtick=1))
    return fig


def price_rows(inputs: dict) -> list[dict]:
    return planner.price_table(inputs["gpus"])


def gpu_names(inputs: dict) -> list[str]:
    return [g.name for g in inputs["gpus"].values() if g.kind in GPU_KINDS]


TRADEOFF_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def tradeoff_figure(inputs: dict, sv: dict, use_calibration: bool):
    """InferenceMAX's view on the answer's GPU: output tokens/s per GPU against tokens/s each user sees, as the
    batch grows (each point labelled with its batch), one line per precision (colour) without and with the
    workload's speculation (dashed, diamonds); batches whose KV does not fit are left out. The planner's decode
    step (planner.sweep.batch_sweep), at the workload's mid-answer context; None when the plan has no GPU."""
    import plotly.graph_objects as go

    from engine.planner.speculation import choose_spec
    from engine.planner.sweep import batch_sweep
    from engine.present.figures import PALETTE

    w, gpu = sv.get("workload") or {}, inputs["gpus"].get(sv.get("gpu"))
    if gpu is None or not w:
        return None
    models, cal = inputs["models"], inputs["calibration"] if use_calibration else None
    model = models[w["model"]]
    precs = list(dict.fromkeys(p["precision"] for p in sv.get("precisions") or []))
    spec = draft = None
    if w.get("spec") != "off":
        spec, draft = choose_spec(planner.Workload(model=w["model"], request_rate=w["request_rate"],
                                                   input_tokens=w["input_tokens"], output_tokens=w["output_tokens"]),
                                  model, models, cal)
    rows = batch_sweep(model, gpu, precs, TRADEOFF_BATCHES, w["input_tokens"] + w["output_tokens"] // 2, spec, draft,
                       calibration=cal)
    fig = go.Figure()
    for i, p in enumerate(precs):
        pts = [r for r in rows if r["precision"] == p and r["fits"]]
        if not pts:
            continue
        colour = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(x=[1e3 / r["tpot_ms"] for r in pts], y=[r["tok_s"] for r in pts],
                                 text=[str(r["batch"]) for r in pts], mode="lines+markers+text", name=p,
                                 textposition="top center", line=dict(color=colour), marker=dict(color=colour)))
        if spec is not None:
            fig.add_trace(go.Scatter(x=[1e3 / r["spec_tpot_ms"] for r in pts],
                                     y=[r["batch"] * 1e3 / r["spec_tpot_ms"] for r in pts],
                                     text=[str(r["batch"]) for r in pts], mode="lines+markers+text",
                                     name=f"{p} + {spec.draft_kind} draft", textposition="bottom center",
                                     line=dict(color=colour, dash="dash"),
                                     marker=dict(color=colour, symbol="diamond")))
    fig.update_layout(title=f"Output tokens/s per {gpu.name} against tokens/s per user, as the batch grows (labels: "
                            "batch; dashed: with the draft; up and right is better)",
                      height=460, margin=dict(l=50, r=10, t=60, b=50), legend=dict(orientation="h", y=-0.2),
                      xaxis=dict(title="tokens/s per user (1 / time per output token)", rangemode="tozero"),
                      yaxis=dict(title=f"output tokens/s per {gpu.name} replica", rangemode="tozero"))
    return fig


def plans_figure(rows: Sequence[dict], top: int = 12):
    """The cheapest feasible plans, $/month."""
    import plotly.graph_objects as go

    rows = list(rows)[:top]
    fig = go.Figure(go.Bar(x=[_safe(r["plan"]) for r in rows], y=[r["usd_per_month"] for r in rows],
                           marker_color="#4c6ef5"))
    fig.update_layout(title="Cheapest feasible plans: $ per month by plan", height=340,
                      margin=dict(l=40, r=10, t=50, b=110), xaxis=dict(tickangle=-30, title="plan"),
                      yaxis=dict(title="$ per month", rangemode="tozero"))
    return fig


def kv_fit_rows(inputs: dict, model: str, budget_gib: float, context_tokens: int) -> list[dict]:
    """Sequences of `context_tokens` that a KV budget holds at each KV precision (the planner's byte formula,
    engine.common.formulas.kv_pair_bytes, which the engine's paged cache allocates by), against bf16."""
    m = inputs["models"][model]
    per_seq = {kv: planner.counts.kv_cache_bytes(m, context_tokens, kv) for kv in planner.shapes.KV_DTYPES}
    fits = {kv: int(budget_gib * 2 ** 30 // b) for kv, b in per_seq.items()}
    return [{"kv_dtype": kv, "kib_per_token": per_seq[kv] / context_tokens / 1024, "sequences": fits[kv],
             "vs_bf16": fits[kv] / fits["bf16"] if fits["bf16"] else None,
             "engine": "CPU and GPU" if kv in ("fp32", "bf16", "fp16", "int8") else
             ("GPU (compute capability 8.9+)" if kv == "fp8" else "planner only")}
            for kv in planner.shapes.KV_DTYPES]
