"""Plans: GPU x precision x speculation x TP for a workload, each sized, priced and explained.

`plan` enumerates the candidates and ranks them by cost; `evaluate_plan` sizes one (replicas from
the per-replica capacity at the SLOs, then $/hr, $/month, $/1M tokens) or says why it cannot
work; every feasible plan carries its `why` (the formula terms with their numbers) for the
dashboard's expander and `python -m engine plan --why`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Mapping

from engine.common.formulas import HOURS_PER_MONTH, SECONDS_PER_HOUR
from engine.common.vocab import PRECISIONS
from engine.planner import counts, shapes
from engine.planner.calibration import Calibration
from engine.planner.candidates import cannot_run, candidates
from engine.planner.efficiency import compute_dtype
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU, CatalogError, find_gpu, load_gpus
from engine.planner.quality_budget import Verdict, judge
from engine.planner.queueing import max_rate, serving_point
from engine.planner.roofline import (GIB, Deployment, Memory, activation_reserve, decode_step, kv_shard, memory,
                                     prefill_step, spec_step)
from engine.planner.shapes import ModelShape
from engine.planner.speculation import SpecConfig, choose_spec
from engine.planner.why import Why, ms
from engine.planner.workload import Workload

TP_OPTIONS = (1, 2, 4, 8)
# A plan needing more GPUs than any fleet holds is refused as infeasible rather than priced.
MAX_GPUS_PER_PLAN = 1_000_000


@dataclass
class Plan:
    """One candidate: GPU x precision x speculation x TP, with cost, SLO margins and the why."""

    gpu: str
    precision: str
    spec: bool
    tp: int
    feasible: bool
    replicas: int = 0
    gpus_total: int = 0
    reasons: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_mean_s: float | None = None
    ttft_margin: float | None = None       # SLO / predicted (> 1 = headroom)
    tpot_margin: float | None = None
    batch: float | None = None
    max_rate_per_replica: float | None = None
    max_concurrency: int | None = None      # per replica, KV-limited
    utilization: float | None = None        # planned rate / capacity at the SLOs
    output_tok_s_per_gpu: float | None = None
    tok_s_per_gpu: float | None = None      # input + output
    usd_per_hr: float | None = None
    usd_per_month: float | None = None
    usd_per_1m_input: float | None = None
    usd_per_1m_output: float | None = None
    usd_per_1m_tokens: float | None = None  # blended, input + output
    weights_gb_per_gpu: float | None = None
    kv_gb_per_gpu: float | None = None
    bound: str = ""
    spec_config: dict | None = None
    assumptions: list[str] = field(default_factory=list)
    why: list[Why] = field(default_factory=list)
    config: str = ""                        # under a quality budget: the measured configuration, 'int4-awq-g32'
    quality: dict | None = None             # and its quality (planner.quality_budget.Measured.to_dict())

    @property
    def label(self) -> str:
        return f"{self.tp}x {self.gpu} {self.config or self.precision}" + (" +spec" if self.spec else "")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["why"] = [w.to_dict() for w in self.why]
        d["label"] = self.label
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass
class PlanResult:
    workload: Workload
    model: ModelShape
    plans: list[Plan]
    notes: list[str] = field(default_factory=list)
    narrow: object = field(default=None, repr=False, compare=False)  # plan()'s: see narrowed()
    quality_budget: dict | None = None  # the budget's verdict (planner.quality_budget.Verdict.to_dict())

    def narrowed(self, w: Workload) -> "PlanResult":
        """The result plan(w) gives, from this one, for a workload that asks for no more than this one's (a subset
        of its precisions and speculation, every other field the same): the same plans, sort and notes, with no
        search of its own, so an answer and a table drawn from the two agree."""
        if self.narrow is None:
            raise ValueError("only a result of plan() can be narrowed")
        return self.narrow(w)

    @property
    def feasible(self) -> list[Plan]:
        return [p for p in self.plans if p.feasible]

    @property
    def best(self) -> Plan | None:
        f = self.feasible
        return f[0] if f else None

    def to_dict(self) -> dict:
        w = asdict(self.workload)
        return {"workload": w, "model": self.model.to_dict(), "notes": self.notes,
                "quality_budget": self.quality_budget,
                "best": self.best.to_dict() if self.best else None,
                "plans": [p.to_dict() for p in self.plans]}


def _count(x: float) -> str:
    return f"{x:,.0f}" if math.isfinite(x) else "infinitely many"


def _price(gpu: GPU, w: Workload) -> float:
    for k, v in (w.price_overrides or {}).items():
        if find_gpu(str(k), {gpu.name: gpu}) is not None:
            return float(v)
    p = getattr(gpu, w.price_column)
    return float(p if p is not None else gpu.price_usd_per_hr)


def _fits_reason(dep: Deployment, mem: Memory, per_request: int) -> str:
    need = (mem.weights + mem.draft_weights + mem.reserve + mem.kv_bytes(per_request)) / GIB
    draft = f" + draft {mem.draft_weights / GIB:.1f} GiB" if mem.draft_weights else ""
    return (f"weights {mem.weights / GIB:.1f} GiB{draft} + reserve {mem.reserve / GIB:.1f} GiB + KV for one request "
            f"{mem.kv_bytes(per_request) / GIB:.2f} GiB per GPU = {need:.1f} GiB > {mem.usable / GIB:.1f} GiB "
            f"usable on {dep.gpu.name} at TP {dep.tp}")


def evaluate_plan(dep: Deployment, w: Workload) -> Plan:
    """Size one candidate for the workload: replicas, latencies, cost, why; or why it cannot work."""
    g, m = dep.gpu, dep.model
    plan = Plan(g.name, dep.precision, dep.spec is not None, dep.tp, False,
                spec_config=dep.spec.to_dict() if dep.spec else None)
    I, O = w.input_tokens, w.output_tokens
    eff, eff_src = dep.efficiency()
    if g.placeholder:
        plan.assumptions.append(f"{g.name}: figures are PLACEHOLDERS until a measured probe is given")
    if dep.spec is not None and dep.spec.assumed:
        plan.assumptions.append(f"speculation {dep.spec.words()}")
    if "extrapolated:" in eff_src:
        # No published point covers this GPU generation x kernel family x precision (planner.fit).
        plan.assumptions.append(f"efficiency {eff_src}")
    for kind in ("allreduce_us", "prefill_layer_us", "per_seq_us"):
        if kind == "allreduce_us" and dep.tp == 1:
            continue
        src = dep.term(kind)[1]
        if src.startswith("extrapolated:"):
            plan.assumptions.append(src)
    why = cannot_run(m, g, dep.precision, dep.tp)
    if why:
        plan.reasons.append(why)
        return plan
    cnote = compute_dtype(g, dep.precision)[1]
    mem = memory(dep)
    per_req = I + O
    maxc = min(dep.max_batch, mem.max_concurrency(per_req))
    plan.max_concurrency = maxc
    plan.weights_gb_per_gpu = (mem.weights + mem.draft_weights) / 1e9
    if maxc < 1:
        plan.reasons.append("does not fit: " + _fits_reason(dep, mem, per_req))
        return plan
    rmax, sp = max_rate(dep, I, O, w.ttft_p90_s, w.tpot_p90_s, maxc)
    if rmax <= 0:
        # Floors = the p90s at vanishing load (batch 1, no queueing): the best this hardware can do.
        if sp is None or not sp.stable:
            plan.reasons.append(f"cannot serve even light load: {sp.limit if sp else 'unstable'}")
            return plan
        ftp, fttft = sp.tpot_p90_s, sp.ttft_p90_s
        if ftp > w.tpot_p90_s:
            plan.reasons.append(f"per-token latency floor is {ms(ftp):.1f} ms on {dep.tp}x {g.name} at "
                                f"{dep.precision} (batch 1); the SLO is {ms(w.tpot_p90_s):.1f} ms")
            plan.suggestions.append("more tensor parallelism, a GPU with more memory bandwidth, a smaller "
                                    "precision" + ("" if dep.spec else ", or speculative decoding"))
        if fttft > w.ttft_p90_s:
            plan.reasons.append(f"time-to-first-token floor is {ms(fttft):.0f} ms for {I} prompt tokens on "
                                f"{dep.tp}x {g.name}; the SLO is {ms(w.ttft_p90_s):.0f} ms")
            plan.suggestions.append("more tensor parallelism or a GPU with more compute (prefill is compute-bound)")
        if not plan.reasons:
            plan.reasons.append(f"no load meets both SLOs ({sp.limit if sp else ''})")
        return plan
    need = w.request_rate / rmax
    if not need * dep.tp <= MAX_GPUS_PER_PLAN:       # also catches an infinite need
        plan.reasons.append(f"needs {_count(need * dep.tp)} GPUs ({rmax:.3g} req/s per replica of {dep.tp}): beyond "
                            f"any fleet (a plan stops at {MAX_GPUS_PER_PLAN:,} GPUs)")
        plan.suggestions.append("split the workload into smaller services, or lower its request rate")
        return plan
    replicas = max(1, math.ceil(need * (1 - 1e-12)))
    at = serving_point(dep, w.request_rate / replicas, I, O, maxc)
    price = _price(g, w)
    n_gpu = replicas * dep.tp
    usd_hr = price * n_gpu
    out_tok_s = w.request_rate * O
    in_tok_s = w.request_rate * I
    plan.feasible = True
    plan.replicas, plan.gpus_total = replicas, n_gpu
    plan.ttft_p90_s, plan.tpot_p90_s, plan.tpot_mean_s = at.ttft_p90_s, at.tpot_p90_s, at.tpot_mean_s
    plan.ttft_margin = w.ttft_p90_s / at.ttft_p90_s
    plan.tpot_margin = w.tpot_p90_s / at.tpot_p90_s
    plan.batch = at.batch
    plan.max_rate_per_replica = rmax
    plan.utilization = w.request_rate / (replicas * rmax)
    plan.output_tok_s_per_gpu = out_tok_s / n_gpu
    plan.tok_s_per_gpu = (out_tok_s + in_tok_s) / n_gpu
    plan.usd_per_hr = usd_hr
    plan.usd_per_month = usd_hr * HOURS_PER_MONTH
    # GPU time splits into prefill (input tokens) and decode (output tokens); idle slack is shared
    # in the same proportion, so the two prices add up to the whole bill.
    usd_s = usd_hr / SECONDS_PER_HOUR
    plan.usd_per_1m_input = usd_s * at.prefill_util / in_tok_s * 1e6
    plan.usd_per_1m_output = usd_s * (1 - at.prefill_util) / out_tok_s * 1e6
    plan.usd_per_1m_tokens = usd_s / (in_tok_s + out_tok_s) * 1e6
    kv_used = at.batch * mem.kv_bytes(I + O / 2)
    plan.kv_gb_per_gpu = kv_used / 1e9
    step = decode_step(dep, max(at.batch, 1.0), I + O / 2)
    plan.bound = step.bound
    plan.why = _why(dep, w, mem, at, step, rmax, replicas, price, eff, eff_src, cnote)
    return plan


def _why(dep, w, mem, at, step, rmax, replicas, price, eff, eff_src, cnote) -> list[Why]:
    """The plan's terms, each written by the function that computed it; the search's own last."""
    g = dep.gpu
    I, O = w.input_tokens, w.output_tokens
    cdt, _ = compute_dtype(g, dep.precision)
    ys = mem.why(dep, I, O) + [
        Why("efficiency", f"{eff_src}: weights at {eff.mem_bw:.2f} of {g.mem_bw_tbs:g} TB/s, GEMMs at "
            f"{eff.compute:.2f} of {g.peak_tflops(cdt):g} {cdt} TFLOPS ({cnote})", eff.mem_bw, "fraction"),
        prefill_step(dep, I).prefill_why(dep, eff, I), at.batch_why(O)] + step.decode_why(dep, eff)
    if dep.spec is not None:
        ys += spec_step(dep, max(at.batch, 1.0), I + O / 2).why(dep.spec, step)
    return ys + at.latency_why(dep.spec is not None) + [
        Why("capacity per replica", f"largest rate with TTFT p90 <= {ms(w.ttft_p90_s):.0f} ms and TPOT p90 <= "
            f"{ms(w.tpot_p90_s):.1f} ms", rmax, "req/s"),
        Why("replicas", f"ceil({w.request_rate:g} req/s / {rmax:.3g})", replicas, ""),
        Why("GPUs", f"{replicas} replicas * TP {dep.tp}", replicas * dep.tp, ""),
        Why("price", f"{g.name}: {g.price_source[:120]}", price, "$/GPU-hr"),
        Why("$/month", f"{replicas * dep.tp} GPUs * ${price:g}/hr * {HOURS_PER_MONTH:g} h",
            replicas * dep.tp * price * HOURS_PER_MONTH, "$")]


def make_deployment(model: ModelShape, gpu: GPU, precision: str, tp: int = 1, w: Workload | None = None,
                    spec: SpecConfig | None = None, draft: ModelShape | None = None,
                    calibration: Calibration | None = None, **kw) -> Deployment:
    """A Deployment with the workload's knobs (family, KV dtype, quantization flags...)."""
    if w is not None:
        kw.setdefault("family", w.family)
        kw.setdefault("kv_dtype", w.kv_dtype)
        kw.setdefault("quantize_embeddings", w.quantize_embeddings)
        kw.setdefault("quantize_head", w.quantize_head)
        kw.setdefault("group_size", w.group_size)
        kw.setdefault("max_batch", w.max_batch)
        kw.setdefault("mem_util", w.mem_util)
    return Deployment(model, gpu, precision, tp, spec=spec, draft=draft, calibration=calibration, **kw)


