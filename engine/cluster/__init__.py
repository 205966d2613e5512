"""Past one machine: sweeps and load tests on a Ray cluster (docs/CLUSTER.md).

connect.py: Ray (the optional `cluster` extra), `--ray local|auto|ADDRESS`, what a task asks for;
tasks.py: the worker's side (its own ModelPool, the same `config.measure` a local run calls, node facts);
sweep.py: configurations as Ray tasks, records streamed back (`ray.wait`) into the driver's store,
failures with their reason, cancel (`ray.cancel`); load.py: Ray actors as load clients.
Nothing else in the lab imports Ray or this package (pyproject.toml's import contracts).
"""
from engine.cluster.connect import INSTALL_FIX, RAY_PIN, connect, label_of, require_ray, resources
from engine.cluster.load import RaySender, load_sender, split
from engine.cluster.sweep import Failure, Outcome, run_on_ray, sweep_job

__all__ = ["INSTALL_FIX", "RAY_PIN", "connect", "label_of", "require_ray", "resources", "RaySender", "load_sender",
           "split", "Failure", "Outcome", "run_on_ray", "sweep_job"]
