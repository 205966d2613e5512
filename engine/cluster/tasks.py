"""The worker's side of a sweep: one configuration measured by the same code path as a local run.

A Ray worker process keeps its own ModelPool across the tasks it runs (Ray reuses workers), so a
node loads each model once per sweep, as a local sweep does. The record is returned to the driver,
which validates it and writes it to the lab's store; the worker never writes a store.
"""
from __future__ import annotations

import socket

from engine.measure.pool import ModelPool
from engine.measure.runner import measure_one

_pool: ModelPool | None = None  # per worker process


def worker_pool() -> ModelPool:
    global _pool
    if _pool is None:
        _pool = ModelPool(keep=2)
    return _pool


def node_facts() -> dict:
    """Which node ran this: hostname, Ray node id and IP, the GPUs Ray gave the task."""
    import ray

    ctx = ray.get_runtime_context()
    gpus = ctx.get_accelerator_ids().get("GPU") or []
    return {"hostname": socket.gethostname(), "ray_node_id": ctx.get_node_id(),
            "ray_node_ip": ray.util.get_node_ip_address(), "ray_gpu_ids": [str(g) for g in gpus]}


def measure_task(config) -> dict:
    """Run on a worker: `measure_one` (RunConfig -> engine.measure.execute, PeerConfig -> its
    subprocess), with torch on the cores Ray granted; the record as a dict, naming the node."""
    import ray
    import torch

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    if cpus:
        # Ray sets OMP_NUM_THREADS once per worker process; a reused worker may have had another grant.
        torch.set_num_threads(max(1, int(cpus)))
    rec = measure_one(config, worker_pool(), None, None)
    rec.machine.update(node_facts())
    return rec.to_dict()