def plan(w: Workload, gpus: Mapping[str, GPU] | None = None, models: Mapping[str, ModelShape] | None = None,
         calibration: Calibration | None = None, overrides: list[dict] | None = None,
         probe: Mapping | None = None) -> PlanResult:
    """Enumerate GPU x precision x speculation x TP for the workload and rank by cost.

    Feasible plans come first, cheapest $/hr first (ties: more TPOT headroom); infeasible ones
    follow with their reasons. Raises PlanError listing every invalid input field.
    """
    models = models if models is not None else shapes.load_models()
    if gpus is None:
        try:
            if probe is None and calibration is not None and calibration.machine_bw_gbs:
                probe = {"mem_bw_gbs": calibration.machine_bw_gbs}
            gpus = load_gpus(overrides, probe)
        except CatalogError as e:
            raise PlanError([("gpu_overrides." + f, msg) for f, msg in e.problems]) from None
    model = w.validate(models, gpus)
    sel = [find_gpu(str(n), gpus) for n in w.gpus] if w.gpus else [g for g in gpus.values() if g.kind == "gpu"]
    precs = list(w.precisions or PRECISIONS)
    tps = sorted(set(w.tp_options or TP_OPTIONS))
    notes = []
    spec_opts: list[tuple[SpecConfig | None, ModelShape | None]] = []
    if w.spec in ("auto", "off"):
        spec_opts.append((None, None))
    if w.spec in ("auto", "on"):
        sc, dm = choose_spec(w, model, models, calibration)
        spec_opts.append((sc, dm))
        notes.append(f"speculation: {sc.draft_kind}" + (f" draft {sc.draft_model}" if sc.draft_model else "")
                     + f", gamma {sc.gamma}, {sc.words()}; "
                     f"E = {sc.expected_tokens:.2f} tokens per target step")
    verdict = judge(calibration.quality if calibration is not None else None, model.name, w.budget, precs) \
        if w.budget else None

    def price(c, **kw) -> Plan:
        return evaluate_plan(make_deployment(model, c.gpu, c.precision, c.tp, w, c.spec, c.draft, calibration, **kw),
                             w)

    searched = [_within(verdict, c, price) for c in candidates(sel, precs, tps, spec_opts)]

    gpu_pos = {g.name: i for i, g in enumerate(sel)}

    def result(asked: Workload) -> PlanResult:
        if replace(asked, precisions=w.precisions, spec=w.spec) != w:
            raise ValueError("a narrowed workload differs from the searched one beyond precisions and speculation")
        a_precs = list(asked.precisions or PRECISIONS)
        if not set(a_precs) <= set(precs) or (asked.spec != w.spec and w.spec != "auto"):
            raise ValueError(f"the search did not weigh {asked.precisions} with speculation {asked.spec!r}")
        with_spec = {"off": (False,), "on": (True,), "auto": (False, True)}[asked.spec]
        plans = [x for x in searched if x.precision in a_precs and x.spec in with_spec]
        plans.sort(key=lambda x: (gpu_pos[x.gpu], a_precs.index(x.precision)))  # the order plan(asked) weighs them
        # Cheapest first; at equal cost, the plan with the most spare capacity at the SLOs.
        plans.sort(key=lambda x: (not x.feasible, x.usd_per_hr if x.feasible else math.inf,
                                  x.utilization if x.feasible else 0, x.gpus_total))
        out = [n for n in notes if asked.spec != "off"]  # the speculation setting, when it is weighed
        out += verdict.notes(a_precs) if verdict else []
        if not any(p.feasible for p in plans):
            out.append(_global_suggestion(model, asked, sel, a_precs, tps, gpus, plans))
        out.append("p90s: M/D/1 prefill queue + normal approximation of per-request decode time (docs/PLANNER.md)")
        return PlanResult(asked, model, plans, out, result, verdict.to_dict() if verdict else None)

    return result(w)


