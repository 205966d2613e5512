"""Measurement: run configs become records (timers, memory, machine facts, quality), the SQLite store, sweeps.

The API the CLI, the pages and the benchmarks call; each name below is defined in one module here.
Names are resolved on first use (PEP 562): the dashboard reads the store and builds run configs
without importing torch or the inference core, which only the backend's process loads.
"""
from __future__ import annotations

import importlib

_HOME = {
    "bandwidth_gbs": "bandwidth", "list_models": "loaded", "load_into_pool": "loaded", "model_facts": "loaded",
    "quality_in_pool": "loaded", "kernel_info": "machine", "machine_facts": "machine", "nvml_gpus": "machine",
    "SCHEMA_VERSION": "records", "RunRecord": "records", "ModelPool": "pool", "register_model": "pool",
    "registered_models": "pool", "unregister_model": "pool", "RecordConfig": "record_config",
    "RunConfig": "run_config", "default_prompts": "run_config", "execute": "runs", "Store": "store",
    "DEFAULT_WORKLOAD": "grid", "default_comparison": "grid", "sweep_configs": "grid", "run_many": "runner",
}
_RENAMED = {"canonical_workload": ("workloads", "canonical"), "workload_categories": ("workloads", "categories")}

__all__ = sorted([*_HOME, *_RENAMED])  # noqa: PLE0605 (the names of the two tables above)


def __getattr__(name: str):
    if name in _HOME:
        module, attr = _HOME[name], name
    elif name in _RENAMED:
        module, attr = _RENAMED[name]
    else:
        raise AttributeError(f"module 'engine.measure' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"engine.measure.{module}"), attr)
    globals()[name] = value  # resolved once
    return value
