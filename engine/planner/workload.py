"""What to plan for (Workload) and the checks its fields must pass before any arithmetic.

`Workload.validate` reports every bad field at once in one PlanError: non-numbers, NaN, infinities,
negatives, and values beyond any real deployment (the MAX_* limits below: such a value is a
typing or unit mistake, and planning it would only print an absurd fleet).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from engine.common.vocab import KLD_STATS, MAX_GAMMA
from engine.planner import shapes
from engine.planner.efficiency import FAMILIES
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU, find_gpu
from engine.planner.roofline import DEFAULT_MAX_BATCH
from engine.planner.quality_budget import QualityBudget
from engine.planner.shapes import ModelShape, ShapeError
from engine.planner.speculation import SPEC_DRAFT_KINDS

# Beyond these an input is a mistake, not a workload (docs/PLANNER.md, "Absurd inputs").
MAX_REQUEST_RATE = 1e6          # req/s: far above the largest public LLM services (tens of thousands/s)
MIN_REQUEST_RATE = 1e-6         # req/s: one request every 12 days; below it $/1M tokens only measures idling
MAX_TOKENS = 10_000_000         # prompt or output tokens per request: ~75x the largest context we ship
MAX_USD_PER_GPU_HOUR = 1000.0   # ~80x the dearest GPU-hour in data/gpus.csv ($12.29, H100 on Azure)
PRICE_COLUMNS = ("price_usd_per_hr", "price_low_usd_per_hr", "price_high_usd_per_hr")


def choice_problems(names: Sequence[str] | None, precisions: Sequence[str] | None,
                    gpus: Mapping[str, GPU]) -> list[tuple[str, str]]:
    """(field, message) for each GPU or precision a plan was restricted to that does not exist."""
    probs = [("gpus", f"unknown GPU '{g}'; known: {', '.join(gpus)}") for g in names or []
             if find_gpu(str(g), gpus) is None]
    return probs + [("precisions", f"unknown precision '{p}'; choose from {', '.join(shapes.PLAN_PRECISIONS)}")
                    for p in precisions or [] if p not in shapes.PLAN_PRECISIONS]


@dataclass
class Workload:
    """What to plan for. Times in seconds, rates in requests/s, lengths in tokens.

    gpus/precisions/tp_options restrict the search (None = all shipped GPUs except "this
    machine", all precisions, TP 1/2/4/8). spec: "auto" (plans with and without speculation),
    "off", or "on". acceptance_rate/gamma: typed-in speculation settings (else measured by the lab,
    else an assumed default, flagged in each plan). price_overrides: {gpu: $/GPU-hr} for this plan.
    """

    model: str
    request_rate: float
    input_tokens: int
    output_tokens: int
    ttft_p90_s: float = 2.0
    tpot_p90_s: float = 0.05
    gpus: Sequence[str] | None = None
    precisions: Sequence[str] | None = None
    tp_options: Sequence[int] | None = None
    spec: str = "auto"
    acceptance_rate: float | None = None
    gamma: int | None = None
    draft_kind: str | None = None
    draft_model: str | None = None
    family: str = "serving"
    kv_dtype: str = "bf16"
    quantize_embeddings: bool = False
    quantize_head: bool = False
    group_size: int = 64
    max_batch: int = DEFAULT_MAX_BATCH
    mem_util: float | None = None
    price_overrides: Mapping[str, float] | None = None
    price_column: str = "price_usd_per_hr"   # or price_low_usd_per_hr / price_high_usd_per_hr
    max_kld: float | None = None             # quality budget (planner.quality_budget): KLD, nats/token
    max_pass_drop: float | None = None       # and points of pass@1 below the fp32 reference
    kld_stat: str = "mean"                   # which KLD statistic max_kld limits: mean, median or p99

    @property
    def budget(self) -> QualityBudget:
        return QualityBudget(self.max_kld, self.max_pass_drop, self.kld_stat)

    def validate(self, models: Mapping[str, ModelShape], gpus: Mapping[str, GPU]) -> ModelShape:
        """Check every field; raise one PlanError listing all problems. Returns the model shape."""
        probs: list[tuple[str, str]] = []

        def num(name, v, lo=0.0, strict=True, integer=False, hi=None, beyond="", least=None, below=""):
            """A finite number above `lo`; above `hi` (or under `least`) it is refused with `beyond`
            (or `below`): what is wrong and the fix."""
            if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
                probs.append((name, f"must be a number, got {v!r}"))
                return False
            if math.isnan(v) or math.isinf(v):
                probs.append((name, f"must be finite, got {v}"))
                return False
            if integer and int(v) != v:
                probs.append((name, f"must be a whole number, got {v}"))
                return False
            if (strict and v <= lo) or (not strict and v < lo):
                probs.append((name, f"must be {'>' if strict else '>='} {lo:g}, got {v:g}"))
                return False
            shown = f"{v:,}" if isinstance(v, int) else f"{v:g}"
            if hi is not None and v > hi:
                probs.append((name, f"{shown} {beyond}"))
                return False
            if least is not None and v < least:
                probs.append((name, f"{shown} {below}"))
                return False
            return True

        m = None
        try:
            m = shapes.get_model(self.model, models)
        except ShapeError:
            probs.append(("model", f"unknown model '{self.model}'; known: {', '.join(models)}"))
        num("request_rate", self.request_rate, hi=MAX_REQUEST_RATE,
            beyond=f"requests/s is beyond any deployment (at most {MAX_REQUEST_RATE:g}): plan one service or region "
                   "at a time, in requests per second (not per day)", least=MIN_REQUEST_RATE,
            below=f"requests/s is below any deployment (at least {MIN_REQUEST_RATE:g}, one request every 12 days): "
                  "give requests per second (not per month)")
        tokens_beyond = (f"tokens per request is beyond any model's context (at most {MAX_TOKENS:,}): give the tokens "
                         "of one request, not of a day's traffic")
        ok_i = num("input_tokens", self.input_tokens, integer=True, hi=MAX_TOKENS, beyond=tokens_beyond)
        ok_o = num("output_tokens", self.output_tokens, integer=True, hi=MAX_TOKENS, beyond=tokens_beyond)
        if m is not None and ok_i and ok_o and self.input_tokens + self.output_tokens > m.max_context:
            probs.append(("input_tokens", f"input {self.input_tokens} + output {self.output_tokens} tokens exceed "
                          f"{m.name}'s context of {m.max_context} tokens"))
        num("ttft_p90_s", self.ttft_p90_s)
        num("tpot_p90_s", self.tpot_p90_s)
        probs += choice_problems(self.gpus, self.precisions, gpus)
        for t in self.tp_options or []:
            if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 8:
                probs.append(("tp_options", f"tensor-parallel size must be an integer 1-8, got {t!r}"))
        if self.spec not in ("auto", "on", "off"):
            probs.append(("spec", f"must be auto, on or off, got {self.spec!r}"))
        if self.acceptance_rate is not None:
            a = self.acceptance_rate
            if isinstance(a, bool) or not isinstance(a, (int, float)) or math.isnan(a) or not 0 <= a < 1:
                probs.append(("acceptance_rate", f"must be in [0, 1) (at 1 every draft token would be accepted, "
                              f"forever), got {a!r}"))
        if self.gamma is not None and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                       or not 1 <= self.gamma <= MAX_GAMMA):
            probs.append(("gamma", f"must be an integer 1-{MAX_GAMMA}, got {self.gamma!r}"))
        if self.draft_kind is not None and self.draft_kind not in SPEC_DRAFT_KINDS:
            probs.append(("draft_kind", f"must be one of {', '.join(SPEC_DRAFT_KINDS)}, got {self.draft_kind!r}"))
        if self.draft_model is not None:
            try:
                shapes.get_model(self.draft_model, models)
            except ShapeError:
                probs.append(("draft_model", f"unknown model '{self.draft_model}'; known: {', '.join(models)}"))
        if self.family not in FAMILIES:
            probs.append(("family", f"unknown kernel family '{self.family}'; known: {', '.join(FAMILIES)}"))
        if self.kv_dtype not in shapes.KV_DTYPES:
            probs.append(("kv_dtype", f"must be one of {', '.join(shapes.KV_DTYPES)}, got {self.kv_dtype!r}"))
        if not isinstance(self.group_size, int) or isinstance(self.group_size, bool) or self.group_size <= 0:
            probs.append(("group_size", f"must be a positive integer, got {self.group_size!r}"))
        num("max_batch", self.max_batch, integer=True)
        if self.mem_util is not None and num("mem_util", self.mem_util) and self.mem_util > 1:
            probs.append(("mem_util", f"must be <= 1, got {self.mem_util:g}"))
        for g, price in (self.price_overrides or {}).items():
            if find_gpu(str(g), gpus) is None:
                probs.append(("price_overrides", f"unknown GPU '{g}'; known: {', '.join(gpus)}"))
            num(f"price_overrides[{g}]", price, strict=False, hi=MAX_USD_PER_GPU_HOUR,
                beyond=f"$/GPU-hour is beyond any GPU's price (at most ${MAX_USD_PER_GPU_HOUR:,.0f}): give dollars per "
                       "GPU per hour")
        for name in ("max_kld", "max_pass_drop"):
            if getattr(self, name) is not None:
                num(name, getattr(self, name), strict=False)
        if self.kld_stat not in KLD_STATS:
            probs.append(("kld_stat", f"unknown KLD statistic {self.kld_stat!r}: one of {', '.join(KLD_STATS)}"))
        if self.price_column not in PRICE_COLUMNS:
            probs.append(("price_column", "must be price_usd_per_hr, price_low_usd_per_hr or price_high_usd_per_hr"))
        if probs:
            raise PlanError(probs)
        return m
