"""Batch jobs: N output tokens a day, done within D hours, no latency SLO.

For each GPU x precision x TP x batch size that fits, a replica runs a closed loop of `batch` requests
(queueing.closed_loop_point: prefills serialize with decode rounds), so

    throughput   = the loop's output tok/s per replica
    tok per $    = throughput x 3600 / (TP x $/GPU-hour)
    replicas     = ceil(N / (throughput x D x 3600))
    $ per day    = replicas x TP x $/GPU-hour x D          (GPUs rented for the window only)
    $ per 1M     = $ per day / N x 1e6

and the plan ranks configurations by the day's bill, which is the most tokens per dollar up to whole
replicas (ties: more tokens per dollar, then fewer GPUs). A deadline shorter
than one request's own latency at that batch (its prefill plus its output tokens' rounds) cannot be met
by adding replicas and is refused.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

from engine.planner import shapes
from engine.planner.candidates import candidates, runnable
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU, find_gpu
from engine.planner.queueing import closed_loop_point
from engine.planner.roofline import Deployment
from engine.planner.shapes import ModelShape, ShapeError
from engine.planner.workload import choice_problems

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_TOKENS_PER_DAY = 1e15


@dataclass
class BatchJob:
    """What to run: `tokens_per_day` output tokens in requests of `input_tokens` in / `output_tokens` out,
    finished within `deadline_hours` of each day."""

    model: str
    tokens_per_day: float
    input_tokens: int = 512
    output_tokens: int = 256
    deadline_hours: float = 8.0
    gpus: Sequence[str] | None = None
    precisions: Sequence[str] | None = None
    tp_options: Sequence[int] = (1, 2, 4, 8)
    batches: Sequence[int] = BATCHES

    def validate(self, models: Mapping[str, ModelShape], gpus: Mapping[str, GPU]) -> ModelShape:
        probs = []
        m = None
        try:
            m = shapes.get_model(self.model, models)
        except ShapeError:
            probs.append(("model", f"unknown model '{self.model}'; known: {', '.join(models)}"))

        def pos(name, v, hi=None, integer=False):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0 \
                    or (integer and int(v) != v):
                probs.append((name, f"must be a {'whole ' if integer else ''}number > 0, got {v!r}"))
            elif hi is not None and v > hi:
                probs.append((name, f"{v:g} is beyond any job (at most {hi:g})"))
        pos("tokens_per_day", self.tokens_per_day, MAX_TOKENS_PER_DAY)
        pos("input_tokens", self.input_tokens, integer=True)
        pos("output_tokens", self.output_tokens, integer=True)
        pos("deadline_hours", self.deadline_hours, 24)
        if m is not None and not probs and self.input_tokens + self.output_tokens > m.max_context:
            probs.append(("input_tokens", f"input {self.input_tokens} + output {self.output_tokens} tokens exceed "
                          f"{m.name}'s context of {m.max_context} tokens"))
        probs += choice_problems(self.gpus, self.precisions, gpus)
        if probs:
            raise PlanError(probs)
        return m


@dataclass
class BatchOption:
    gpu: str
    precision: str
    tp: int
    batch: int
    output_tok_s: float          # per replica
    request_latency_s: float     # one request at this batch: prefill + its rounds
    tok_per_usd: float
    replicas: int
    usd_per_day: float
    usd_per_1m_output: float

    @property
    def label(self) -> str:
        return f"{self.tp}x {self.gpu} {self.precision} batch {self.batch}"

    def to_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


@dataclass
class BatchPlan:
    job: BatchJob
    options: list[BatchOption]                      # best first
    refused: list[str] = field(default_factory=list)  # configurations that cannot meet the deadline, and why

    @property
    def best(self) -> BatchOption | None:
        return self.options[0] if self.options else None

    def to_dict(self) -> dict:
        return {"job": asdict(self.job), "best": self.best.to_dict() if self.best else None,
                "options": [o.to_dict() for o in self.options], "refused": self.refused}


def _price(g: GPU) -> float:
    return float(g.price_usd_per_hr)


def plan_batch(job: BatchJob, gpus: Mapping[str, GPU], models: Mapping[str, ModelShape]) -> BatchPlan:
    """Every configuration that fits and meets the deadline, most tokens per dollar first."""
    m = job.validate(models, gpus)
    sel = [find_gpu(str(n), gpus) for n in job.gpus] if job.gpus else [g for g in gpus.values() if g.kind == "gpu"]
    precs = list(job.precisions or ("bf16", "fp8", "int8", "int4"))
    window_s = job.deadline_hours * 3600
    options, refused = [], []
    for c in runnable(candidates(sel, precs, job.tp_options), m):
        g, p, tp = c.gpu, c.precision, c.tp
        dep = Deployment(m, g, p, tp, max_batch=max(job.batches))
        for b in job.batches:
            pt = closed_loop_point(dep, b, job.input_tokens, job.output_tokens)
            if not pt.get("fits") or pt["effective_batch"] < b:
                break  # larger batches do not fit either
            latency = pt["prefill_s"] * b + job.output_tokens * pt["itl_s"]
            if latency > window_s:
                refused.append(f"{tp}x {g.name} {p} batch {b}: one request takes {latency / 3600:.2f} h, "
                               f"longer than the {job.deadline_hours:g} h deadline")
                continue
            thr = pt["output_tok_s"]
            price = _price(g) * tp
            replicas = max(1, math.ceil(job.tokens_per_day / (thr * window_s) * (1 - 1e-12)))
            usd_day = replicas * price * job.deadline_hours
            options.append(BatchOption(g.name, p, tp, b, thr, latency, thr * 3600 / price, replicas,
                                       usd_day, usd_day / job.tokens_per_day * 1e6))
    if not options and refused:
        raise PlanError("deadline_hours", f"no configuration finishes one request within {job.deadline_hours:g} h "
                        f"({refused[0]}): give the job a longer deadline")
    options.sort(key=lambda o: (round(o.usd_per_day, 6), -o.tok_per_usd, o.replicas * o.tp))
    return BatchPlan(job, options, refused)
