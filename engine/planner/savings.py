"""The answer first: what quantization and speculation save against bf16 without
speculation, for one workload on one GPU, as a waterfall.

    baseline       the cheapest plan at bf16 (fp16 where the GPU has no bf16), no speculation
    + quantization the best plan's precision, no speculation
    + speculation  the best plan: the cheapest feasible plan on that GPU at any precision, either way

Each step carries its plan, its change against the step before and its cause in the seed's terms:
memory (the weights fit on fewer GPUs per replica), bytes per decode step (a faster step serves more
requests per replica), tokens per target pass (speculation), utilization. The band re-plans every step
with both kernel efficiencies scaled by 1 -/+ the planner's error on published measurements it was not
fitted to (`efficiency_error`), and speculation at the low and high ends of its acceptance
(`acceptance_band`); the saving's band takes the same edge for every step, since one mis-estimated
efficiency moves the baseline and the quantized plan together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Mapping

from engine.common.vocab import PRECISIONS
from engine.planner.calibration import Calibration
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU, find_gpu
from engine.planner.roofline import decode_step
from engine.planner.search import Plan, PlanResult, evaluate_plan, make_deployment, plan
from engine.planner.shapes import ModelShape
from engine.planner.speculation import SpecConfig, choose_spec
from engine.planner.sweep import break_even_acceptance
from engine.planner.workload import Workload

BASELINE = "bf16"
QUANTIZED = ("fp8", "int8", "int4")  # the precisions a waterfall tries unless the workload names its own
ASSUMED_ACCEPTANCE_SPREAD = 0.2      # an assumed acceptance is banded +/- this (a measured one by its runs)
STEPS = ("baseline", "+ quantization", "+ speculation")


@lru_cache(maxsize=1)
def efficiency_error() -> tuple[float, str]:
    """(fraction, words): the median absolute error of the planner's predictions on the published
    measurements (data/published_measurements.csv), each predicted out of sample: a point the
    efficiency fit uses by its leave-one-out prediction; rows excluded from the fit are left out."""
    from engine.planner.fit import check_with_loo

    rows = [r for r in check_with_loo() if not r.get("excluded")]
    errs = sorted(abs(r.get("loo_error_pct", r["error_pct"])) / 100.0 for r in rows)
    if not errs:
        return 0.0, "no out-of-sample published measurements"
    med = errs[len(errs) // 2] if len(errs) % 2 else (errs[len(errs) // 2 - 1] + errs[len(errs) // 2]) / 2
    return med, (f"median |error| {med:.0%} of the planner on {len(errs)} published measurements, each predicted "
                 "without itself (leave-one-out for the fitted points; docs/PLANNER.md)")


def acceptance_band(sc: SpecConfig, calibration: Calibration | None, model: str) -> tuple[float, float, str]:
    """(low, high, words): the acceptance a plan's speculation may really see. Typed in: the user's own
    figure, no band. Measured: the lowest and highest run, each widened by its binomial 95% interval
    over the tokens it drafted. Assumed: +/- ASSUMED_ACCEPTANCE_SPREAD."""
    a = sc.acceptance_rate
    if sc.source == "typed in":
        return a, a, "typed in: no band"
    obs = [o for o in (calibration.acceptance if calibration else ())
           if o.matches(model, sc.draft_kind, sc.draft_model)] if sc.source.startswith("measured") else []
    if obs:
        def half(o):
            return 1.96 * math.sqrt(max(o.acceptance_rate * (1 - o.acceptance_rate), 1e-12) / max(o.drafted, 1))
        lo = max(0.0, min(o.acceptance_rate - half(o) for o in obs))
        hi = min(1.0, max(o.acceptance_rate + half(o) for o in obs))
        return lo, hi, f"the lab's {len(obs)} run(s), lowest and highest with their 95% binomial intervals"
    lo, hi = max(0.0, a - ASSUMED_ACCEPTANCE_SPREAD), min(1.0, a + ASSUMED_ACCEPTANCE_SPREAD)
    return lo, hi, f"assumed {a:g} +/- {ASSUMED_ACCEPTANCE_SPREAD:g}"


@dataclass
class SavingsStep:
    """One bar of the waterfall: the plan at this step, what it changed and why."""

    step: str
    plan: Plan | None
    usd_per_month: float | None
    delta_usd_per_month: float      # against the step before; negative saves
    cause: str
    taken: bool = True              # False: this step did not pay here, so the best plan skips it
    alternative: Plan | None = None  # a step not taken: the plan it would have been
    low_usd_per_month: float | None = None
    high_usd_per_month: float | None = None

    def to_dict(self) -> dict:
        p = self.plan
        return {"step": self.step, "plan": p.label if p else None, "precision": p.precision if p else None,
                "spec": p.spec if p else None, "gpus": p.gpus_total if p else None,
                "usd_per_month": self.usd_per_month, "delta_usd_per_month": self.delta_usd_per_month,
                "usd_per_1m_output": p.usd_per_1m_output if p else None,
                "usd_per_1m_tokens": p.usd_per_1m_tokens if p else None, "cause": self.cause, "taken": self.taken,
                "low_usd_per_month": self.low_usd_per_month, "high_usd_per_month": self.high_usd_per_month,
                "alternative": p_alt.label if (p_alt := self.alternative) is not None else None,
                "quality": p.quality["words"] if p is not None and p.quality else None}


@dataclass
class Savings:
    """The waterfall on one GPU, each precision the GPU supports beside it, and the saving."""

    gpu: str
    model: str
    steps: list[SavingsStep]
    precisions: list[dict] = field(default_factory=list)  # precision x speculation: $/month, GPUs, or why not
    saving_usd_per_month: float = 0.0
    saving_pct: float = 0.0
    saving_low_usd_per_month: float | None = None
    saving_high_usd_per_month: float | None = None
    notes: list[str] = field(default_factory=list)
    workload: dict = field(default_factory=dict)  # what was planned: model, rate, lengths, SLOs, speculation

    @property
    def baseline(self) -> SavingsStep:
        return self.steps[0]

    @property
    def best(self) -> Plan | None:
        """The last step's plan (a step not taken carries the plan before it)."""
        return self.steps[-1].plan

    @property
    def headline(self) -> str:
        b, best = self.baseline.plan, self.best
        if b is None or best is None:
            return self.notes[0] if self.notes else "no saving computed"
        within = (f" within the quality budget ({self.workload['quality_budget']})"
                  if self.workload.get("quality_budget") else "")
        if best.label == b.label:
            same = [s.alternative for s in self.steps[1:] if not s.taken and s.alternative is not None
                    and s.alternative.usd_per_month == b.usd_per_month]
            also = (f" ({', '.join(p.label for p in same)} cost the same)"
                    if same else "")
            return (f"{b.label} without speculation is already the cheapest plan here (${b.usd_per_month:,.0f}/month): "
                    f"quantization and speculation save nothing at this load{within}{also}")
        band = ""
        if self.saving_low_usd_per_month is not None and self.saving_high_usd_per_month is not None:
            band = f" (band ${self.saving_low_usd_per_month:,.0f} to ${self.saving_high_usd_per_month:,.0f})"
        return (f"{best.label} saves ${self.saving_usd_per_month:,.0f}/month{band}, {self.saving_pct:.0f}% of the "
                f"{b.label} baseline's ${b.usd_per_month:,.0f}/month{within}")

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "model": self.model, "headline": self.headline, "workload": self.workload,
                "steps": [s.to_dict() for s in self.steps], "precisions": self.precisions,
                "saving_usd_per_month": self.saving_usd_per_month, "saving_pct": self.saving_pct,
                "saving_low_usd_per_month": self.saving_low_usd_per_month,
                "saving_high_usd_per_month": self.saving_high_usd_per_month, "notes": self.notes}