def _within(verdict: Verdict | None, c, evaluate) -> Plan:
    """The candidate's plan under the quality budget: priced as the configuration the budget picks for its precision
    (int4 at that configuration's group), or, when none meets the budget, sized but not usable, with the reason."""
    if verdict is None:
        return evaluate(c)
    m = verdict.pick(c.precision)
    if m is None:
        p = evaluate(c)
        p.feasible = False
        p.reasons.insert(0, f"outside the quality budget ({verdict.budget.words()}): "
                         f"{verdict.excluded.get(c.precision, 'no record')}")
        return p
    p = evaluate(c, **({"group_size": m.group_size} if m.group_size else {}))
    p.config, p.quality = m.config, m.to_dict(verdict.budget.kld_stat)
    return p


def _need_gib(model: ModelShape, w: Workload, p: str, tp: int) -> float:
    """GiB one GPU needs at TP `tp`: weights/tp + reserve + KV for one request, over mem_util 0.9."""
    wb = counts.weight_bytes(model, p, w.quantize_embeddings, w.quantize_head, w.group_size)
    kv = counts.kv_cache_bytes(model, w.input_tokens + w.output_tokens, w.kv_dtype) * kv_shard(model, tp)
    return (wb / tp + kv + activation_reserve(model, tp)) / (w.mem_util or 0.9) / GIB


