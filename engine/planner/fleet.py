"""A fleet of models: several models, each with its own traffic and SLOs, on one GPU kind,
one model per GPU against several models sharing a GPU where memory allows.

For each precision the GPU runs, each model at TP 1:

- its capacity alone on a GPU at its SLOs (queueing.max_rate), so its replicas n = ceil(rate / capacity)
  and each replica's share of a GPU's time, u = rate / n / capacity;
- each replica's memory: its weights, the activation reserve, and the KV cache at its peak concurrency:
  the decode batch at its rate (Little's law, queueing.serving_point) times PEAK_FACTOR, rounded up, at
  input + output tokens per request.

One model per GPU needs the sum of n. Packed, replicas go first-fit by decreasing memory onto GPUs whose
replicas' memory stays within the usable memory and whose shares add to at most 1: co-located models
take turns on the GPU, so their busy fractions add (an assumption: it ignores the interference of one
model's prefill on another's tail latency). Quantization is what makes several fit.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

from engine.common.formulas import HOURS_PER_MONTH
from engine.planner import shapes
from engine.planner.candidates import candidates, runnable
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU, find_gpu
from engine.planner.queueing import max_rate, serving_point
from engine.planner.roofline import GIB, Deployment, memory
from engine.planner.shapes import ShapeError

PEAK_FACTOR = 2.0  # the KV cache is sized for twice the mean decode batch: bursts above the mean


@dataclass(frozen=True)
class FleetModel:
    """One model of the fleet with its own traffic and SLOs."""

    model: str
    request_rate: float
    input_tokens: int = 512
    output_tokens: int = 256
    ttft_p90_s: float = 2.0
    tpot_p90_s: float = 0.05


def parse_fleet(text: str, input_tokens: int, output_tokens: int, ttft_p90_s: float,
                tpot_p90_s: float) -> list[FleetModel]:
    """'model:rate, model:rate' (a catalog model and requests/s each) as FleetModels with these lengths and SLOs."""
    items = []
    for part in [x.strip() for x in (text or "").split(",") if x.strip()]:
        name, _, rate = part.rpartition(":")
        try:
            items.append(FleetModel(name.strip(), float(rate), int(input_tokens), int(output_tokens),
                                    float(ttft_p90_s), float(tpot_p90_s)))
        except ValueError:
            raise PlanError("fleet", f"'{part}' is not model:rate (a catalog model and requests/s)") from None
    return items


@dataclass
class Replica:
    model: str
    share: float        # of one GPU's time
    memory_gib: float   # weights + reserve + KV at peak concurrency
    weights_gib: float
    kv_gib: float
    peak_concurrency: int


@dataclass
class FleetOption:
    """The fleet at one precision: one model per GPU against packed."""

    precision: str
    gpus_separate: int
    gpus_packed: int
    usable_gib: float
    bins: list[list[Replica]] = field(default_factory=list)
    usd_per_gpu_hr: float = 0.0

    @property
    def usd_per_month_separate(self) -> float:
        return self.gpus_separate * self.usd_per_gpu_hr * HOURS_PER_MONTH

    @property
    def usd_per_month_packed(self) -> float:
        return self.gpus_packed * self.usd_per_gpu_hr * HOURS_PER_MONTH

    def to_dict(self) -> dict:
        return {"precision": self.precision, "gpus_separate": self.gpus_separate, "gpus_packed": self.gpus_packed,
                "usd_per_month_separate": self.usd_per_month_separate,
                "usd_per_month_packed": self.usd_per_month_packed, "usable_gib": self.usable_gib,
                "bins": [[asdict(r) for r in b] for b in self.bins]}


@dataclass
class FleetPlan:
    gpu: str
    options: list[FleetOption]          # one per precision that fits every model, fewest packed GPUs first
    refused: list[str] = field(default_factory=list)  # precision: which model does not fit, and why

    @property
    def best(self) -> FleetOption | None:
        return self.options[0] if self.options else None

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "best": self.best.to_dict() if self.best else None,
                "options": [o.to_dict() for o in self.options], "refused": self.refused}


def _replicas(fm: FleetModel, m, g: GPU, precision: str) -> list[Replica] | str:
    """A model's replicas at this precision on one GPU each, or why it cannot run so."""
    dep = Deployment(m, g, precision, 1)
    mem = memory(dep)
    per_req = fm.input_tokens + fm.output_tokens
    maxc = min(dep.max_batch, mem.max_concurrency(per_req))
    if maxc < 1:
        need = (mem.weights + mem.reserve + mem.kv_bytes(per_req)) / GIB
        return (f"{fm.model} does not fit on one {g.name} at {precision}: weights {mem.weights / GIB:.1f} GiB + "
                f"reserve + one request's KV = {need:.1f} GiB > {mem.usable / GIB:.1f} GiB usable")
    cap, _ = max_rate(dep, fm.input_tokens, fm.output_tokens, fm.ttft_p90_s, fm.tpot_p90_s, maxc)
    if cap <= 0:
        return f"{fm.model} cannot meet its SLOs on one {g.name} at {precision} even alone"
    n = max(1, math.ceil(fm.request_rate / cap * (1 - 1e-12)))
    rate = fm.request_rate / n
    sp = serving_point(dep, rate, fm.input_tokens, fm.output_tokens, maxc)
    peak = max(1, min(maxc, math.ceil(PEAK_FACTOR * sp.batch)))
    kv = mem.kv_bytes(per_req) * peak
    total = (mem.weights + mem.reserve + kv) / GIB
    return [Replica(fm.model, rate / cap, total, mem.weights / GIB, kv / GIB, peak) for _ in range(n)]