# ---------------------------------------------------------------- the causes

def _why_value(p: Plan, term: str) -> float | None:
    return next((y.value for y in p.why if y.term == term and isinstance(y.value, (int, float))), None)


def quantization_cause(b: Plan, q: Plan, read_b: tuple[float, float], read_q: tuple[float, float],
                       b_at_q_tp: Plan | None = None) -> str:
    """Why the quantized plan costs what it does against the baseline, in the seed's terms. read_*: (GB of
    weights a GPU reads per decode step, ms of that step) at batch 1; b_at_q_tp: the baseline's precision
    at the quantized plan's TP, whose reasons say whether memory or latency kept the baseline wider."""
    parts = []
    wb, wq = (b.weights_gb_per_gpu or 0) * b.tp, (q.weights_gb_per_gpu or 0) * q.tp
    narrower = b_at_q_tp.reasons[0] if b_at_q_tp is not None and b_at_q_tp.reasons else ""
    if q.tp < b.tp and narrower.startswith("does not fit"):
        parts.append(f"memory: the weights shrink {wb:.1f} -> {wq:.1f} GB, so a replica fits on {q.tp} GPU(s) "
                     f"instead of {b.tp}")
    elif q.tp < b.tp:
        parts.append(f"latency: at TP {q.tp} {b.precision} {narrower[:140] or 'costs more'}; {q.precision}'s "
                     f"weights ({wq:.1f} GB against {wb:.1f}) let a replica run on {q.tp} GPU(s) instead of {b.tp}")
    else:
        parts.append(f"memory: the weights shrink {wb:.1f} -> {wq:.1f} GB per replica, leaving more for the KV "
                     f"cache (max concurrency {b.max_concurrency} -> {q.max_concurrency})")
    parts.append(f"bandwidth: a decode step at batch 1 reads {read_b[0]:.1f} -> {read_q[0]:.1f} GB per GPU, "
                 f"{read_b[1]:.2f} -> {read_q[1]:.2f} ms")
    if b.max_rate_per_replica and q.max_rate_per_replica:
        parts.append(f"capacity per replica {b.max_rate_per_replica:.3g} -> {q.max_rate_per_replica:.3g} req/s at "
                     f"the SLOs, so {b.gpus_total} -> {q.gpus_total} GPU(s)")
    return "; ".join(parts)