def _global_suggestion(model, w, sel, precs, tps, gpus, plans) -> str:
    """When nothing is feasible: what would fit (a smaller precision, or how much GPU memory)."""
    if any("beyond any fleet" in r for p in plans for r in p.reasons):
        return (f"{w.request_rate:g} req/s of {model.name} needs over {MAX_GPUS_PER_PLAN:,} GPUs on every plan that "
                "could serve it, more than any fleet holds: split the workload into smaller services")
    tmax = max(tps)
    need_sel = {p: _need_gib(model, w, p, tmax) for p in precs}
    need_all = {p: _need_gib(model, w, p, tmax) for p in PRECISIONS}
    biggest = max((g.memory_gb for g in sel), default=0)
    p_sel = min(need_sel, key=need_sel.get)
    if need_sel[p_sel] <= biggest:
        return ("no plan meets the SLOs: see each plan's reasons (latency floors); relax the SLOs, allow more TP, "
                "or add faster GPUs")
    p_all = min(need_all, key=need_all.get)
    bigger = [g.name for g in gpus.values() if g.kind == "gpu" and g.memory_gb >= need_sel[p_sel]]
    msg = (f"{model.name} does not fit even at TP {tmax}: at {p_sel} one GPU needs >= {need_sel[p_sel]:.0f} GiB "
           f"(largest selected GPU: {biggest:g} GiB)")
    if need_all[p_all] <= biggest and p_all not in precs:
        msg += f"; use {p_all} ({need_all[p_all]:.0f} GiB per GPU at TP {tmax})"
    else:
        msg += f"; even {p_all} needs {need_all[p_all]:.0f} GiB per GPU at TP {tmax}"
    msg += f", or a GPU with >= {need_sel[p_sel]:.0f} GB" + (f" ({', '.join(bigger)})" if bigger else "")
    return msg
