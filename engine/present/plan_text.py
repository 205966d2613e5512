"""The planner's answers as terminal text: tables, the savings waterfall, a day of traffic, fleets, batch jobs.

Printers only format: every number comes from the planner's result objects (engine.planner), which compute it.
"""
from __future__ import annotations

import math

from engine.planner import counts


def num(x, nd=2, scale=1.0) -> str:
    """A number with thousands separators, or "" when there is none (None, inf, nan)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"{x * scale:,.{nd}f}"


def table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    """Rows as aligned columns: cols are (heading, key)."""
    heads = [h for h, _ in cols]
    cells = [[str(r.get(k, "")) for _, k in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    out = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def plan_rows(plans) -> list[dict]:
    return [{"plan": p.label, "gpus": p.gpus_total or "", "usd_hr": num(p.usd_per_hr),
             "usd_month": num(p.usd_per_month, 0), "in_1m": num(p.usd_per_1m_input, 3),
             "out_1m": num(p.usd_per_1m_output, 3), "ttft_p90": num(p.ttft_p90_s, 0, 1e3),
             "tpot_p90": num(p.tpot_p90_s, 1, 1e3),
             "margin": f"{min(p.ttft_margin, p.tpot_margin):.2f}x" if p.feasible else "",
             "tok_s_gpu": num(p.output_tok_s_per_gpu, 0), "max_conc": p.max_concurrency or "",
             "bound": p.bound, "why_not": "; ".join(p.reasons)[:170],
             "kld": num((p.quality or {}).get("kld_mean"), 5) if p.quality else "",
             "pass": (f"{-p.quality['pass_drop']:+.1f}" if p.quality and p.quality.get("pass_drop") is not None
                      else "")} for p in plans]


PLAN_COLS = [("plan", "plan"), ("GPUs", "gpus"), ("$/hr", "usd_hr"), ("$/month", "usd_month"),
             ("$/1M in", "in_1m"), ("$/1M out", "out_1m"), ("TTFT p90 ms", "ttft_p90"), ("TPOT p90 ms", "tpot_p90"),
             ("SLO margin", "margin"), ("out tok/s/GPU", "tok_s_gpu"), ("max conc", "max_conc"), ("bound", "bound")]
QUALITY_COLS = [("KLD mean", "kld"), ("pass@1 Δ points", "pass")]  # under a quality budget


def savings_text(sv) -> str:
    """The waterfall: the answer, one row per step, each step's cause, the band."""
    rows = [{"step": s.step, "plan": (s.plan.label if s.plan else "none") + ("" if s.taken else " (not taken)"),
             "usd_month": num(s.usd_per_month, 0), "change": "" if i == 0 else f"{s.delta_usd_per_month:+,.0f}",
             "band": (f"{s.low_usd_per_month:,.0f}-{s.high_usd_per_month:,.0f}"
                      if s.low_usd_per_month is not None and s.high_usd_per_month is not None else ""),
             "out_1m": num(s.plan.usd_per_1m_output, 3) if s.plan and s.plan.feasible else "",
             "gpus": (s.plan.gpus_total or "") if s.plan else ""} for i, s in enumerate(sv.steps)]
    out = [f"the answer on {sv.gpu}: {sv.headline}",
           table(rows, [("step", "step"), ("plan", "plan"), ("GPUs", "gpus"), ("$/month", "usd_month"),
                        ("change", "change"), ("band $/month", "band"), ("$/1M out", "out_1m")])]
    out += [f"  {s.step}: {s.cause}" for s in sv.steps]
    out += [f"  {n}" for n in sv.notes]
    return "\n".join(out)


def day_text(day, what: str, autoscale) -> str:
    """A day of traffic (`what`: its name): the fleet sized for the peak against the autoscaled one."""
    saved = day.peak_usd_per_month - day.auto_usd_per_month
    miss = ", ".join(f"hour {h} ({day.missed_minutes[h]:.0f} min)" for h in day.missed_hours) or "none"
    return "\n".join([
        f"a day of {what} (peak {max(day.rates):g} req/s, lowest {min(day.rates):g}) on {day.plan}: "
        f"{day.capacity_per_replica:.3g} req/s per replica of {day.gpus_per_replica} GPU(s) at the SLOs",
        f"  sized for the peak: {day.peak_replicas} replica(s) all day = {day.peak_gpu_hours:,.0f} GPU-hours/day, "
        f"${day.peak_usd_per_month:,.0f}/month",
        f"  autoscaled (min {autoscale.min_replicas}, max {autoscale.max_replicas or 'none'}, "
        f"{autoscale.scale_up_min:g} min to scale up): "
        f"{day.auto_gpu_hours:,.0f} GPU-hours/day, ${day.auto_usd_per_month:,.0f}/month, "
        f"{'saving' if saved >= 0 else 'costing'} ${abs(saved):,.0f}/month "
        f"({abs(saved) / day.peak_usd_per_month:.0%}) against the peak-sized fleet",
        "  replicas by hour: " + " ".join(str(n) for n in day.auto_replicas),
        f"  SLO missed while scaling up: {miss}",
        *[f"  {n}" for n in day.notes]])