def speculation_cause(before: Plan, s: Plan, need: float | None = None) -> str:
    """Why speculation changes the cost: tokens per target pass against the cost of a round; `need` the
    break-even acceptance at the plan's batch (sweep.break_even_acceptance)."""
    sc = s.spec_config or {}
    e = sc.get("expected_tokens_per_step")
    speed = _why_value(s, "speculation: speedup at this batch")
    parts = [f"E = {e:.2f} tokens per target pass (acceptance {sc.get('acceptance_rate', 0):.2f}, "
             f"gamma {sc.get('gamma')}, {sc.get('draft_kind')} draft)" if e else "speculation"]
    if speed:
        parts.append(f"{speed:.2f}x per-token speed at batch {s.batch:.1f}")
    if s.batch is not None:
        parts.append(f"it pays above an acceptance of {need:.2f} at that batch" if need is not None else
                     "no acceptance pays for its rounds at that batch")
    if before.tpot_p90_s and s.tpot_p90_s:
        parts.append(f"TPOT p90 {before.tpot_p90_s * 1e3:.1f} -> {s.tpot_p90_s * 1e3:.1f} ms")
    if before.max_rate_per_replica and s.max_rate_per_replica:
        parts.append(f"capacity per replica {before.max_rate_per_replica:.3g} -> {s.max_rate_per_replica:.3g} "
                     f"req/s, so {before.gpus_total} -> {s.gpus_total} GPU(s)")
    return "; ".join(parts)


# ---------------------------------------------------------------- the waterfall

def _cheapest(plans: list[Plan], precision: str | None = None, spec: bool | None = None,
              base: str = BASELINE) -> Plan | None:
    """The cheapest feasible plan; at equal cost the simpler one (no speculation, then the baseline's
    precision), then the one with the most headroom: a step that saves nothing is not taken."""
    f = [p for p in plans if p.feasible and (precision is None or p.precision == precision)
         and (spec is None or p.spec == spec)]
    return min(f, key=lambda p: (round(p.usd_per_hr, 6), p.spec, p.precision != base, p.utilization,
                                 p.gpus_total)) if f else None


