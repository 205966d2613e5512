"""The Cost & capacity page's planner calls: inputs from the store, a plan as dicts, its chart.

The page draws; this module asks the planner (which it may import: presentation sits above it) and
hands back plain data, so the page never imports the planner itself.
"""
from __future__ import annotations

from typing import Sequence

from engine import planner
from engine.planner.gpus import THIS_MACHINE  # noqa: F401
# the pages set and read the user's prices through these (they never import the planner themselves)
from engine.planner.price_overrides import machine_price, set_gpu_price, set_machine_price  # noqa: F401
from engine.common.vocab import PRECISIONS
from engine.present.figures import _safe

PLAN_PRECISIONS = PRECISIONS


def planner_inputs(stored_runs: Sequence[dict], overrides: list[dict]) -> dict:
    """Model shapes, GPUs (with the user's price overrides and this machine's measured bandwidth) and
    the calibration from stored runs (None when there are none)."""
    cal = planner.calibrate(stored_runs) if stored_runs else None
    probe = {"mem_bw_gbs": cal.machine_bw_gbs} if cal and cal.machine_bw_gbs else None
    return {"models": planner.shapes.load_models(), "gpus": planner.load_gpus(overrides, probe), "calibration": cal}


def plan_workload(inputs: dict, model: str, rate: float, input_tokens: int, output_tokens: int, ttft_p90_s: float,
                  tpot_p90_s: float, gpus: list[str] | None, precisions: list[str] | None, spec: str,
                  use_calibration: bool) -> dict:
    """The planner's answer for one workload, as a dict (PlanResult.to_dict())."""
    w = planner.Workload(model=model, request_rate=float(rate), input_tokens=int(input_tokens),
                         output_tokens=int(output_tokens), ttft_p90_s=float(ttft_p90_s), tpot_p90_s=float(tpot_p90_s),
                         gpus=gpus or None, precisions=precisions or None, spec=spec)
    return planner.plan(w, gpus=inputs["gpus"], models=inputs["models"],
                        calibration=inputs["calibration"] if use_calibration else None).to_dict()


def price_rows(inputs: dict) -> list[dict]:
    return planner.price_table(inputs["gpus"])


def gpu_names(inputs: dict) -> list[str]:
    return [g.name for g in inputs["gpus"].values() if g.kind == "gpu"]


def plans_figure(rows: Sequence[dict], top: int = 12):
    """The cheapest feasible plans, $/month."""
    import plotly.graph_objects as go

    rows = list(rows)[:top]
    fig = go.Figure(go.Bar(x=[_safe(r["plan"]) for r in rows], y=[r["usd_per_month"] for r in rows],
                           marker_color="#4c6ef5"))
    fig.update_layout(title="Cheapest feasible plans ($/month)", height=340, margin=dict(l=40, r=10, t=50, b=110),
                      xaxis=dict(tickangle=-30))
    return fig
