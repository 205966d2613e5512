"""Cost & capacity planner: a roofline model of LLM serving on production GPUs.

What it answers: for a model and a workload (request rate, prompt/output lengths, latency SLOs),
how many GPUs of which kind, at which precision, with or without speculative decoding, and what
that costs per million tokens and per month. Every number is a formula over datasheet figures,
shapes (engine/shapes.py), documented efficiency fractions, or the lab's measurements
(`calibrate`). docs/PLANNER.md states the formulas, defaults and sources, and checks the model
against published measurements (`check_published`).

Core formulas (times per GPU of a tensor-parallel group of `tp` GPUs):
  decode step   = max(W/(e_w*BW) + K/(e_kv*BW), F/(e_c*PEAK)) + 2*layers*allreduce(tp) + overhead
                  W weight bytes read (all but the embedding table), K KV bytes read, F FLOPs
  prefill       = max(F_prefill/(e_c*PEAK), W/(e_w*BW)) + allreduces + overhead
  allreduce     = latency + 2*(tp-1)/tp * bytes / (f_link * interconnect)        (ring)
  speculation   E = (1 - a^(g+1)) / (1 - a) tokens per target step;
                  step = verify(g+1 tokens per sequence) + g * draft step
  serving       Poisson arrivals, continuous batching: batch B solves B = rate*O*TPOT(B) (Little);
                  p90s from an M/D/1 prefill queue and a normal approximation (see `serving_point`).
All functions are pure; dataclasses carry results, and each plan carries a "why" list of the
formula terms with their numbers, for the dashboard's expander.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from engine.planner import shapes
from engine.common.errors import UserError
from engine.common.paths import DATA
from engine.planner.gpus import GPU, HOURS_PER_MONTH, CatalogError, find_gpu, load_gpus
from engine.planner.shapes import ModelShape, PRECISIONS, ShapeError

GIB = 2 ** 30
Z90 = 1.2816            # standard normal 90th percentile
PUBLISHED_PATH = DATA / "published_measurements.csv"


# ============================================================ errors

class PlanError(UserError):
    """Invalid planner input. `problems` lists every (field, message) found, not just the first.

    PlanError("rate", "must be > 0") or PlanError([("rate", "..."), ("model", "...")]).
    """

    def __init__(self, field_or_problems, message: str | None = None):
        if isinstance(field_or_problems, str):
            problems = [(field_or_problems, message or "invalid")]
        else:
            problems = list(field_or_problems)
        self.problems: list[tuple[str, str]] = problems
        self.field, self.message = problems[0] if problems else ("", "")
        text = "; ".join(f"{f}: {m}" for f, m in problems)
        super().__init__(f"invalid plan input: {text}", "correct the fields named above")

    def to_dict(self) -> dict:
        return {"error": "invalid input", "problems": [{"field": f, "message": m} for f, m in self.problems]}


# ============================================================ efficiency defaults

@dataclass(frozen=True)
class Efficiency:
    """Fractions of datasheet peak that real kernels reach.

    mem_bw: of memory bandwidth, for the weight reads of a decode step (GEMV-like, batch small).
    compute: of dense tensor peak, for GEMMs (prefill, large decode batches).
    """

    mem_bw: float
    compute: float
    source: str = ""


@dataclass(frozen=True)
class KernelFamily:
    """A software stack: per-precision efficiencies and fixed per-step costs."""

    name: str
    description: str
    efficiency: Mapping[str, Efficiency]
    kv_mem_bw: float              # attention kernels reading the KV cache
    step_overhead_ms: float       # per forward pass: scheduling, sampling, (graph) launch
    per_layer_overhead_ms: float  # per layer per forward: kernel launches when not graph-captured
    source: str


_SRC_BF16 = ("decode GEMV at batch 1 reaches ~0.7-0.85 of datasheet bandwidth in tuned stacks "
             "(gpt-fast README: 1397 GB/s of a power-limited A100's ~1700 GB/s = 0.82; vLLM/TensorRT-LLM "
             "similar); large GEMMs reach ~0.6-0.75 of dense peak (H200 here: 790 of 989 TFLOP/s = 0.80 "
             "for an 8192^3 matmul, less for serving shapes)")
_SERVING_EFF = {
    "fp32": Efficiency(0.80, 0.60, "as bf16; fp32 compute uses the non-tensor FP32 peak"),
    "bf16": Efficiency(0.80, 0.60, _SRC_BF16),
    "fp16": Efficiency(0.80, 0.60, _SRC_BF16),
    "fp8": Efficiency(0.65, 0.55, "W8A8 fp8 GEMM (cutlass scaled_mm) adds per-token activation quantization; "
                                  "small-M fp8 GEMMs stream weights less efficiently than bf16 GEMV: assumption"),
    "int8": Efficiency(0.70, 0.45, "weight-only int8 GEMV dequantizes in registers (TensorRT-LLM/Marlin-class "
                                   "kernels); at large batch the dequantization costs compute: assumption"),
    "int4": Efficiency(0.65, 0.40, "Marlin (Frantar et al. 2024) keeps W4A16 near the bandwidth limit up to "
                                   "batch 16-32, then dequantization makes it compute-heavy: assumption"),
    "nf4": Efficiency(0.35, 0.25, "bitsandbytes 4-bit kernels are far from the bandwidth limit (dequantize "
                                  "then GEMM): assumption, calibrate from the lab"),
    "llm.int8": Efficiency(0.25, 0.25, "bitsandbytes LLM.int8 decomposes outliers into a second fp16 matmul; "
                                       "slower than fp16 (Dettmers et al. 2022): assumption, calibrate from the lab"),
}
_CPU_EFF = {
    "fp32": Efficiency(0.60, 0.50, "placeholder until calibrated from the lab's runs"),
    "bf16": Efficiency(0.30, 0.20, "placeholder (CPUs without AMX convert bf16 in software)"),
    "fp16": Efficiency(0.20, 0.10, "placeholder (fp16 on CPU is emulated)"),
    "int8": Efficiency(0.50, 0.40, "placeholder until calibrated"),
    "int4": Efficiency(0.40, 0.30, "placeholder until calibrated"),
    "nf4": Efficiency(0.10, 0.10, "placeholder (bitsandbytes on CPU)"),
    "llm.int8": Efficiency(0.10, 0.10, "placeholder (bitsandbytes on CPU)"),
    "fp8": Efficiency(0.20, 0.10, "placeholder (fp8 is dequantized in software)"),
}
FAMILIES: dict[str, KernelFamily] = {
    "serving": KernelFamily(
        "serving", "production engines (vLLM, TensorRT-LLM, SGLang): CUDA graphs, Marlin int4, cutlass fp8",
        _SERVING_EFF, 0.80, 0.5, 0.0,
        "per-step overhead 0.5 ms: scheduler, sampling and detokenization of a CUDA-graph engine (assumption)"),
    "torch-compile": KernelFamily(
        "torch-compile", "PyTorch-native compiled decode (gpt-fast style): CUDA graphs, no scheduler",
        _SERVING_EFF, 0.80, 0.15, 0.0, "per-step overhead 0.15 ms: one graph replay and argmax (assumption)"),
    "hf-eager": KernelFamily(
        "hf-eager", "Hugging Face transformers in eager mode (research code: Spec-Bench, Medusa, EAGLE)",
        _SERVING_EFF, 0.80, 1.0, 0.43,
        "per-layer overhead 0.43 ms: Medusa reports ~45 tok/s for Vicuna-7B on an A100 in eager HF (22 ms/token) "
        "vs an 8.3 ms bandwidth floor; the 14 ms difference over 32 layers"),
    "cpu": KernelFamily(
        "cpu", "the lab's CPU kernels on this machine (replace with `calibrate`)", _CPU_EFF, 0.60, 1.0, 0.05,
        "placeholders; calibrate from the lab's run records"),
    "lab-cuda": KernelFamily(
        "lab-cuda", "the lab's own CUDA kernels (defaults = serving until calibrated from cuda records)",
        _SERVING_EFF, 0.80, 0.3, 0.02, "defaults; calibrate from the lab's cuda run records"),
}
BNB_PRECISIONS = ("nf4", "llm.int8")

# Tensor-parallel all-reduce. NVLink/PCIe datasheet figures are bidirectional per GPU; NCCL ring
# all-reduce bus bandwidth reaches ~40% of that (e.g. ~360 GB/s of H100's 900 GB/s) and small
# messages cost a fixed latency of ~10 us over NVLink, ~25 us over PCIe (assumptions; see docs).
ALLREDUCE_BW_FRACTION = 0.40
ALLREDUCE_LATENCY_US = {"nvlink": 10.0, "pcie": 25.0}
DEFAULT_MEM_UTIL = {"gpu": 0.90, "cpu": 0.75}   # vLLM's gpu_memory_utilization default is 0.90
DEFAULT_MAX_BATCH = 256                          # vLLM's default max_num_seqs
PREFILL_CHUNK_TOKENS = 8192                      # activation memory reserved for one prefill chunk
TP_OPTIONS = (1, 2, 4, 8)
ASSUMED_ACCEPTANCE = 0.6                         # used only when nothing is measured or typed
ASSUMED_GAMMA = 4
HEADS_DRAFT_COST_RATIO = 0.06


# ============================================================ calibration

@dataclass(frozen=True)
class Fit:
    """Least-squares fit of the effective bandwidth fraction for one precision."""

    precision: str
    mem_bw_frac: float
    n: int
    overhead_s: float
    residuals: tuple[float, ...]      # (measured - fitted) / measured time per token, per record
    run_ids: tuple[str, ...]

    @property
    def rmse_rel(self) -> float:
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals)) if self.residuals else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rmse_rel"] = self.rmse_rel
        return d


@dataclass(frozen=True)
class AcceptanceObs:
    model: str
    draft_kind: str
    draft_model: str | None
    acceptance_rate: float
    gamma: float
    mean_acceptance_length: float | None
    run_id: str
    drafted: int = 1                 # draft tokens behind the rate (the weight in averages)
    draft_precision: str | None = None


@dataclass(frozen=True)
class Calibration:
    """What the lab's records say: bandwidth fractions per (device, precision) and acceptance rates."""

    fits: Mapping[tuple[str, str], Fit] = field(default_factory=dict)      # (device, precision) -> Fit
    acceptance: tuple[AcceptanceObs, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()                               # (run_id, reason)
    machine_bw_gbs: float | None = None
    # (device, precision) -> median prefill FLOP rate the lab achieved (TFLOP/s), from ttft records
    prefill_tflops: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def fit_for(self, device: str, precision: str) -> Fit | None:
        return self.fits.get((device, precision))

    def acceptance_for(self, model: str | None = None, draft_kind: str | None = None,
                       draft_model: str | None = None) -> tuple[float, float, int, str] | None:
        """Mean measured acceptance (a, gamma, n, description), most specific match first."""
        obs = list(self.acceptance)
        tiers = [
            [o for o in obs if o.model == model and o.draft_kind == draft_kind and o.draft_model == draft_model],
            [o for o in obs if o.model == model and o.draft_kind == draft_kind],
            [o for o in obs if o.model == model],
            [o for o in obs if o.draft_kind == draft_kind],
            obs,
        ]
        for t in tiers:
            if t:
                wsum = sum(o.drafted for o in t)
                a = sum(o.acceptance_rate * o.drafted for o in t) / wsum
                g = sum(o.gamma * o.drafted for o in t) / wsum
                kinds = sorted({f"{o.model} + {o.draft_kind}" + (f" {o.draft_model}" if o.draft_model else "")
                                for o in t})
                return a, g, len(t), f"measured by the lab ({len(t)} run(s): {', '.join(kinds)})"
        return None

    def draft_precision_for(self, model: str | None, draft_kind: str | None) -> str | None:
        """The draft precision the lab measured most for this target and draft kind."""
        ps = [o.draft_precision for o in self.acceptance
              if o.model == model and o.draft_kind == draft_kind and o.draft_precision]
        return max(set(ps), key=ps.count) if ps else None

    def to_dict(self) -> dict:
        return {"fits": [{"device": d, **f.to_dict()} for (d, _), f in self.fits.items()],
                "prefill_tflops": [{"device": d, "precision": p, "tflops": v}
                                   for (d, p), v in self.prefill_tflops.items()],
                "acceptance": [asdict(o) for o in self.acceptance],
                "skipped": [{"run_id": r, "reason": w} for r, w in self.skipped],
                "machine_bw_gbs": self.machine_bw_gbs}


def _get(d, *keys, default=None):
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return default
        d = d[k]
    return d


def _finite_pos(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _record_precision(cfg: Mapping) -> str:
    """The precision of a record's config: config.quant.precision, else config.precision without
    the label's group suffix ('int4-g64' -> 'int4')."""
    p = _get(cfg, "quant", "precision") or cfg.get("precision") or ""
    return str(p).lower().split("-g")[0]


def record_bytes_per_token(rec: Mapping, models: Mapping[str, ModelShape] | None = None) -> float | None:
    """Bytes a decode token reads, from a run record: metrics.bytes_per_token if present, else
    weight_bytes (or computed from the model shape) + KV bytes read (half the allocated cache,
    the mean over a run that fills it)."""
    m = rec.get("metrics") or {}
    bpt = m.get("bytes_per_token")
    if _finite_pos(bpt):
        return float(bpt)
    wb = m.get("weight_bytes")
    if not _finite_pos(wb):
        try:
            shape = shapes.get_model(_get(rec, "config", "model") or "", models)
        except ShapeError:
            return None
        cfg = rec.get("config") or {}
        base = "fp32" if _get(rec, "machine", "device", default="cpu") == "cpu" else None
        try:
            wb = shapes.decode_read_bytes(shape, _record_precision(cfg), 1,
                                          bool(cfg.get("quantize_embeddings", False)),
                                          bool(cfg.get("quantize_head", True)), int(cfg.get("group_size", 64)),
                                          base_dtype=base)
        except ShapeError:
            return None
    kv = m.get("kv_bytes")
    batch = _get(rec, "config", "batch_size", default=1) or 1
    kv_read = 0.5 * float(kv) / batch if _finite_pos(kv) else 0.0
    return float(wb) + kv_read


def calibrate(records: Iterable[Mapping], fit_overhead: bool = False, overhead_s: float = 0.0,
              models: Mapping[str, ModelShape] | None = None) -> Calibration:
    """Fit the effective bandwidth fraction per (device, precision) from the lab's run records.

    Model: seconds per token t_i = x_i / (f * BW_i) + c, with x_i the bytes a token reads and BW_i
    the machine's measured read bandwidth. Least squares through the origin gives 1/f =
    sum(z*y)/sum(z^2), z = x/BW, y = t - c; with fit_overhead (and >= 3 records of different sizes)
    c is fitted too (clamped >= 0). Residuals are relative errors of the fitted time per token.
    Speculative records are not used for bandwidth (drafting is in their time) but give acceptance
    rates. Records missing what a fit needs are listed in `skipped` with the reason; nothing raises.
    """
    groups: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    prefill: dict[tuple[str, str], list[float]] = {}
    acc: list[AcceptanceObs] = []
    skipped: list[tuple[str, str]] = []
    bws: list[float] = []
    for i, rec in enumerate(records or []):
        if not isinstance(rec, Mapping):
            skipped.append((f"#{i}", "not a record dict"))
            continue
        rid = str(rec.get("run_id") or f"#{i}")
        cfg, met = rec.get("config") or {}, rec.get("metrics") or {}
        device = str(_get(rec, "machine", "device") or cfg.get("device") or "cpu")
        device = "cuda" if device.startswith("cuda") else device
        prec = _record_precision(cfg)
        spec = met.get("spec")
        if isinstance(spec, Mapping):
            a = spec.get("acceptance_rate")
            g = spec.get("gamma") or spec.get("mean_gamma") or _get(cfg, "draft", "gamma")
            mal = spec.get("mean_acceptance_length")
            if not _finite_pos(a) and _finite_pos(mal) and _finite_pos(g):
                a = acceptance_from_mean_length(float(mal), float(g))
            if isinstance(a, (int, float)) and 0 <= a <= 1 and _finite_pos(g):
                dk = spec.get("draft_kind") or _get(cfg, "draft", "kind") or "model"
                dm = _get(cfg, "draft", "model")
                dp = _get(cfg, "draft", "precision")
                drafted = spec.get("drafted")
                acc.append(AcceptanceObs(str(cfg.get("model") or "?"), str(dk), dm, float(a), float(g),
                                         float(mal) if _finite_pos(mal) else None, rid,
                                         int(drafted) if _finite_pos(drafted) else 1,
                                         str(dp).lower().split("-g")[0] if dp else None))
            else:
                skipped.append((rid, "speculative record without a usable acceptance_rate/gamma"))
            continue
        if prec not in PRECISIONS:
            skipped.append((rid, f"unknown precision '{prec}'"))
            continue
        tok_s, bw = met.get("decode_tok_s"), met.get("mem_bw_gbs")
        if not _finite_pos(tok_s):
            skipped.append((rid, "no decode_tok_s"))
            continue
        if not _finite_pos(bw):
            skipped.append((rid, "no mem_bw_gbs (the machine's measured read bandwidth)"))
            continue
        pf = _record_prefill_tflops(rec, prec, models)
        if pf:
            prefill.setdefault((device, prec), []).append(pf)
        x = record_bytes_per_token(rec, models)
        if x is None:
            skipped.append((rid, "cannot tell bytes per token (no bytes_per_token/weight_bytes, unknown model)"))
            continue
        if device == "cpu":
            bws.append(float(bw))
        groups.setdefault((device, prec), []).append((x / (bw * 1e9), 1.0 / tok_s, rid))
    fits = {}
    for key, pts in groups.items():
        z = [p[0] for p in pts]
        t = [p[1] for p in pts]
        c = overhead_s
        if fit_overhead and len(pts) >= 3 and max(z) > 1.05 * min(z):
            n = len(pts)
            zm, tm = sum(z) / n, sum(t) / n
            szz = sum((a - zm) ** 2 for a in z)
            slope = sum((a - zm) * (b - tm) for a, b in zip(z, t)) / szz
            c = max(0.0, tm - slope * zm)
        y = [b - c for b in t]
        szz = sum(a * a for a in z)
        inv_f = sum(a * b for a, b in zip(z, y)) / szz
        if inv_f <= 0:
            continue
        f = 1.0 / inv_f
        res = tuple((b - (a / f + c)) / b for a, b in zip(z, t))
        fits[key] = Fit(key[1], f, len(pts), c, res, tuple(p[2] for p in pts))
    bws.sort()
    pf_med = {k: sorted(v)[len(v) // 2] for k, v in prefill.items()}
    return Calibration(fits, tuple(acc), tuple(skipped), bws[len(bws) // 2] if bws else None, pf_med)


def _record_prefill_tflops(rec: Mapping, precision: str, models) -> float | None:
    """Prefill FLOP rate a record achieved: batch * prefill_flops(prompt per sequence) / prefill_s."""
    m, cfg = rec.get("metrics") or {}, rec.get("config") or {}
    ps, pt = m.get("prefill_s"), m.get("prompt_tokens")
    if not (_finite_pos(ps) and _finite_pos(pt)):
        return None
    try:
        shape = shapes.get_model(cfg.get("model") or "", models)
    except ShapeError:
        return None
    batch = cfg.get("batch_size") or 1
    per_seq = max(1, int(round(pt / batch)))
    return batch * shapes.prefill_flops(shape, per_seq) / ps / 1e12


# ============================================================ speculative decoding

def expected_tokens_per_step(a: float, gamma: float) -> float:
    """E = (1 - a^(g+1)) / (1 - a): tokens per target step with per-token acceptance a (i.i.d.),
    counting the bonus/resampled token (Leviathan et al. 2023, eq. 1). a=1 gives g+1."""
    if not 0 <= a <= 1:
        raise PlanError("acceptance_rate", f"{a} is outside [0, 1]")
    if a >= 1 - 1e-12:
        return gamma + 1.0
    return (1 - a ** (gamma + 1)) / (1 - a)


def acceptance_from_mean_length(mean_len: float, gamma: float) -> float:
    """Invert E(a, g) for a (bisection; E is increasing in a)."""
    if mean_len <= 1:
        return 0.0
    if mean_len >= gamma + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(mid, gamma) < mean_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def tokens_per_step_variance(a: float, gamma: int) -> float:
    """Variance of tokens emitted per step: P(X=k) = a^(k-1)(1-a) for k <= g, P(X=g+1) = a^g."""
    g = int(round(gamma))
    ps = [(a ** (k - 1)) * (1 - a) for k in range(1, g + 1)] + [a ** g]
    mean = sum(k * p for k, p in zip(range(1, g + 2), ps))
    return sum((k - mean) ** 2 * p for k, p in zip(range(1, g + 2), ps))


def spec_speedup(a: float, gamma: int, draft_cost_ratio: float, verify_cost_ratio: float = 1.0) -> float:
    """Speedup over plain decoding: E / (verify/plain + gamma * draft/plain) (Leviathan et al. eq. 3
    with c = draft_cost_ratio; verify_cost_ratio > 1 once the verify pass is compute-bound)."""
    return expected_tokens_per_step(a, gamma) / (verify_cost_ratio + gamma * draft_cost_ratio)


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings for a plan.

    draft_kind: model (a smaller model, `draft_model`), self (the target's own weights at
    `draft_precision`), ngram (prompt lookup: no model cost), heads (Medusa/EAGLE-style: cost
    `draft_cost_ratio` of a plain step). draft_precision None = the target's precision (self: int4).
    verify_tokens: tokens per sequence the target scores per step (default gamma + 1; a tree is more).
    """

    acceptance_rate: float
    gamma: int = ASSUMED_GAMMA
    draft_kind: str = "model"
    draft_model: str | None = None
    draft_precision: str | None = None
    draft_cost_ratio: float | None = None
    verify_tokens: int | None = None
    source: str = "user"

    @property
    def expected_tokens(self) -> float:
        return expected_tokens_per_step(self.acceptance_rate, self.gamma)

    def __post_init__(self):
        if not 0 <= self.acceptance_rate <= 1:
            raise PlanError("acceptance_rate", f"must be in [0, 1], got {self.acceptance_rate}")
        if self.gamma < 1:
            raise PlanError("gamma", f"must be >= 1, got {self.gamma}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["expected_tokens_per_step"] = self.expected_tokens
        return d


def default_draft(model: ModelShape, models: Mapping[str, ModelShape]) -> ModelShape | None:
    """A usable draft from the catalog: same family and tokenizer, at most half the target's
    parameters; a sibling of the same line (qwen2.5-coder-* for qwen2.5-coder-*) first, then the
    smallest. None when the catalog has none (plans then use n-gram drafting)."""
    prefix = model.name.rsplit("-", 1)[0]
    # Same tokenizer: vocab sizes may differ by padding (Qwen2.5: 151936 small, 152064 large).
    same = [m for m in models.values() if m.family == model.family and abs(m.vocab - model.vocab) <= 0.01 * model.vocab
            and m.name != model.name and shapes.param_count(m) * 2 <= shapes.param_count(model)
            and m.extra_linear_params == 0]
    if not same:
        return None
    return min(same, key=lambda m: (m.name.rsplit("-", 1)[0] != prefix, shapes.param_count(m)))


# ============================================================ deployment and roofline

def _half(gpu: GPU) -> str:
    return "bf16" if gpu.bf16_tflops else "fp16"


def compute_dtype(gpu: GPU, precision: str) -> tuple[str | None, str]:
    """(dtype whose peak the matmuls run at, explanation); dtype None = not runnable on this GPU."""
    if gpu.kind == "cpu":
        d = precision if precision in ("bf16", "fp16") else "fp32"
        return (d if gpu.peak_tflops(d) else "fp32"), "CPU: the lab computes in fp32 except bf16/fp16 runs"
    if precision == "fp32":
        return ("fp32" if gpu.fp32_tflops else None), "fp32 runs on the non-tensor FP32 units"
    if precision == "fp16":
        return ("fp16" if gpu.fp16_tflops else None), "fp16 tensor cores"
    if precision == "bf16":
        if not gpu.bf16_tflops:
            return None, f"{gpu.name} has no bf16 support: use fp16"
        return "bf16", "bf16 tensor cores"
    if precision == "fp8":
        if gpu.fp8_tflops:
            return "fp8", "W8A8: fp8 weights and activations on fp8 tensor cores"
        if not gpu.bf16_tflops:
            return None, f"{gpu.name} is older than Ampere: fp8 weight-only kernels (Marlin) need sm80+; use int8/int4"
        return _half(gpu), f"{gpu.name} has no fp8 tensor cores: fp8 weight-only, 16-bit compute"
    if precision == "llm.int8":
        if gpu.int8_tops:
            return "int8", "LLM.int8: int8 tensor cores plus an fp16 outlier matmul"
        return _half(gpu), "LLM.int8 without int8 tensor cores"
    return _half(gpu), f"{precision} weight-only: weights dequantized in registers, {_half(gpu)} compute"


@dataclass(frozen=True)
class Deployment:
    """One model replica: a model on `tp` GPUs of one kind, at one precision, maybe speculating."""

    model: ModelShape
    gpu: GPU
    precision: str
    tp: int = 1
    family: str = "serving"
    kv_dtype: str = "bf16"
    quantize_embeddings: bool = False
    quantize_head: bool = False
    group_size: int = 64
    spec: SpecConfig | None = None
    draft: ModelShape | None = None
    mem_util: float | None = None
    reserve_gib: float | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    calibration: Calibration | None = field(default=None, compare=False, hash=False, repr=False)
    # Per-instance memo of roofline coefficients: planning evaluates thousands of steps per plan.
    # init=False: dataclasses.replace() must start a fresh memo, never share the original's.
    _memo: dict = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)

    @property
    def label(self) -> str:
        s = f"{self.model.name} {self.precision} on {self.tp}x {self.gpu.name}"
        if self.spec:
            s += f" + spec ({self.spec.draft_kind}{' ' + self.draft.name if self.draft else ''}, g={self.spec.gamma})"
        return s

    def family_obj(self) -> KernelFamily:
        if self.gpu.kind == "cpu":
            return FAMILIES["cpu"]
        if self.family not in FAMILIES:
            raise PlanError("family", f"unknown kernel family '{self.family}'; known: {', '.join(FAMILIES)}")
        return FAMILIES[self.family]

    def efficiency(self, precision: str | None = None) -> tuple[Efficiency, str]:
        """Efficiency for `precision` (default: the deployment's), and where it comes from."""
        p = precision or self.precision
        fam = self.family_obj()
        dev = "cpu" if self.gpu.kind == "cpu" else "cuda"
        fit = None
        if self.calibration is not None and (dev == "cpu" or self.family == "lab-cuda"):
            fit = self.calibration.fit_for(dev, p)
        base = fam.efficiency[p]
        comp, comp_src = base.compute, ""
        if self.calibration is not None and (dev == "cpu" or self.family == "lab-cuda"):
            achieved = self.calibration.prefill_tflops.get((dev, p))
            cdt = compute_dtype(self.gpu, p)[0]
            peak = self.gpu.peak_tflops(cdt) if cdt else None
            if achieved and peak:
                # For this machine the peak is a placeholder: only achieved = fraction * peak matters.
                comp, comp_src = achieved / peak, f"; prefill {achieved:.3g} TFLOP/s measured"
        if fit is not None:
            return (Efficiency(fit.mem_bw_frac, comp, "calibrated"),
                    f"calibrated from {fit.n} lab run(s) on {dev} (fit rmse {fit.rmse_rel:.0%}){comp_src}")
        if comp_src:
            return Efficiency(base.mem_bw, comp, "calibrated prefill"), f"{fam.name} default{comp_src}"
        if p in BNB_PRECISIONS and fam.name == "serving":
            return base, f"{fam.name} default for bitsandbytes kernels"
        return base, f"{fam.name} default"


@dataclass(frozen=True)
class Step:
    """Cost of one forward pass of a replica, per GPU, with the roofline terms."""

    tokens: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    t_weights: float
    t_kv: float
    t_compute: float
    t_comm: float
    t_overhead: float

    @property
    def t_memory(self) -> float:
        return self.t_weights + self.t_kv

    @property
    def total(self) -> float:
        return max(self.t_memory, self.t_compute) + self.t_comm + self.t_overhead

    @property
    def bound(self) -> str:
        return "compute" if self.t_compute > self.t_memory else "memory"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(t_memory=self.t_memory, total=self.total, bound=self.bound)
        return d


def allreduce_time(nbytes: float, tp: int, gpu: GPU) -> float:
    """Ring all-reduce: latency + 2*(tp-1)/tp * bytes / (ALLREDUCE_BW_FRACTION * interconnect)."""
    if tp <= 1:
        return 0.0
    link = "nvlink" if gpu.nvlink else "pcie"
    bw = max(gpu.interconnect_gbs, 1e-3) * 1e9 * ALLREDUCE_BW_FRACTION
    return ALLREDUCE_LATENCY_US[link] * 1e-6 + 2.0 * (tp - 1) / tp * nbytes / bw


def _kv_shard(model: ModelShape, tp: int) -> float:
    """Fraction of a token's KV one GPU holds: KV heads are split over tp, replicated past kv_heads."""
    return math.ceil(model.kv_heads / tp) / model.kv_heads


@dataclass(frozen=True)
class _Coef:
    """Per-GPU roofline coefficients of one (model, precision) in a deployment."""

    w_fixed: float        # bytes read every step whatever the batch (dense blocks, head, norms)
    w_experts: float      # MoE expert bytes (a fraction is read, depending on tokens)
    moe_keep: float       # 1 - active/experts (0 for dense)
    row: float            # embedding row bytes per token
    kv_tok: float         # KV bytes per cached token
    f_lin: float          # FLOPs per token for the matmuls (incl. head)
    f_attn: float         # FLOPs per token per cached token
    inv_bw_w: float       # s/byte for weights
    inv_bw_kv: float      # s/byte for KV
    inv_flops: float      # s/FLOP
    comm_lat: float       # s per step of all-reduce latency (2 per layer)
    comm_tok: float       # s per token of all-reduce transfer
    overhead: float       # s per forward pass


def _coef(dep: Deployment, model: ModelShape, precision: str, layers_overhead: bool = True) -> _Coef:
    key = (model.name, precision, layers_overhead)
    c = dep._memo.get(key)
    if c is not None:
        return c
    gpu, tp = dep.gpu, dep.tp
    eff, _ = dep.efficiency(precision)
    fam = dep.family_obj()
    wb = shapes.weight_bytes_breakdown(model, precision, dep.quantize_embeddings, dep.quantize_head, dep.group_size)
    head = wb.embedding if wb.head_shares_embedding else wb.head
    cdt, _ = compute_dtype(gpu, precision)
    peak = (gpu.peak_tflops(cdt) if cdt else None) or 1e-9
    bw = gpu.mem_bw_tbs * 1e12
    if tp > 1:
        link_bw = max(gpu.interconnect_gbs, 1e-3) * 1e9 * ALLREDUCE_BW_FRACTION
        lat = ALLREDUCE_LATENCY_US["nvlink" if gpu.nvlink else "pcie"] * 1e-6
        comm_lat = 2 * model.layers * lat
        comm_tok = 2 * model.layers * 2.0 * (tp - 1) / tp * model.hidden * 2 / link_bw
    else:
        comm_lat = comm_tok = 0.0
    c = _Coef(
        w_fixed=(wb.blocks - wb.experts + head + wb.small) / tp,
        w_experts=wb.experts / tp,
        moe_keep=(1.0 - model.active_experts / model.experts) if model.is_moe else 0.0,
        row=wb.embedding / model.vocab / tp,
        kv_tok=shapes.kv_bytes_per_token(model, dep.kv_dtype) * _kv_shard(model, tp),
        f_lin=2.0 * shapes.matmul_params_per_token(model) / tp,
        f_attn=4.0 * model.layers * model.q_dim / tp,
        inv_bw_w=1.0 / (eff.mem_bw * bw),
        inv_bw_kv=1.0 / (fam.kv_mem_bw * bw),
        inv_flops=1.0 / (eff.compute * peak * 1e12),
        comm_lat=comm_lat,
        comm_tok=comm_tok,
        overhead=(fam.step_overhead_ms + (fam.per_layer_overhead_ms * model.layers if layers_overhead else 0)) / 1e3,
    )
    dep._memo[key] = c
    return c


def _step_parts(c: _Coef, batch: float, context: float, tokens_per_seq: float):
    tokens = batch * tokens_per_seq
    w = c.w_fixed + c.row * tokens
    if c.w_experts:
        w += c.w_experts * (1.0 - c.moe_keep ** max(1.0, tokens))
    kv = batch * context * c.kv_tok
    flops = tokens * (c.f_lin + c.f_attn * context)
    t_comm = c.comm_lat + c.comm_tok * tokens if c.comm_lat else 0.0
    return tokens, w, kv, flops, t_comm


def _step_time(c: _Coef, batch: float, context: float, tokens_per_seq: float = 1.0) -> float:
    tokens, w, kv, flops, t_comm = _step_parts(c, batch, context, tokens_per_seq)
    return max(w * c.inv_bw_w + kv * c.inv_bw_kv, flops * c.inv_flops) + t_comm + c.overhead


def forward_cost(dep: Deployment, model: ModelShape, precision: str, batch: float, context: float,
                 tokens_per_seq: float = 1.0, layers_overhead: bool = True) -> Step:
    """Roofline cost of one decode-style forward pass: `batch` sequences, each scoring
    `tokens_per_seq` new tokens against `context` cached tokens (verify passes use > 1).
    Weight bytes are all but the embedding table (its rows only), MoE experts as touched."""
    c = _coef(dep, model, precision, layers_overhead)
    tokens, w, kv, flops, t_comm = _step_parts(c, batch, context, tokens_per_seq)
    return Step(tokens, w, kv, flops, w * c.inv_bw_w, kv * c.inv_bw_kv, flops * c.inv_flops, t_comm, c.overhead)


def decode_step(dep: Deployment, batch: float, context: float, tokens_per_seq: float = 1.0) -> Step:
    """One plain decode step of the target model (see module docstring)."""
    return forward_cost(dep, dep.model, dep.precision, batch, context, tokens_per_seq)


def prefill_step(dep: Deployment, tokens: int, batch: int = 1) -> Step:
    """Prefill `batch` prompts of `tokens` tokens: compute-bound GEMMs, weights read once."""
    key = ("prefill", tokens, batch)
    hit = dep._memo.get(key)
    if hit is not None:
        return hit
    gpu, tp, m = dep.gpu, dep.tp, dep.model
    eff, _ = dep.efficiency()
    fam = dep.family_obj()
    wbytes = shapes.weight_bytes(m, dep.precision, dep.quantize_embeddings, dep.quantize_head, dep.group_size) / tp
    kvw = batch * tokens * shapes.kv_bytes_per_token(m, dep.kv_dtype) * _kv_shard(m, tp)
    flops = batch * shapes.prefill_flops(m, tokens) / tp
    cdt, _ = compute_dtype(gpu, dep.precision)
    peak = (gpu.peak_tflops(cdt) if cdt else None) or 1e-9
    bw = gpu.mem_bw_tbs * 1e12
    t_comm = 2 * m.layers * allreduce_time(batch * tokens * m.hidden * 2, tp, gpu)
    t_over = (fam.step_overhead_ms + fam.per_layer_overhead_ms * m.layers) / 1e3
    st = Step(batch * tokens, wbytes, kvw, flops, wbytes / (eff.mem_bw * bw), kvw / (fam.kv_mem_bw * bw),
              flops / (eff.compute * peak * 1e12), t_comm, t_over)
    dep._memo[key] = st
    return st


@dataclass(frozen=True)
class SpecStep:
    """One speculative round for a batch: target verify + drafting, and tokens it yields."""

    verify: Step
    draft: Step | None
    draft_steps: int
    draft_time: float
    expected_tokens: float

    @property
    def total(self) -> float:
        return self.verify.total + self.draft_time


def spec_step(dep: Deployment, batch: float, context: float) -> SpecStep:
    """verify(g+1 tokens per sequence, or `verify_tokens`) + g * draft step (draft kinds: SpecConfig)."""
    sp = dep.spec
    assert sp is not None
    vt = sp.verify_tokens or sp.gamma + 1
    verify = forward_cost(dep, dep.model, dep.precision, batch, context, vt)
    draft, dtime = None, 0.0
    if sp.draft_cost_ratio is not None:
        dtime = sp.gamma * sp.draft_cost_ratio * decode_step(dep, batch, context).total
    elif sp.draft_kind in ("model", "self"):
        dm = dep.draft or dep.model
        dp = sp.draft_precision or ("int4" if sp.draft_kind == "self" else dep.precision)
        draft = forward_cost(dep, dm, dp, batch, context, 1.0)
        dtime = sp.gamma * draft.total
    return SpecStep(verify, draft, sp.gamma if draft else 0, dtime, sp.expected_tokens)


def per_token_step(dep: Deployment, batch: float, context: float) -> tuple[float, float]:
    """(seconds per round, tokens per sequence per round) for plain or speculative decoding."""
    sp = dep.spec
    if sp is None:
        return _step_time(_coef(dep, dep.model, dep.precision), batch, context), 1.0
    # Same arithmetic as spec_step, without building dataclasses (this runs in the solver loops).
    verify = _step_time(_coef(dep, dep.model, dep.precision), batch, context, sp.verify_tokens or sp.gamma + 1)
    if sp.draft_cost_ratio is not None:
        draft = sp.gamma * sp.draft_cost_ratio * _step_time(_coef(dep, dep.model, dep.precision), batch, context)
    elif sp.draft_kind in ("model", "self"):
        dp = sp.draft_precision or ("int4" if sp.draft_kind == "self" else dep.precision)
        draft = sp.gamma * _step_time(_coef(dep, dep.draft or dep.model, dp), batch, context)
    else:
        draft = 0.0
    return verify + draft, sp.expected_tokens


# ============================================================ memory

@dataclass(frozen=True)
class Memory:
    """Per-GPU memory of a replica (bytes) and what the KV budget allows."""

    usable: float
    weights: float
    draft_weights: float
    reserve: float
    kv_per_token: float          # per GPU, target + draft
    kv_budget_tokens: float      # tokens of KV the replica can hold
    fits: bool

    def max_concurrency(self, tokens_per_request: int) -> int:
        return max(0, int(self.kv_budget_tokens // max(1, tokens_per_request)))

    def to_dict(self) -> dict:
        return asdict(self)


def activation_reserve(model: ModelShape, tp: int) -> float:
    """Bytes held outside weights and KV: 1 GiB (CUDA context, graphs, workspaces; assumption) plus
    the activations of one PREFILL_CHUNK_TOKENS chunk: tokens*(2*intermediate + 4*hidden + q + 2*kv)*2 B / tp."""
    width = 2 * model.intermediate + 4 * model.hidden + model.q_dim + 2 * model.kv_dim
    return GIB + PREFILL_CHUNK_TOKENS * width * 2 / tp


def memory(dep: Deployment) -> Memory:
    """Weights, reserve and KV budget of one GPU of the replica."""
    g, m, tp = dep.gpu, dep.model, dep.tp
    util = dep.mem_util if dep.mem_util is not None else DEFAULT_MEM_UTIL.get(g.kind, 0.9)
    usable = g.memory_gb * GIB * util
    w = shapes.weight_bytes(m, dep.precision, dep.quantize_embeddings, dep.quantize_head, dep.group_size) / tp
    kvpt = shapes.kv_bytes_per_token(m, dep.kv_dtype) * _kv_shard(m, tp)
    dw = 0.0
    if dep.spec is not None and dep.spec.draft_kind in ("model", "self") and dep.spec.draft_cost_ratio is None:
        dm = dep.draft or m
        dp = dep.spec.draft_precision or ("int4" if dep.spec.draft_kind == "self" else dep.precision)
        dw = shapes.weight_bytes(dm, dp, dep.quantize_embeddings, dep.quantize_head, dep.group_size) / tp
        kvpt += shapes.kv_bytes_per_token(dm, dep.kv_dtype) * _kv_shard(dm, tp)
    reserve = dep.reserve_gib * GIB if dep.reserve_gib is not None else activation_reserve(m, tp)
    free = usable - w - dw - reserve
    return Memory(usable, w, dw, reserve, kvpt, max(0.0, free / kvpt), free > 0)


# ============================================================ serving model

@dataclass(frozen=True)
class ServingPoint:
    """Steady state of one replica under Poisson arrivals at `rate` req/s."""

    rate: float
    stable: bool
    batch: float                 # mean sequences decoding together (Little's law)
    prefill_util: float          # share of GPU time spent in prefill
    prefill_s: float
    step_s: float                # one decode round at `batch`
    tokens_per_step: float
    ttft_mean_s: float
    ttft_p90_s: float
    tpot_mean_s: float
    tpot_p90_s: float
    limit: str = ""              # why it is unstable, if it is

    def to_dict(self) -> dict:
        return asdict(self)


def _unstable(rate, why, prefill_s=math.inf) -> ServingPoint:
    inf = math.inf
    return ServingPoint(rate, False, inf, inf, prefill_s, inf, 1.0, inf, inf, inf, inf, why)


def serving_point(dep: Deployment, rate: float, input_tokens: int, output_tokens: int,
                  max_concurrency: float | None = None) -> ServingPoint:
    """Mean-value model of continuous batching for one replica.

    - Prefill takes T_p per request; rho = rate*T_p is the share of GPU time spent prefilling, and
      decode steps stall while it runs (additive; real engines overlap a little: conservative).
    - Decode: B sequences share each round of time s(B) and get E tokens each, so the mean
      per-token latency is TPOT = s(max(1,B))/(E*(1-rho)); Little's law B = rate*O*TPOT fixes B.
      B is solved by bisection (the right side is convex in B, so there is one crossing).
    - TTFT = queueing wait + T_p + one decode round in flight. The wait is M/D/1 with mean
      W = rho*T_p/(2(1-rho)); its tail is approximated as exponential with mean W/rho beyond the
      probability rho of waiting at all, so p90 wait = (W/rho)*ln(10*rho) for rho > 0.1, else 0.
    - p90 TPOT (per request, over its O tokens): decode time D = N*s + P*T_p, with N rounds
      (renewal variance O*Var(X)/E^3 of the tokens-per-round X) and P ~ Poisson(rate*D) prefills of
      other requests landing meanwhile; p90 = mean + 1.2816*sd (normal approximation) / O.
    """
    I, O = input_tokens, output_tokens
    ctx = I + O / 2.0
    tp_ = prefill_step(dep, I).total
    rho = rate * tp_
    if rho >= 1:
        return _unstable(rate, f"prefill alone needs {rho:.0%} of the GPU time", tp_)
    cap = float(min(dep.max_batch, max_concurrency if max_concurrency is not None else dep.max_batch))
    if cap < 1:
        return _unstable(rate, "not even one request fits in KV memory", tp_)

    # A decoding request is itself in the batch: it sees at least batch 1 (max(1, B)), which also
    # makes the light-load limit the batch-1 floor that infeasibility messages quote.
    def h(b):
        s, e = per_token_step(dep, max(1.0, b), ctx)
        return rate * O * s / (e * (1 - rho)) - b

    if h(cap) > 0:
        return _unstable(rate, f"needs more than {cap:.0f} concurrent sequences (KV memory / max batch)", tp_)
    lo, hi = 0.0, cap
    for _ in range(32):
        mid = (lo + hi) / 2
        if h(mid) > 0:
            lo = mid
        else:
            hi = mid
    b = hi
    s, e = per_token_step(dep, max(1.0, b), ctx)
    tpot = s / (e * (1 - rho))
    w_mean = rho * tp_ / (2 * (1 - rho))
    w_p90 = (w_mean / rho) * math.log(10 * rho) if rho > 0.1 else 0.0
    ttft_mean = w_mean + tp_ + s
    ttft_p90 = w_p90 + tp_ + s
    var_rounds = 0.0
    if dep.spec is not None:
        var_rounds = O * tokens_per_step_variance(dep.spec.acceptance_rate, dep.spec.gamma) / e ** 3
    d_mean = O * tpot
    var_d = s * s * var_rounds + tp_ * tp_ * rate * d_mean
    tpot_p90 = (d_mean + Z90 * math.sqrt(var_d)) / O
    return ServingPoint(rate, True, b, rho, tp_, s, e, ttft_mean, ttft_p90, tpot, tpot_p90)


def closed_loop_point(dep: Deployment, concurrency: int, input_tokens: int, output_tokens: int) -> dict:
    """Benchmark-style closed loop (`vllm bench serve --max-concurrency c`): c users, each sending
    the next request when one finishes. Per-token latency is one decode round at batch
    min(c, capacity); throughput = c*O / (c*T_p + O*s(c)) (prefills serialize with decode rounds)."""
    mem = memory(dep)
    cap = min(dep.max_batch, mem.max_concurrency(input_tokens + output_tokens))
    c = max(1, min(concurrency, cap)) if cap >= 1 else 0
    if c == 0:
        return {"concurrency": concurrency, "fits": False}
    ctx = input_tokens + output_tokens / 2.0
    s, e = per_token_step(dep, c, ctx)
    tp_ = prefill_step(dep, input_tokens).total
    thr = c * output_tokens / (c * tp_ + output_tokens * s / e)
    return {"concurrency": concurrency, "effective_batch": c, "fits": True, "itl_s": s / e, "round_s": s,
            "ttft_s": tp_ + (s if c > 1 else 0.0), "prefill_s": tp_, "output_tok_s": thr}


# ============================================================ workload and validation

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

    def validate(self, models: Mapping[str, ModelShape], gpus: Mapping[str, GPU]) -> ModelShape:
        """Check every field; raise one PlanError listing all problems. Returns the model shape."""
        probs: list[tuple[str, str]] = []

        def num(name, v, lo=0.0, strict=True, integer=False):
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
            return True

        m = None
        try:
            m = shapes.get_model(self.model, models)
        except ShapeError:
            probs.append(("model", f"unknown model '{self.model}'; known: {', '.join(models)}"))
        num("request_rate", self.request_rate)
        ok_i = num("input_tokens", self.input_tokens, integer=True)
        ok_o = num("output_tokens", self.output_tokens, integer=True)
        if m is not None and ok_i and ok_o and self.input_tokens + self.output_tokens > m.max_context:
            probs.append(("input_tokens", f"input {self.input_tokens} + output {self.output_tokens} tokens exceed "
                          f"{m.name}'s context of {m.max_context} tokens"))
        num("ttft_p90_s", self.ttft_p90_s)
        num("tpot_p90_s", self.tpot_p90_s)
        for g in self.gpus or []:
            if find_gpu(str(g), gpus) is None:
                probs.append(("gpus", f"unknown GPU '{g}'; known: {', '.join(gpus)}"))
        for p in self.precisions or []:
            if p not in PRECISIONS:
                probs.append(("precisions", f"unknown precision '{p}'; choose from {', '.join(PRECISIONS)}"))
        for t in self.tp_options or []:
            if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 8:
                probs.append(("tp_options", f"tensor-parallel size must be an integer 1-8, got {t!r}"))
        if self.spec not in ("auto", "on", "off"):
            probs.append(("spec", f"must be auto, on or off, got {self.spec!r}"))
        if self.acceptance_rate is not None:
            a = self.acceptance_rate
            if isinstance(a, bool) or not isinstance(a, (int, float)) or math.isnan(a) or not 0 <= a <= 1:
                probs.append(("acceptance_rate", f"must be in [0, 1], got {a!r}"))
        if self.gamma is not None and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                       or not 1 <= self.gamma <= 16):
            probs.append(("gamma", f"must be an integer 1-16, got {self.gamma!r}"))
        if self.draft_kind is not None and self.draft_kind not in ("model", "self", "ngram", "heads"):
            probs.append(("draft_kind", f"must be model, self, ngram or heads, got {self.draft_kind!r}"))
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
            num(f"price_overrides[{g}]", price, strict=False)
        if self.price_column not in ("price_usd_per_hr", "price_low_usd_per_hr", "price_high_usd_per_hr"):
            probs.append(("price_column", "must be price_usd_per_hr, price_low_usd_per_hr or price_high_usd_per_hr"))
        if probs:
            raise PlanError(probs)
        return m


# ============================================================ plans

@dataclass(frozen=True)
class Why:
    """One term of a plan's explanation: what, the formula, its value."""

    term: str
    formula: str
    value: float | str
    unit: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


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

    @property
    def label(self) -> str:
        return f"{self.tp}x {self.gpu} {self.precision}" + (" +spec" if self.spec else "")

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
                "best": self.best.to_dict() if self.best else None,
                "plans": [p.to_dict() for p in self.plans]}


def _ms(x: float) -> float:
    return x * 1e3


def max_rate(dep: Deployment, input_tokens: int, output_tokens: int, ttft_slo: float, tpot_slo: float,
             max_concurrency: int) -> tuple[float, ServingPoint | None]:
    """Largest per-replica request rate meeting both p90 SLOs (bisection; every predicted latency
    grows with the rate, so the feasible rates are an interval [0, r*])."""
    def ok(r):
        sp = serving_point(dep, r, input_tokens, output_tokens, max_concurrency)
        return sp.stable and sp.ttft_p90_s <= ttft_slo and sp.tpot_p90_s <= tpot_slo, sp

    hi = 1.0 / prefill_step(dep, input_tokens).total
    tiny = hi * 1e-6
    good, sp0 = ok(tiny)
    if not good:
        return 0.0, sp0
    lo = tiny
    for _ in range(32):
        mid = (lo + hi) / 2
        if ok(mid)[0]:
            lo = mid
        else:
            hi = mid
    return lo, ok(lo)[1]


def _price(gpu: GPU, w: Workload) -> float:
    for k, v in (w.price_overrides or {}).items():
        if find_gpu(str(k), {gpu.name: gpu}) is not None:
            return float(v)
    p = getattr(gpu, w.price_column)
    return float(p if p is not None else gpu.price_usd_per_hr)


def _spec_config(w: Workload, model: ModelShape, models, calibration: Calibration | None
                 ) -> tuple[SpecConfig, ModelShape | None]:
    draft_m = shapes.get_model(w.draft_model, models) if w.draft_model else default_draft(model, models)
    kind = w.draft_kind or ("model" if draft_m is not None else "ngram")
    if kind != "model":
        draft_m = None if kind != "self" else model
    gamma = w.gamma or ASSUMED_GAMMA
    # Medusa/EAGLE-style heads: ~6% of a plain step per round (Medusa's 5 heads on Vicuna-7B read
    # 1.48 GB against the 13.5 GB backbone; docs/PLANNER.md); n-gram lookup costs no model pass.
    ratio = HEADS_DRAFT_COST_RATIO if kind == "heads" else None
    if w.acceptance_rate is not None:
        return SpecConfig(float(w.acceptance_rate), gamma, kind, draft_m.name if draft_m else None,
                          draft_cost_ratio=ratio, source="typed in"), draft_m
    meas = calibration.acceptance_for(model.name, kind, draft_m.name if draft_m else None) if calibration else None
    if meas is not None:
        a, g, _, desc = meas
        dp = calibration.draft_precision_for(model.name, kind) if kind == "self" else None
        return SpecConfig(a, w.gamma or max(1, int(round(g))), kind, draft_m.name if draft_m else None,
                          draft_precision=dp if dp in PRECISIONS else None, draft_cost_ratio=ratio,
                          source=desc), draft_m
    return SpecConfig(ASSUMED_ACCEPTANCE, gamma, kind, draft_m.name if draft_m else None, draft_cost_ratio=ratio,
                      source=f"ASSUMED a={ASSUMED_ACCEPTANCE} (nothing measured or typed in)"), draft_m


def _fits_reason(dep: Deployment, mem: Memory, per_request: int) -> str:
    need = (mem.weights + mem.draft_weights + mem.reserve + mem.kv_per_token * per_request) / GIB
    draft = f" + draft {mem.draft_weights / GIB:.1f} GiB" if mem.draft_weights else ""
    return (f"weights {mem.weights / GIB:.1f} GiB{draft} + reserve {mem.reserve / GIB:.1f} GiB + KV for one request "
            f"{mem.kv_per_token * per_request / GIB:.2f} GiB per GPU = {need:.1f} GiB > {mem.usable / GIB:.1f} GiB "
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
    if dep.spec is not None and dep.spec.source.startswith("ASSUMED"):
        plan.assumptions.append(f"speculation acceptance {dep.spec.source}")
    cdt, cnote = compute_dtype(g, dep.precision)
    if cdt is None:
        plan.reasons.append(cnote)
        return plan
    if m.heads % dep.tp or (m.kv_heads % dep.tp and dep.tp % m.kv_heads):
        plan.reasons.append(f"TP {dep.tp} does not divide {m.name}'s {m.heads} attention / {m.kv_heads} KV heads")
        return plan
    if dep.tp > g.max_gpus_per_node:
        plan.reasons.append(f"{g.name} has at most {g.max_gpus_per_node} GPU(s) per node for tensor parallelism")
        return plan
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
            plan.reasons.append(f"per-token latency floor is {_ms(ftp):.1f} ms on {dep.tp}x {g.name} at "
                                f"{dep.precision} (batch 1); the SLO is {_ms(w.tpot_p90_s):.1f} ms")
            plan.suggestions.append("more tensor parallelism, a GPU with more memory bandwidth, a smaller "
                                    "precision" + ("" if dep.spec else ", or speculative decoding"))
        if fttft > w.ttft_p90_s:
            plan.reasons.append(f"time-to-first-token floor is {_ms(fttft):.0f} ms for {I} prompt tokens on "
                                f"{dep.tp}x {g.name}; the SLO is {_ms(w.ttft_p90_s):.0f} ms")
            plan.suggestions.append("more tensor parallelism or a GPU with more compute (prefill is compute-bound)")
        if not plan.reasons:
            plan.reasons.append(f"no load meets both SLOs ({sp.limit if sp else ''})")
        return plan
    replicas = max(1, math.ceil(w.request_rate / rmax * (1 - 1e-12)))
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
    usd_s = usd_hr / 3600
    plan.usd_per_1m_input = usd_s * at.prefill_util / in_tok_s * 1e6
    plan.usd_per_1m_output = usd_s * (1 - at.prefill_util) / out_tok_s * 1e6
    plan.usd_per_1m_tokens = usd_s / (in_tok_s + out_tok_s) * 1e6
    kv_used = at.batch * (I + O / 2) * mem.kv_per_token
    plan.kv_gb_per_gpu = kv_used / 1e9
    step = decode_step(dep, max(at.batch, 1.0), I + O / 2)
    plan.bound = step.bound
    plan.why = _why(dep, w, mem, at, step, rmax, replicas, price, eff, eff_src, cnote)
    return plan


def _why(dep, w, mem, at, step, rmax, replicas, price, eff, eff_src, cnote) -> list[Why]:
    g, m = dep.gpu, dep.model
    I, O = w.input_tokens, w.output_tokens
    cdt, _ = compute_dtype(g, dep.precision)
    pf = prefill_step(dep, I)
    ys = [
        Why("weights per GPU", f"weight_bytes({m.name}, {dep.precision}) / TP {dep.tp}", mem.weights / 1e9, "GB"),
        Why("KV per token per GPU", f"2 * {m.layers} layers * {m.kv_heads} KV heads * {m.head_dim} * "
            f"bytes({dep.kv_dtype}) (x draft, / TP shard)", mem.kv_per_token, "B"),
        Why("KV budget", f"({g.memory_gb:g} GiB * mem_util {mem.usable / (g.memory_gb * GIB):.2f} - weights - "
            f"reserve {mem.reserve / GIB:.1f} GiB) / KV per token", mem.kv_budget_tokens, "tokens"),
        Why("max concurrency", f"KV budget / ({I} + {O}) tokens per request, capped at max_batch {dep.max_batch}",
            min(dep.max_batch, mem.max_concurrency(I + O)), "requests"),
        Why("efficiency", f"{eff_src}: weights at {eff.mem_bw:.2f} of {g.mem_bw_tbs:g} TB/s, GEMMs at "
            f"{eff.compute:.2f} of {g.peak_tflops(cdt):g} {cdt} TFLOPS ({cnote})", eff.mem_bw, "fraction"),
        Why("prefill time", f"max({pf.flops / 1e12:.2f} TFLOP / ({eff.compute:.2f} * {g.peak_tflops(cdt):g} TFLOPS), "
            f"weights / bandwidth) + all-reduces + overhead, {I} tokens ({pf.bound}-bound)", _ms(pf.total), "ms"),
        Why("decode batch", f"Little's law: B = rate {at.rate:.3g}/s * {O} tokens * TPOT", at.batch, "sequences"),
        Why("decode step: weights", f"{step.weight_bytes / 1e9:.2f} GB / ({eff.mem_bw:.2f} * {g.mem_bw_tbs:g} TB/s)",
            _ms(step.t_weights), "ms"),
        Why("decode step: KV read", f"{step.kv_bytes / 1e9:.2f} GB / ({dep.family_obj().kv_mem_bw:.2f} * bandwidth)",
            _ms(step.t_kv), "ms"),
        Why("decode step: compute", f"{step.flops / 1e12:.2f} TFLOP / ({eff.compute:.2f} * {g.peak_tflops(cdt):g} TFLOPS)",
            _ms(step.t_compute), "ms"),
        Why("decode step: all-reduce", f"2 * {m.layers} layers * ring all-reduce over {g.interconnect or 'n/a'} (TP {dep.tp})",
            _ms(step.t_comm), "ms"),
        Why("decode step: overhead", f"{dep.family_obj().name}: fixed per step + per layer", _ms(step.t_overhead), "ms"),
        Why("decode step", f"max(memory, compute) + all-reduce + overhead = {step.bound}-bound", _ms(step.total), "ms"),
    ]
    if dep.spec is not None:
        ss = spec_step(dep, max(at.batch, 1.0), I + O / 2)
        sp = dep.spec
        ys += [
            Why("speculation: tokens per round", f"E = (1 - a^(g+1)) / (1 - a), a={sp.acceptance_rate:.3f} "
                f"({sp.source}), g={sp.gamma}", ss.expected_tokens, "tokens"),
            Why("speculation: verify pass", f"target scores {sp.verify_tokens or sp.gamma + 1} tokens per sequence",
                _ms(ss.verify.total), "ms"),
            Why("speculation: drafting", f"{sp.gamma} x draft step ({sp.draft_kind})", _ms(ss.draft_time), "ms"),
            Why("speculation: speedup at this batch", "E * plain step / (verify + drafting)",
                ss.expected_tokens * step.total / ss.total, "x"),
        ]
    ys += [
        Why("prefill share of GPU time", f"rho = rate * prefill = {at.rate:.3g} * {_ms(at.prefill_s):.1f} ms",
            at.prefill_util, "fraction"),
        Why("TPOT mean", "round / (E * (1 - rho))", _ms(at.tpot_mean_s), "ms"),
        Why("TPOT p90", "mean + 1.2816 sd of a request's decode time (prefill interruptions ~ Poisson"
            + (", rounds ~ acceptance" if dep.spec else "") + ") / output tokens", _ms(at.tpot_p90_s), "ms"),
        Why("TTFT p90", "prefill + one decode round + M/D/1 wait p90 = (W/rho) ln(10 rho)", _ms(at.ttft_p90_s), "ms"),
        Why("capacity per replica", f"largest rate with TTFT p90 <= {_ms(w.ttft_p90_s):.0f} ms and TPOT p90 <= "
            f"{_ms(w.tpot_p90_s):.1f} ms", rmax, "req/s"),
        Why("replicas", f"ceil({w.request_rate:g} req/s / {rmax:.3g})", replicas, ""),
        Why("GPUs", f"{replicas} replicas * TP {dep.tp}", replicas * dep.tp, ""),
        Why("price", f"{g.name}: {g.price_source[:120]}", price, "$/GPU-hr"),
        Why("$/month", f"{replicas * dep.tp} GPUs * ${price:g}/hr * {HOURS_PER_MONTH:g} h",
            replicas * dep.tp * price * HOURS_PER_MONTH, "$"),
    ]
    return ys


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
        sc, dm = _spec_config(w, model, models, calibration)
        spec_opts.append((sc, dm))
        notes.append(f"speculation: {sc.draft_kind}" + (f" draft {sc.draft_model}" if sc.draft_model else "")
                     + f", gamma {sc.gamma}, acceptance {sc.acceptance_rate:.3f} ({sc.source}); "
                     f"E = {sc.expected_tokens:.2f} tokens per target step")
    plans = []
    for g in sel:
        for p in precs:
            for sc, dm in spec_opts:
                for tp in tps:
                    dep = make_deployment(model, g, p, tp, w, sc, dm, calibration)
                    plans.append(evaluate_plan(dep, w))
    # Cheapest first; at equal cost, the plan with the most spare capacity at the SLOs.
    plans.sort(key=lambda x: (not x.feasible, x.usd_per_hr if x.feasible else math.inf,
                              x.utilization if x.feasible else 0, x.gpus_total))
    if not any(p.feasible for p in plans):
        notes.append(_global_suggestion(model, w, sel, precs, tps, gpus))
    notes.append("p90s: M/D/1 prefill queue + normal approximation of per-request decode time (docs/PLANNER.md)")
    return PlanResult(w, model, plans, notes)


def _need_gib(model: ModelShape, w: Workload, p: str, tp: int) -> float:
    """GiB one GPU needs at TP `tp`: weights/tp + reserve + KV for one request, over mem_util 0.9."""
    wb = shapes.weight_bytes(model, p, w.quantize_embeddings, w.quantize_head, w.group_size)
    kv = shapes.kv_bytes_per_token(model, w.kv_dtype) * (w.input_tokens + w.output_tokens) * _kv_shard(model, tp)
    return (wb / tp + kv + activation_reserve(model, tp)) / (w.mem_util or 0.9) / GIB


def _global_suggestion(model, w, sel, precs, tps, gpus) -> str:
    """When nothing is feasible: what would fit (a smaller precision, or how much GPU memory)."""
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


# ============================================================ batch sweep, packing

def batch_sweep(model: ModelShape, gpu: GPU, precisions: Sequence[str], batches: Sequence[int], context: int,
                spec: SpecConfig | None = None, draft: ModelShape | None = None, tp: int = 1,
                family: str = "serving", calibration: Calibration | None = None) -> list[dict]:
    """Decode cost vs batch, per precision, with and without speculation: where quantization and
    speculation stop paying. Rows: batch, precision, step_ms, tpot_ms, tok_s, bound, fits,
    spec_tpot_ms, spec_speedup, speedup_vs_first_precision."""
    rows = []
    base: dict[int, float] = {}
    for p in precisions:
        if compute_dtype(gpu, p)[0] is None:
            continue
        dep = Deployment(model, gpu, p, tp, family=family, calibration=calibration)
        mem = memory(dep)
        for b in batches:
            st = decode_step(dep, b, context)
            row = {"batch": b, "precision": p, "step_ms": _ms(st.total), "tpot_ms": _ms(st.total),
                   "tok_s": b / st.total, "bound": st.bound,
                   "kv_share": st.t_kv / st.t_memory if st.t_memory else 0.0,
                   "fits": mem.kv_budget_tokens >= b * context}
            if spec is not None:
                sdep = replace(dep, spec=spec, draft=draft)
                ss = spec_step(sdep, b, context)
                row["spec_tpot_ms"] = _ms(ss.total / ss.expected_tokens)
                row["spec_speedup"] = st.total * ss.expected_tokens / ss.total
                row["spec_bound"] = ss.verify.bound
            base.setdefault(b, row["tok_s"])
            row["speedup_vs_first_precision"] = row["tok_s"] / base[b]
            rows.append(row)
    return rows


def crossovers(rows: Sequence[dict], threshold: float = 1.05) -> list[str]:
    """Plain-language summary of a batch sweep: the batch where speculation drops below 1x, and
    where a precision's gain over the first one falls below `threshold`."""
    out = []
    by_p: dict[str, list[dict]] = {}
    for r in rows:
        by_p.setdefault(r["precision"], []).append(r)
    first = next(iter(by_p), None)
    for p, rs in by_p.items():
        rs = sorted(rs, key=lambda r: r["batch"])
        if "spec_speedup" in rs[0]:
            lose = next((r["batch"] for r in rs if r["spec_speedup"] < 1.0), None)
            out.append(f"{p}: speculation " + (f"stops paying at batch {lose} (the verify pass of gamma+1 "
                                               f"tokens per sequence costs more than the tokens it saves)"
                                               if lose else "still pays at the largest batch swept"))
        if p != first and rs and rs[0]["speedup_vs_first_precision"] > threshold:
            fade = next((r for r in rs if r["speedup_vs_first_precision"] < threshold), None)
            why = ""
            if fade is not None:
                why = ("compute-bound" if fade["bound"] == "compute" else
                       f"KV-cache reads are {fade['kv_share']:.0%} of the memory time")
            out.append(f"{p}: {rs[0]['speedup_vs_first_precision']:.2f}x faster than {first} at batch "
                       f"{rs[0]['batch']}" + (f", under {threshold:.2f}x from batch {fade['batch']} ({why})"
                                             if fade else ", still ahead at the largest batch swept"))
    return out


def packing(model: ModelShape, gpu: GPU, precisions: Sequence[str] = PRECISIONS, context_tokens: int = 4096,
            concurrency: int = 1, kv_dtype: str = "bf16", per_replica_overhead_gib: float = 0.5,
            mem_util: float | None = None) -> list[dict]:
    """Multi-model packing: how many independent replicas of `model` fit on one GPU per precision,
    each holding its weights, `per_replica_overhead_gib` (CUDA context, workspaces; assumption)
    and KV for `concurrency` requests of `context_tokens`."""
    util = mem_util if mem_util is not None else DEFAULT_MEM_UTIL.get(gpu.kind, 0.9)
    usable = gpu.memory_gb * GIB * util
    rows = []
    for p in precisions:
        runnable = compute_dtype(gpu, p)[0] is not None
        wb = shapes.weight_bytes(model, p)
        kv = shapes.kv_bytes_per_token(model, kv_dtype) * context_tokens * concurrency
        per = wb + kv + per_replica_overhead_gib * GIB
        n = int(usable // per) if runnable else 0
        rows.append({"precision": p, "replicas": n, "runnable": runnable, "weights_gb": wb / 1e9,
                     "kv_gb": kv / 1e9, "per_replica_gb": per / 1e9, "usable_gb": usable / 1e9})
    return rows


# ============================================================ published measurements

def load_published(path: str | Path | None = None) -> list[dict]:
    with open(Path(path) if path else PUBLISHED_PATH, newline="") as f:
        return [r for r in csv.DictReader(f) if (r.get("id") or "").strip() and not r["id"].startswith("#")]


def predict_published(row: Mapping, gpus: Mapping[str, GPU] | None = None,
                      models: Mapping[str, ModelShape] | None = None) -> float:
    """The planner's prediction for one published measurement (see data/published_measurements.csv)."""
    gpus = gpus if gpus is not None else load_gpus()
    models = models if models is not None else shapes.load_models()
    g = find_gpu(row["gpu"], gpus)
    if g is None:
        raise PlanError("gpu", f"unknown GPU '{row['gpu']}' in published row {row.get('id')}")
    if (row.get("gpu_overrides") or "").strip():
        g = replace(g, **json.loads(row["gpu_overrides"]))
    m = shapes.get_model(row["model"], models)
    c = json.loads(row.get("condition") or "{}")
    dep = Deployment(m, g, row["precision"], int(row.get("tp") or 1), family=row.get("family") or "serving",
                     quantize_head=bool(c.get("quantize_head", False)), group_size=int(c.get("group_size", 64)),
                     kv_dtype=c.get("kv_dtype", "bf16"), mem_util=c.get("mem_util"))
    metric = row["metric"]
    if metric == "decode_tok_s":
        return 1.0 / decode_step(dep, c.get("batch", 1), c.get("context", 128)).total
    if metric == "itl_ms":
        cl = closed_loop_point(dep, c["concurrency"], c["input"], c["output"])
        return cl["itl_s"] * 1e3
    if metric == "output_tok_s":
        return closed_loop_point(dep, c["concurrency"], c["input"], c["output"])["output_tok_s"]
    if metric == "ttft_ms":
        return prefill_step(dep, c["input"]).total * 1e3
    if metric == "kv_cache_tokens":
        return memory(dep).kv_budget_tokens
    if metric == "spec_speedup":
        mal = float(c["mean_accepted"])
        ctx = c.get("context", 256)
        plain = decode_step(dep, 1, ctx).total
        verify = forward_cost(dep, m, dep.precision, 1, ctx, c.get("verify_tokens", 1)).total
        draft_t = 0.0
        if c.get("draft_model"):
            dm = shapes.get_model(c["draft_model"], models)
            draft_t = c.get("draft_steps", 1) * forward_cost(dep, dm, dep.precision, 1, ctx, c.get("draft_tokens", 1)).total
        elif c.get("draft_cost_ratio") is not None:
            draft_t = c.get("draft_steps", 1) * c["draft_cost_ratio"] * plain
        return mal * plain / (verify + draft_t)
    raise PlanError("metric", f"unknown metric '{metric}' in published row {row.get('id')}")


def check_published(path: str | Path | None = None) -> list[dict]:
    """Recompute every prediction of data/published_measurements.csv: id, source, prediction,
    measurement, error % ((prediction - measured) / measured)."""
    gpus, models = load_gpus(), shapes.load_models()
    out = []
    for r in load_published(path):
        pred = predict_published(r, gpus, models)
        meas = float(r["measured"])
        out.append({"id": r["id"], "source": r["source"], "what": r["what"], "metric": r["metric"],
                    "unit": r.get("unit", ""), "predicted": pred, "measured": meas,
                    "error_pct": 100.0 * (pred - meas) / meas, "in_sample": r.get("in_sample", "no"),
                    "reference": r.get("reference", "")})
    return out


def published_table_markdown(rows: Sequence[dict]) -> str:
    """The docs table: one line per published measurement."""
    lines = ["| id | measurement | source | predicted | measured | error | in-sample |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['what']} | {r['source']} | {_fmt(r['predicted'])} {r['unit']} | "
                     f"{_fmt(r['measured'])} {r['unit']} | {r['error_pct']:+.0f}% | {r['in_sample']} |")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"