def policy_text(policy) -> str:
    """The day policy: its answer against the best single configuration, replicas by hour, each switch."""
    return "\n".join([f"  by the hour: {policy.headline}",
                      "  replicas by hour: " + " ".join(str(n) for n in policy.replicas),
                      *[f"  switch at {s['hour']}:00 {s['from']} -> {s['to']}: ${s['usd']:,.2f}"
                        for s in policy.switches],
                      *[f"  {n}" for n in policy.notes]])


def plan_text(w, res, sv, day_lines: str | None, price_column: str, top: int, show_all: bool, why: bool) -> str:
    """Workload w's plan: the question, the savings, the day, every feasible plan, what is not, notes, why."""
    model = res.model
    out = [f"{model.name}: {w.request_rate:g} req/s, {w.input_tokens} in / {w.output_tokens} out tokens, "
           f"SLO p90 TTFT {w.ttft_p90_s * 1e3:.0f} ms, TPOT {w.tpot_p90_s * 1e3:.1f} ms "
           f"({price_column} prices, {w.family} kernels)\n"]
    if sv is not None:
        out.append(savings_text(sv) + "\n")
    if day_lines:
        out.append(day_lines + "\n")
    feas = res.feasible[:top]
    if feas:
        cols = PLAN_COLS + (QUALITY_COLS if res.quality_budget else [])
        within = f" and the quality budget ({res.quality_budget['words']})" if res.quality_budget else ""
        out += [f"every plan that meets the SLOs{within}, cheapest first:", table(plan_rows(feas), cols)]
    else:
        out.append("no feasible plan.")
    if show_all or not feas:
        infeas = [p for p in res.plans if not p.feasible][: max(top, 20)]
        out += ["\ninfeasible:", table(plan_rows(infeas), [("plan", "plan"), ("why not", "why_not")])]
        out += [f"  try: {s}" for s in sorted({s for p in infeas for s in p.suggestions})]
    out.append("")
    out += [f"note: {n}" for n in res.notes]
    out += [f"assumption: {x}" for x in sorted({x for p in feas for x in p.assumptions})]
    if why and res.best:
        out += [f"\nwhy {res.best.label}:",
                table([{"term": y.term, "value": num(y.value, 3) if isinstance(y.value, (int, float)) else y.value,
                        "unit": y.unit, "formula": y.formula[:120]} for y in res.best.why],
                      [("term", "term"), ("value", "value"), ("unit", "unit"), ("formula", "formula")])]
    return "\n".join(out)


def fleet_text(fp, items) -> str:
    """Several models on one GPU kind: one model per GPU against packed, at each precision."""
    b = fp.best
    rows = [{"precision": o.precision, "sep": o.gpus_separate, "packed": o.gpus_packed,
             "usd_sep": num(o.usd_per_month_separate, 0), "usd_packed": num(o.usd_per_month_packed, 0),
             "gpus": " | ".join(" + ".join(f"{r.model} {r.memory_gib:.1f} GiB {r.share:.0%}" for r in bn)
                                for bn in o.bins)} for o in fp.options]
    return "\n".join([
        f"a fleet of {len(items)} models on {fp.gpu} "
        f"({', '.join(f'{i.model} at {i.request_rate:g} req/s' for i in items)})\n",
        f"the answer: at {b.precision}, {b.gpus_packed} GPU(s) shared against {b.gpus_separate} with one model "
        f"per GPU: ${b.usd_per_month_packed:,.0f}/month against ${b.usd_per_month_separate:,.0f}\n",
        table(rows, [("precision", "precision"), ("GPUs, one model each", "sep"), ("GPUs shared", "packed"),
                     ("$/month one each", "usd_sep"), ("$/month shared", "usd_packed"),
                     ("each GPU: model, memory at peak concurrency, share of time", "gpus")]),
        *[f"  not at {r}" for r in fp.refused]])