def _at_tp(plans: list[Plan], precision: str, tp: int) -> Plan | None:
    return next((p for p in plans if p.precision == precision and not p.spec and p.tp == tp), None)


def _need(p: Plan, w: Workload, model: ModelShape, gpu: GPU, sc: SpecConfig, draft: ModelShape | None,
          calibration: Calibration | None) -> float | None:
    """The break-even acceptance of a speculative plan at its own batch."""
    dep = _deploy(p, w, model, gpu, calibration, sc, draft)
    return break_even_acceptance(dep, max(p.batch or 1.0, 1.0), w.input_tokens + w.output_tokens / 2)


def _read_at_1(p: Plan, w: Workload, model: ModelShape, gpu: GPU, calibration: Calibration | None
               ) -> tuple[float, float]:
    """(GB of weights one GPU reads per decode step, that step in ms) at batch 1, mid-answer context."""
    dep = _deploy(p, w, model, gpu, calibration)
    st = decode_step(dep, 1.0, w.input_tokens + w.output_tokens / 2)
    return st.weight_bytes / 1e9, st.total * 1e3


def _replan(p: Plan, w: Workload, model: ModelShape, gpu: GPU, sc: SpecConfig | None, draft: ModelShape | None,
            calibration: Calibration | None, scale: float) -> Plan:
    dep = _deploy(p, w, model, gpu, calibration, sc if p.spec else None, draft if p.spec else None)
    return evaluate_plan(replace(dep, efficiency_scale=scale), w)


def _deploy(p: Plan, w: Workload, model: ModelShape, gpu: GPU, calibration: Calibration | None,
            sc: SpecConfig | None = None, draft: ModelShape | None = None):
    """The deployment `p` was priced as: under a quality budget, int4 at its measured configuration's group."""
    kw = {"group_size": p.quality["group_size"]} if p.quality and p.quality.get("group_size") else {}
    return make_deployment(model, gpu, p.precision, p.tp, w, sc, draft, calibration, **kw)


def _quality_words(p: Plan | None) -> str:
    """What a step's plan costs in quality, for its cause, under a quality budget ('' without one)."""
    return f"; quality: {p.quality['words']}" if p is not None and p.quality else ""


def _month(p: Plan | None) -> float | None:
    return p.usd_per_month if p is not None and p.feasible else None


def _quantized(w: Workload) -> list[str]:
    return [p for p in (w.precisions or QUANTIZED) if p not in (BASELINE, "fp16", "fp32")] or list(QUANTIZED)


def widened(w: Workload) -> Workload:
    """The workload whose one search answers both plan(w) (PlanResult.narrowed) and its savings: w's precisions,
    the baseline's and fp16, and speculation weighed both ways unless w turns it off."""
    precs = list(dict.fromkeys([*(w.precisions or PRECISIONS), BASELINE, "fp16", *_quantized(w)]))
    return replace(w, precisions=precs, spec="off" if w.spec == "off" else "auto")


def plan_with_savings(w: Workload, gpus: Mapping[str, GPU], models: Mapping[str, ModelShape],
                      calibration: Calibration | None = None) -> tuple[PlanResult, "Savings | None"]:
    """plan(w) and its savings from one search (None when no plan meets the SLOs): the answer and the table of
    plans cannot disagree."""
    searched = plan(widened(w), gpus=gpus, models=models, calibration=calibration)
    res = searched.narrowed(w)
    return res, (savings(w, gpus, models, calibration, result=searched) if res.best else None)


