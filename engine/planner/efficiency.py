"""What real kernels reach: efficiency fractions per precision, kernel families, compute dtypes.

An efficiency is the fraction of a datasheet peak (memory bandwidth, dense tensor FLOPS) that a
software stack's kernels reach; a kernel family bundles them with the stack's fixed per-step
costs. docs/PLANNER.md ("Efficiency defaults") gives the sources; `calibrate` replaces them with
the lab's own fits where it has them.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from engine.common.paths import DATA
from engine.planner.gpus import GPU

# The bandwidth efficiencies fitted to data/published_measurements.csv (planner.fit computes them;
# `python -m engine plan refit` rewrites this file and a test fails when it is stale).
FIT_PATH = DATA / "efficiency_fit.csv"
FITTED_FAMILIES = ("serving", "torch-compile", "llm-local", "llama.cpp", "hf-eager")   # stacks with published points
ALL_GENERATIONS = "*"
MIN_POOLED_POINTS = 2   # a fallback over all generations needs two points: one stack on one GPU is not a trend


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
    # Eager frameworks launch kernels from Python while the GPU runs earlier ones: a step takes the
    # larger of the launches and the GPU work, not their sum (graph-captured stacks: no overlap to credit).
    launch_overlaps: bool = False


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
    "fp4": Efficiency(0.65, 0.55, "NVFP4 W4A4 on Blackwell FP4 tensor cores quantizes activations per token "
                                  "like W8A8 fp8: fp8's defaults (assumption; no published fp4 point is fitted)"),
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
    "fp4": Efficiency(0.20, 0.10, "never used: compute_dtype refuses fp4 without FP4 tensor cores"),
}
FAMILIES: dict[str, KernelFamily] = {
    "serving": KernelFamily(
        "serving", "production engines (vLLM, TensorRT-LLM, SGLang): CUDA graphs, Marlin int4, cutlass fp8",
        _SERVING_EFF, 0.80, 0.5, 0.0,
        "per-step overhead 0.5 ms: scheduler, sampling and detokenization of a CUDA-graph engine (assumption)"),
    "torch-compile": KernelFamily(
        "torch-compile", "PyTorch-native compiled decode (gpt-fast style): CUDA graphs, no scheduler",
        _SERVING_EFF, 0.80, 0.15, 0.0, "per-step overhead 0.15 ms: one graph replay and argmax (assumption)"),
    "llm-local": KernelFamily(
        "llm-local", "single-user local engines with their own compiled CUDA kernels (MLC-LLM, ExLlamaV2)",
        _SERVING_EFF, 0.80, 0.15, 0.0, "per-step overhead 0.15 ms: as torch-compile (assumption)"),
    "llama.cpp": KernelFamily(
        "llama.cpp", "llama.cpp's CUDA backend (ggml: its own quantized mat-vec kernels, one graph per token)",
        _SERVING_EFF, 0.80, 0.15, 0.0, "per-step overhead 0.15 ms: as torch-compile (assumption); its bandwidth "
        "efficiency is fitted per GPU generation"),
    "hf-eager": KernelFamily(
        "hf-eager", "Hugging Face transformers in eager mode (research code: Spec-Bench, Medusa, EAGLE)",
        _SERVING_EFF, 0.80, 1.0, 0.66,
        "per-layer launches 0.66 ms, overlapping the GPU's work: Medusa reports ~45 tok/s for Vicuna-7B on an A100 "
        "in eager HF (22 ms/token) against an 8.3 ms bandwidth floor, so the launches (21 ms over 32 layers, "
        "less the 1 ms fixed) set the step", launch_overlaps=True),
    "cpu": KernelFamily(
        "cpu", "the lab's CPU kernels on this machine (replace with `calibrate`)", _CPU_EFF, 0.60, 1.0, 0.05,
        "placeholders; calibrate from the lab's run records"),
    "lab-cuda": KernelFamily(
        "lab-cuda", "the lab's own CUDA kernels (defaults = serving until calibrated from cuda records)",
        _SERVING_EFF, 0.80, 0.3, 0.02, "defaults; calibrate from the lab's cuda run records"),
}


@dataclass(frozen=True)
class FitCell:
    """e_w of one (generation, family, precision), the median of its published points' e_w;
    generation ALL_GENERATIONS pools every generation."""

    generation: str
    family: str
    precision: str
    mem_bw: float
    ids: tuple[str, ...]


# The step model's scalar terms fitted to published points (planner.fit), with what a plan uses
# where a term has fewer than MIN_TERM_POINTS: the assumption it had before it was fitted.
TERM_DEFAULTS: dict[str, dict[str, float]] = {
    # all-reduce latency per call, by link (2 calls per layer under TP): NCCL small-message latency
    "allreduce_us": {"nvlink": 10.0, "pcie": 25.0, "xgmi": 25.0},
    # per sequence per step: sampling, scheduling, the batch's small matmuls (0: not modelled)
    "per_seq_us": {},
    # per layer per prefill: launches and small-GEMM tails of a pass outside the decode graph (0: not modelled)
    "prefill_layer_us": {},
}
TERM_WORDS = {"allreduce_us": ("all-reduce latency", "us per call"),
              "per_seq_us": ("per-sequence cost", "us per sequence per step"),
              "prefill_layer_us": ("per-prefill cost", "us per layer per prefill")}
MIN_TERM_POINTS = 2


@dataclass(frozen=True)
class FitTerm:
    """One scalar term of the step model for one key (a link kind or a family): the median of
    what each of its published points implies, given the terms fitted before it."""

    kind: str
    key: str
    value: float
    ids: tuple[str, ...]


@dataclass(frozen=True)
class FitTable:
    """Fitted bandwidth efficiencies by (generation, family, precision), with the fallbacks:
    the cell, else (family, precision) over all generations, else the family's default."""

    cells: Mapping[tuple[str, str, str], FitCell] = field(default_factory=dict)
    # family -> fitted per-layer fixed cost (ms per layer per forward), added to the family's own
    per_layer_ms: Mapping[str, float] = field(default_factory=dict)
    # (kind, key) -> the step model's other fitted terms (TERM_DEFAULTS names them)
    terms: Mapping[tuple[str, str], FitTerm] = field(default_factory=dict)

    def term(self, kind: str, key: str) -> tuple[float, str]:
        """(value, where it comes from) of one term: fitted, or its default, said to be extrapolated."""
        words, unit = TERM_WORDS[kind]
        t = self.terms.get((kind, key))
        if t is not None and len(t.ids) >= MIN_TERM_POINTS:
            ids = ", ".join(t.ids[:3]) + (f" and {len(t.ids) - 3} more" if len(t.ids) > 3 else "")
            return t.value, (f"fitted: {words} {t.value:.3g} {unit} for {key} = median of {len(t.ids)} published "
                             f"points ({ids})")
        default = TERM_DEFAULTS[kind].get(key, 0.0)
        few = f" (only {len(t.ids)})" if t is not None else ""
        return default, (f"extrapolated: no published point{few} fits the {words} of {key}; "
                         f"{default:g} {unit} (assumption)")

    def layer_overhead_ms(self, family: KernelFamily) -> float:
        """The family's per-layer cost per forward pass, with the fitted part."""
        return family.per_layer_overhead_ms + self.per_layer_ms.get(family.name, 0.0)

    def lookup(self, generation: str, family: str, precision: str, base: Efficiency) -> tuple[Efficiency, str]:
        """(efficiency, where it comes from); the compute side is always `base`'s."""
        if family not in FITTED_FAMILIES:
            return base, f"{family} default"
        gen = generation or "unknown generation"
        cell = self.cells.get((generation, family, precision)) if generation else None
        if cell is not None:
            return (Efficiency(cell.mem_bw, base.compute, "fitted"),
                    f"fitted: e_w {cell.mem_bw:.2f} = median of {len(cell.ids)} published point(s) for "
                    f"{gen} x {family} x {precision} ({', '.join(cell.ids)})")
        pooled = self.cells.get((ALL_GENERATIONS, family, precision))
        if pooled is not None and len(pooled.ids) >= MIN_POOLED_POINTS:
            return (Efficiency(pooled.mem_bw, base.compute, "extrapolated"),
                    f"extrapolated: no published point for {gen} x {family} x {precision}; e_w "
                    f"{pooled.mem_bw:.2f} of {family} x {precision} over all generations "
                    f"({len(pooled.ids)} point(s))")
        few = f" (only {len(pooled.ids)} on any generation)" if pooled is not None else " on any generation"
        return (Efficiency(base.mem_bw, base.compute, "extrapolated"),
                f"extrapolated: no published point for {gen} x {family} x {precision}{few}; "
                f"{family} default e_w {base.mem_bw:.2f}")


