"""The cost & capacity planner: for a model and a workload (request rate, prompt/output lengths, p90
latency SLOs), how many GPUs of which kind, at which precision, with or without speculative
decoding, and what that costs per million tokens and per month. Every number is a formula over
datasheet figures (gpus), model shapes (shapes), documented kernel efficiencies (efficiency) or the
lab's own run records (calibration), through a roofline of one replica (roofline; acceptance and
speculation for drafts), a serving model under load (queueing) and a search over candidates
(workload, search, sweep); it is checked against published measurements (published). Pure
functions and dataclasses: the planner imports nothing of the engine except engine.common, and its
callers hand it records as plain dicts.
docs/PLANNER.md states the formulas, defaults and sources.
"""
from engine.planner import counts, shapes
from engine.planner.acceptance import (acceptance_from_mean_length, expected_tokens_per_step, spec_speedup,
                                       tokens_per_step_variance)
from engine.planner.calibration import AcceptanceObs, Calibration, Fit, calibrate, record_bytes_per_token
from engine.planner.efficiency import FAMILIES, Efficiency, KernelFamily, compute_dtype
from engine.planner.errors import PlanError
from engine.planner.gpus import (GPU, GPUS_PATH, THIS_MACHINE, CatalogError, find_gpu, load_gpus, price_table,
                                 probe_from_records)
from engine.planner.published import check_published, load_published, predict_published, published_table_markdown
from engine.planner.queueing import ServingPoint, closed_loop_point, max_rate, serving_point
from engine.planner.roofline import (ALLREDUCE_BW_FRACTION, DEFAULT_MAX_BATCH, DEFAULT_MEM_UTIL, Deployment, Memory,
                                     SpecStep, Step, activation_reserve, allreduce_time, decode_step, forward_cost,
                                     memory, per_token_step, prefill_step, spec_step)
from engine.planner.search import (MAX_GPUS_PER_PLAN, TP_OPTIONS, Plan, PlanResult, evaluate_plan, make_deployment,
                                   plan)
from engine.planner.shapes import ModelShape, ShapeError
from engine.planner.speculation import ASSUMED_ACCEPTANCE, ASSUMED_GAMMA, SpecConfig, choose_spec, default_draft
from engine.planner.sweep import batch_sweep, crossovers, packing
from engine.planner.why import Why
from engine.planner.workload import MAX_REQUEST_RATE, MAX_TOKENS, MAX_USD_PER_GPU_HOUR, Workload

__all__ = [
    "counts", "shapes", "AcceptanceObs", "Calibration", "Fit", "calibrate", "record_bytes_per_token", "FAMILIES",
    "Efficiency", "KernelFamily", "compute_dtype", "PlanError", "GPU", "GPUS_PATH", "THIS_MACHINE", "CatalogError",
    "find_gpu", "load_gpus", "price_table", "probe_from_records", "check_published", "load_published",
    "predict_published", "published_table_markdown", "ServingPoint", "closed_loop_point", "max_rate",
    "serving_point", "ALLREDUCE_BW_FRACTION", "DEFAULT_MAX_BATCH", "DEFAULT_MEM_UTIL", "Deployment", "Memory",
    "SpecStep", "Step", "activation_reserve", "allreduce_time", "decode_step", "forward_cost", "memory",
    "per_token_step", "prefill_step", "spec_step", "MAX_GPUS_PER_PLAN", "TP_OPTIONS", "Plan", "PlanResult", "Why",
    "evaluate_plan", "make_deployment", "plan", "ModelShape", "ShapeError", "ASSUMED_ACCEPTANCE", "ASSUMED_GAMMA",
    "SpecConfig", "acceptance_from_mean_length", "choose_spec", "default_draft", "expected_tokens_per_step",
    "spec_speedup", "tokens_per_step_variance", "batch_sweep", "crossovers", "packing", "MAX_REQUEST_RATE",
    "MAX_TOKENS", "MAX_USD_PER_GPU_HOUR", "Workload",
]