def savings(w: Workload, gpus: Mapping[str, GPU], models: Mapping[str, ModelShape],
            calibration: Calibration | None = None, gpu: str | None = None,
            result: PlanResult | None = None) -> Savings:
    """The waterfall for the workload on `gpu` (default: the GPU of the cheapest plan that meets the SLOs).
    `result`: plan(widened(w))'s, when the caller has it (plan_with_savings); else searched here.
    Raises PlanError for bad input, as `plan` does."""
    quant = _quantized(w)
    base_prec = BASELINE
    wf = widened(w)
    g = None
    if gpu is not None:
        g = find_gpu(str(gpu), gpus)
        if g is None:
            raise PlanError("gpu", f"unknown GPU '{gpu}'; known: {', '.join(gpus)}")
    res = result
    if res is None or res.workload != wf or (g is not None and all(p.gpu != g.name for p in res.plans)):
        res = plan(replace(wf, gpus=[g.name]) if g is not None else wf, gpus=gpus, models=models,
                   calibration=calibration)
    model = res.model
    # the GPU of the cheapest plan at the waterfall's precisions (the search may hold others: w's own)
    top = next((p for p in res.feasible if p.precision in (BASELINE, "fp16", *quant)), None)
    chosen = g.name if g is not None else (top.gpu if top else None)
    notes = []
    if chosen is None:
        return Savings("", model.name, [SavingsStep("baseline", None, None, 0.0, "no plan meets the SLOs")],
                       notes=["no plan meets the SLOs on any GPU considered: " + "; ".join(res.notes[:1])])
    g = gpus[chosen]
    on_g = [p for p in res.plans if p.gpu == chosen]
    if not g.bf16_tflops:
        base_prec = "fp16"
        notes.append(f"{chosen} has no bf16: the baseline is fp16")
    b = _cheapest(on_g, base_prec, False)
    best = _cheapest([p for p in on_g if p.precision in (base_prec, *quant)], base=base_prec)
    if b is None:
        why = next((p.reasons for p in on_g if p.precision == base_prec and not p.spec and p.reasons), ["no plan"])
        notes.append(f"{base_prec} without speculation cannot serve this workload on {chosen}: {'; '.join(why)[:200]}"
                     "; the saving is then against no baseline on this GPU")
    q = _cheapest(on_g, best.precision, False) if best is not None else None
    sc, draft = choose_spec(wf, model, models, calibration)

    steps = [SavingsStep("baseline", b, _month(b), 0.0,
                         f"{base_prec}, no speculation: {b.gpus_total} GPU(s)" if b else notes[-1])]
    prev = b
    if best is None or best.precision == base_prec:
        alt = _cheapest([x for x in on_g if x.precision in quant and not x.spec], base=base_prec)
        words = "not taken: no quantized precision is cheaper here"
        if alt is not None and prev is not None:
            words += (f" ({alt.label} costs ${alt.usd_per_month:,.0f}/month; "
                      + quantization_cause(prev, alt, _read_at_1(prev, wf, model, g, calibration),
                                           _read_at_1(alt, wf, model, g, calibration),
                                           _at_tp(on_g, base_prec, alt.tp)) + ")")
        steps.append(SavingsStep("+ quantization", prev, _month(prev), 0.0, words, False, alternative=alt))
    elif q is None:
        why = next((x.reasons for x in on_g if x.precision == best.precision and not x.spec and x.reasons), [])
        steps.append(SavingsStep("+ quantization", None, None, 0.0,
                                 f"{best.precision} alone does not meet the SLOs ({'; '.join(why)[:160]}): "
                                 "it pays only with speculation, next", False))
    else:
        steps.append(SavingsStep("+ quantization", q, _month(q), (_month(q) or 0) - (_month(prev) or 0),
                                 (quantization_cause(prev, q, _read_at_1(prev, wf, model, g, calibration),
                                                     _read_at_1(q, wf, model, g, calibration),
                                                     _at_tp(on_g, base_prec, q.tp))
                                  if prev else f"{q.precision}: {q.gpus_total} GPU(s)") + _quality_words(q)))
        prev = q
    if best is not None and best.spec:
        need = _need(best, wf, model, g, sc, draft, calibration)
        cause = speculation_cause(prev, best, need) if prev else speculation_cause(best, best, need)
        if w.budget:
            cause += "; quality: none lost (speculation is lossless: every draft token is verified by the target)"
        steps.append(SavingsStep("+ speculation", best, _month(best), (_month(best) or 0) - (_month(prev) or 0),
                                 cause))
    elif w.spec == "off":
        steps.append(SavingsStep("+ speculation", prev, _month(prev), 0.0, "not asked for (speculation off)", False))
    else:
        alt = _cheapest(on_g, prev.precision, True) if prev is not None else None
        words = ("not taken: speculation saves nothing at this load"
                 + (f" ({alt.label} costs ${alt.usd_per_month:,.0f}/month; "
                    f"{speculation_cause(prev, alt, _need(alt, wf, model, g, sc, draft, calibration))})"
                    if alt else " (no plan with speculation meets the SLOs)"))
        steps.append(SavingsStep("+ speculation", prev, _month(prev), 0.0, words, False, alternative=alt))

    out = Savings(chosen, model.name, steps, notes=notes, workload={
        "model": model.name, "request_rate": w.request_rate, "input_tokens": w.input_tokens,
        "output_tokens": w.output_tokens, "ttft_p90_s": w.ttft_p90_s, "tpot_p90_s": w.tpot_p90_s, "spec": w.spec,
        "quality_budget": w.budget.words() or None})
    out.precisions = [{"precision": p.precision, "speculation": p.spec, "plan": p.label,
                       "feasible": p.feasible, "gpus": p.gpus_total if p.feasible else None,
                       "usd_per_month": _month(p), "usd_per_1m_output": p.usd_per_1m_output if p.feasible else None,
                       "why_not": "; ".join(p.reasons)[:200]}
                      for p in _per_precision(on_g, [base_prec, *quant])]
    top, base = out.best, _month(b)
    if top is not None and base:
        out.saving_usd_per_month = base - top.usd_per_month
        out.saving_pct = 100.0 * out.saving_usd_per_month / base
    _band(out, wf, model, g, sc, draft, calibration)
    return out


