"""Capacity from measured throughput, and planner results as table rows."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from engine.common.errors import UserError
from engine.common.formulas import HOURS_PER_MONTH, check_price, usd_per_million_tokens
from engine.present.columns import num as _num


def _round(x, n):
    return None if x is None else round(x, n)


def capacity_rows(rows: Sequence[Mapping], usd_per_hour: float, tokens_per_day: float) -> list[dict]:
    """Machines like this one needed for `tokens_per_day` output tokens at each run's measured tokens/s.

    machines = ceil(tokens_per_day / (tok_s * 86400)); $/month = machines * $/hour * 730;
    $/1M output tokens assumes the machines are busy all the time (the floor on cost).
    """
    check_price(usd_per_hour)
    t = _num(tokens_per_day)
    if t is None or t <= 0:
        raise UserError(f"tokens per day {tokens_per_day!r} is not a positive number", "enter the output tokens "
                        "you need per day, e.g. 1000000")
    out = []
    for r in rows:
        tok_s = _num(r.get("tok_s"))
        per_day = tok_s * 86400 if tok_s else None
        machines = math.ceil(t / per_day) if per_day else None
        out.append({
            "config": r.get("config"), "tok_s": tok_s,
            "tokens_per_day_per_machine": None if per_day is None else round(per_day),
            "machines": machines,
            "usd_per_month": None if machines is None else round(machines * usd_per_hour * HOURS_PER_MONTH, 2),
            "usd_per_1m_out": _round(usd_per_million_tokens(tok_s, usd_per_hour), 4),
            "utilization": None if machines is None else round(t / (machines * per_day), 3),
        })
    return out


# the tables' column labels, with units (the pages draw rows under these names)
CAPACITY_LABELS = {"config": "configuration", "tok_s": "decode tok/s", "tokens_per_day_per_machine":
                   "tokens/day per machine", "machines": "machines", "usd_per_month": "$/month",
                   "usd_per_1m_out": "$/1M out, one stream", "utilization": "busy"}
PLAN_LABELS = {"plan": "plan", "feasible": "usable", "gpus": "GPUs", "usd_per_hr": "$/hour", "usd_per_month": "$/month",
               "usd_per_1m_out": "$/1M output", "ttft_p90_ms": "TTFT p90 (ms)", "tpot_p90_ms": "TPOT p90 (ms)",
               "batch": "batch (sequences)", "utilization": "busy at the SLOs", "bound": "bound by",
               "why_not": "why not", "kld_mean": "KLD mean (nats/token)", "kld_median": "KLD median (nats/token)",
               "kld_p99": "KLD p99 (nats/token)", "pass_at_1_delta_points": "pass@1 Δ (points)"}


def plan_rows(plans: Sequence[Mapping], top: int | None = None) -> list[dict]:
    """Planner results (Plan.to_dict()) as table rows: feasible first as the planner sorted them."""
    rows = []
    for p in plans[:top] if top else plans:
        rows.append({
            "plan": p.get("label"), "feasible": p.get("feasible"), "gpus": p.get("gpus_total"),
            "usd_per_hr": _round(_num(p.get("usd_per_hr")), 2),
            "usd_per_month": _round(_num(p.get("usd_per_month")), 0),
            "usd_per_1m_out": _round(_num(p.get("usd_per_1m_output")), 4),
            "ttft_p90_ms": None if _num(p.get("ttft_p90_s")) is None else round(p["ttft_p90_s"] * 1e3, 1),
            "tpot_p90_ms": None if _num(p.get("tpot_p90_s")) is None else round(p["tpot_p90_s"] * 1e3, 2),
            "batch": _round(_num(p.get("batch")), 1), "utilization": _round(_num(p.get("utilization")), 3),
            "bound": p.get("bound"), "why_not": "; ".join(p.get("reasons") or []),
        })
        q = p.get("quality")
        if q:  # under a quality budget: what the configuration measured
            rows[-1].update(kld_mean=q.get("kld_mean"), kld_median=q.get("kld_median"), kld_p99=q.get("kld_p99"),
                            pass_at_1_delta_points=None if q.get("pass_drop") is None else round(-q["pass_drop"], 1))
    return rows
