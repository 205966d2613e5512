"""Measurement: run configs become records (timers, memory, machine facts, quality), the SQLite store, sweeps.

The API the CLI, the pages and the benchmarks call; each name below is defined in one module here.
"""
from engine.measure.bandwidth import bandwidth_gbs
from engine.measure.loaded import list_models, load_into_pool, model_facts, quality_in_pool
from engine.measure.machine import kernel_info, machine_facts, nvml_gpus
from engine.measure.records import SCHEMA_VERSION, RunRecord
from engine.measure.pool import ModelPool, register_model, registered_models, unregister_model
from engine.measure.record_config import RecordConfig
from engine.measure.runs import RunConfig, default_prompts, execute
from engine.measure.store import Store
from engine.measure.sweep import DEFAULT_WORKLOAD, default_comparison, run_many, sweep_configs
from engine.measure.workloads import canonical as canonical_workload, categories as workload_categories

__all__ = ["bandwidth_gbs", "list_models", "load_into_pool", "model_facts", "quality_in_pool", "machine_facts", "kernel_info",
           "nvml_gpus", "SCHEMA_VERSION", "RunRecord", "ModelPool", "RunConfig", "default_prompts", "execute",
           "register_model", "registered_models", "unregister_model", "Store", "default_comparison", "run_many",
           "sweep_configs", "RecordConfig"]