def _per_precision(on_g: list[Plan], precs: list[str]) -> list[Plan]:
    """The cheapest plan at each precision, without and with speculation (or the first infeasible one)."""
    out = []
    for p in precs:
        for s in (False, True):
            c = _cheapest(on_g, p, s) or next((x for x in on_g if x.precision == p and x.spec == s), None)
            if c is not None:
                out.append(c)
    return out


def _band(out: Savings, w: Workload, model: ModelShape, g: GPU, sc: SpecConfig, draft: ModelShape | None,
          calibration: Calibration | None) -> None:
    """Each step's $/month and the saving at the band's edges: efficiency x (1 -/+ error), acceptance
    at its low and high ends; each edge applied to every step alike."""
    err, err_words = efficiency_error()
    lo_a, hi_a, a_words = acceptance_band(sc, calibration, model.name)
    edges = [(1 - err, lo_a), (1 - err, hi_a), (1 + err, lo_a), (1 + err, hi_a)]
    per_edge = []
    for scale, acc in edges:
        sc_e = replace(sc, acceptance_rate=acc)
        months = [_month(_replan(s.plan, w, model, g, sc_e, draft, calibration, scale)) if s.plan else None
                  for s in out.steps]
        per_edge.append(months)
    # the point estimate is in the band: GPU counts are whole, so each edge can land on the same side of a step
    per_edge.append([s.usd_per_month for s in out.steps])
    for i, s in enumerate(out.steps):
        vals = [m[i] for m in per_edge if m[i] is not None]
        if vals:
            s.low_usd_per_month, s.high_usd_per_month = min(vals), max(vals)
    savings_e = [m[0] - m[-1] for m in per_edge if m[0] is not None and m[-1] is not None]
    if savings_e:
        out.saving_low_usd_per_month, out.saving_high_usd_per_month = min(savings_e), max(savings_e)
    out.notes.append(f"band: kernel efficiencies x (1 -/+ {err:.0%}), {err_words}; acceptance {lo_a:.2f} to "
                     f"{hi_a:.2f} ({a_words})")