EMPTY_FIT = FitTable()


def read_fit(path: str | Path | None = None) -> FitTable:
    """The fitted table as written by planner.fit.write_fit (empty if the file is missing)."""
    p = Path(path) if path else FIT_PATH
    if not p.exists():
        return EMPTY_FIT
    cells, per_layer, terms = {}, {}, {}
    with open(p, newline="") as f:
        for r in csv.DictReader(f):
            if r["kind"] == "per_layer_ms":
                per_layer[r["family"]] = float(r["value"])
                continue
            if r["kind"] in TERM_DEFAULTS:
                t = FitTerm(r["kind"], r["precision"], float(r["value"]), tuple(x for x in r["ids"].split() if x))
                terms[(t.kind, t.key)] = t
                continue
            c = FitCell(r["generation"], r["family"], r["precision"], float(r["value"]),
                        tuple(x for x in r["ids"].split() if x))
            cells[(c.generation, c.family, c.precision)] = c
    return FitTable(cells, per_layer, terms)


@lru_cache(maxsize=1)
def shipped_fit() -> FitTable:
    """data/efficiency_fit.csv, read once."""
    return read_fit()


def _half(gpu: GPU) -> str:
    return "bf16" if gpu.bf16_tflops else "fp16"


def compute_dtype(gpu: GPU, precision: str) -> tuple[str | None, str]:
    """(dtype whose peak the matmuls run at, explanation); dtype None = not runnable on this GPU."""
    if precision == "fp4":
        # W4A4 needs FP4 tensor cores; fp4 checkpoints on older GPUs would run as W4A16 dequantization,
        # which int4 already models with a measured kernel class.
        if gpu.fp4_tflops:
            return "fp4", "W4A4: NVFP4 weights and activations on FP4 tensor cores"
        return None, (f"{gpu.name} has no FP4 tensor cores (Blackwell: B200, RTX PRO 6000 Blackwell): "
                      f"use int4 (W4A16) or fp8")
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