def pack(replicas: Sequence[Replica], usable_gib: float) -> list[list[Replica]]:
    """First fit by decreasing memory: a GPU takes a replica while memory and time shares both fit."""
    bins: list[list[Replica]] = []
    for r in sorted(replicas, key=lambda r: -r.memory_gib):
        for b in bins:
            if sum(x.memory_gib for x in b) + r.memory_gib <= usable_gib and sum(x.share for x in b) + r.share <= 1:
                b.append(r)
                break
        else:
            bins.append([r])
    return bins


def plan_fleet(fleet: Sequence[FleetModel], gpu: str, gpus: Mapping[str, GPU], models,
               precisions: Sequence[str] = ("bf16", "fp8", "int8", "int4")) -> FleetPlan:
    """The fleet on `gpu` at each precision: GPUs one model per GPU against packed."""
    if not fleet:
        raise PlanError("fleet", "give at least one model with its request rate")
    g = find_gpu(str(gpu), gpus)
    if g is None:
        raise PlanError("gpu", f"unknown GPU '{gpu}'; known: {', '.join(gpus)}")
    probs = []
    shaped = []
    for i, fm in enumerate(fleet):
        try:
            shaped.append(shapes.get_model(fm.model, models))
        except ShapeError:
            probs.append((f"fleet[{i}].model", f"unknown model '{fm.model}'; known: {', '.join(models)}"))
        for name in ("request_rate", "ttft_p90_s", "tpot_p90_s"):
            v = getattr(fm, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                probs.append((f"fleet[{i}].{name}", f"must be a number > 0, got {v!r}"))
    if probs:
        raise PlanError(probs)
    price = float(g.price_usd_per_hr)
    options, refused = [], []
    for p in (c.precision for c in runnable(candidates([g], precisions), shaped[0])):  # one GPU each: TP 1
        reps, why = [], None
        for fm, m in zip(fleet, shaped):
            r = _replicas(fm, m, g, p)
            if isinstance(r, str):
                why = r
                break
            reps += r
        if why:
            refused.append(f"{p}: {why}")
            continue
        usable = memory(Deployment(shaped[0], g, p, 1)).usable / GIB
        bins = pack(reps, usable)
        options.append(FleetOption(p, len(reps), len(bins), usable, bins, price))
    if not options:
        raise PlanError("fleet", f"no precision runs every model on one {g.name}: " + "; ".join(refused)[:400]
                        + ": use a GPU with more memory, or plan that model on its own with tensor parallelism")
    options.sort(key=lambda o: (o.gpus_packed, o.gpus_separate))
    return FleetPlan(g.name, options, refused)