def batch_text(bp, job, top: int) -> str:
    """The cheapest day for a batch job's tokens within its deadline, and every option's tokens per dollar."""
    head = (f"{job.model}: a batch job of {job.tokens_per_day:,.0f} output tokens a day ({job.input_tokens} in / "
            f"{job.output_tokens} out per request), done within {job.deadline_hours:g} h, no latency SLO\n")
    if bp.best is None:
        return head + "\nno configuration fits."
    b = bp.best
    rows = [{"plan": o.label, "replicas": o.replicas, "tok_s": num(o.output_tok_s, 0),
             "tok_usd": f"{o.tok_per_usd:,.0f}", "usd_day": num(o.usd_per_day), "out_1m": num(o.usd_per_1m_output, 4),
             "latency": num(o.request_latency_s / 60, 1)} for o in bp.options[:top]]
    return "\n".join([
        head, f"the answer: {b.label}, {b.replicas} replica(s) for {job.deadline_hours:g} h: "
              f"${b.usd_per_day:,.2f}/day, ${b.usd_per_1m_output:.4f} per 1M output tokens "
              f"({b.tok_per_usd:,.0f} tokens per $)\n",
        table(rows, [("plan", "plan"), ("replicas", "replicas"), ("out tok/s per replica", "tok_s"),
                     ("tokens per $", "tok_usd"), ("$/day", "usd_day"), ("$/1M out", "out_1m"),
                     ("one request, min", "latency")])])


def sweep_text(rows: list[dict], summary: list[str], model, gpu, context: int, precisions, spec) -> str:
    """Decode cost against batch per precision on one GPU, with the speculation it assumed."""
    shown = []
    for r in rows:
        r = dict(r)
        for k in ("step_ms", "tpot_ms", "spec_tpot_ms"):
            if k in r:
                r[k] = num(r[k], 2)
        r["tok_s"] = num(r["tok_s"], 0)
        for k in ("spec_speedup", "best_gamma_speedup", "speedup_vs_first_precision"):
            if k in r:
                r[k] = f"{r[k]:.2f}x"
        shown.append(r)
    cols = [("batch", "batch"), ("precision", "precision"), ("step ms", "step_ms"), ("tok/s", "tok_s"),
            ("bound", "bound"), ("vs " + precisions[0], "speedup_vs_first_precision"), ("fits KV", "fits")]
    out = []
    if spec is not None:
        cols += [("spec TPOT ms", "spec_tpot_ms"), ("spec speedup", "spec_speedup"), ("best g", "best_gamma"),
                 ("at best g", "best_gamma_speedup")]
        out.append(f"speculation: {spec.draft_kind} {spec.draft_model or ''} g={spec.gamma} "
                   f"a={spec.acceptance_rate:.2f} ({spec.source})")
    out += [f"{model.name} decode on {gpu.name}, context {context} tokens:", table(shown, cols)]
    out += [f"  {line}" for line in summary]
    return "\n".join(out)


def packing_text(rows: list[dict], model, gpu, context: int) -> str:
    shown = [{**r, "weights_gb": num(r["weights_gb"]), "per_replica_gb": num(r["per_replica_gb"])} for r in rows]
    return "\n".join([f"replicas of {model.name} per {gpu.name} (each with KV for one {context}-token request):",
                      table(shown, [("precision", "precision"), ("replicas", "replicas"),
                                    ("weights GB", "weights_gb"), ("per replica GB", "per_replica_gb"),
                                    ("runnable", "runnable")])])


def models_rows(models) -> list[dict]:
    """The catalog's shapes and their sizes (engine.planner.counts computes them)."""
    return [{"model": m.name, "params": f"{counts.param_count(m) / 1e9:.2f}B",
             "active": f"{counts.param_count(m, True) / 1e9:.2f}B",
             "bf16_GB": f"{counts.weight_bytes(m, 'bf16') / 1e9:.2f}",
             "int8_GB": f"{counts.weight_bytes(m, 'int8') / 1e9:.2f}",
             "int4_GB": f"{counts.weight_bytes(m, 'int4') / 1e9:.2f}",
             "kv_KB_tok": f"{counts.kv_bytes_per_token(m) / 1024:.0f}", "context": m.max_context,
             "hf_id": m.hf_id} for m in models.values()]


def gpus_text(rows: list[dict]) -> str:
    """The GPU catalog with its prices and their spread (engine.planner.gpus.price_table)."""
    shown = [{**r, "spread": f"{r['spread']:.1f}x" if r["spread"] else "", "usd_month": f"{r['usd_per_month']:,.0f}",
              "source": r["source"][:90]} for r in rows]
    return table(shown, [("GPU", "gpu"), ("$/hr", "usd_per_hr"), ("low", "low"), ("high", "high"),
                         ("spread", "spread"), ("$/month", "usd_month"), ("date", "date"), ("origin", "origin"),
                         ("source", "source")])
