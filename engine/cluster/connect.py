"""Reaching a Ray cluster: Ray itself (optional, the `cluster` extra), the address, the resources a task asks for.

`--ray` takes `local` (start a one-machine cluster inside this process), `auto` (join the cluster
`ray start --head` started on this machine) or an address (`HOST:6379`, or `ray://HOST:10001` for
Ray Client). Ray is imported here and nowhere else in the lab: without it every other command works.
"""
from __future__ import annotations

import os

from engine.common.errors import UserError

RAY_PIN = "ray==2.60.0"
INSTALL_FIX = f"install the cluster extra: pip install -e '.[cluster]' (it pins {RAY_PIN})"

_connected: str | None = None  # the address this process joined (None: not joined by us)


def require_ray():
    """The ray module, or a UserError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray, which is not installed in this environment", INSTALL_FIX) from None
    return ray


def check_address(address: str) -> str:
    a = (address or "").strip()
    if not a:
        raise UserError("the Ray address is empty", "pass --ray local, --ray auto or --ray HOST:PORT")
    if a not in ("local", "auto") and ":" not in a:
        raise UserError(f"'{a}' is not a Ray address",
                        "pass local (a cluster in this process), auto (the one `ray start` runs here), "
                        "HOST:6379 or ray://HOST:10001")
    return a


def connect(address: str):
    """Join (or start) the cluster at `address` once per process; the ray module.

    A process that is already connected (a test's fixture, an earlier sweep of the dashboard) reuses
    the connection when the address is the same or when it did not connect through here.
    """
    global _connected
    address = check_address(address)
    ray = require_ray()
    if ray.is_initialized():
        if _connected is None or _connected == address:
            return ray
        ray.shutdown()  # the dashboard asked for another cluster
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # the lab sends nothing anywhere unasked
    kw = {"include_dashboard": False} if address == "local" else {}
    try:
        ray.init(address=address, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UserError(f"cannot join the Ray cluster at {address} ({type(e).__name__}: {str(e)[:200]})",
                        "start it first (`ray start --head` on the head node, docs/CLUSTER.md) or pass --ray local"
                        ) from None
    _connected = address
    return ray


def alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def default_cpus(ray) -> int:
    """CPU cores a CPU configuration asks for: all of the smallest worker node's, so that a node measures
    one CPU configuration at a time (two side by side share its cores and memory bandwidth)."""
    cpus = [int(n["Resources"].get("CPU", 0)) for n in alive_nodes(ray)]
    cpus = [c for c in cpus if c > 0]
    if not cpus:
        raise UserError("the Ray cluster has no CPU to run on", "start a worker node: ray start --address HEAD:6379")
    return min(cpus)


def is_gpu(config, gpus_in_cluster: float) -> bool:
    """A GPU configuration: device cuda, or auto on a cluster that has GPUs."""
    device = str(getattr(getattr(config, "setup", None), "device", None) or "cpu")
    return device.startswith("cuda") or (device == "auto" and gpus_in_cluster > 0)


def resources(config, cpus: int, gpus_in_cluster: float) -> dict:
    """Ray options for one configuration: one GPU (and a core to drive it), or `cpus` cores."""
    if is_gpu(config, gpus_in_cluster):
        if gpus_in_cluster < 1:
            raise UserError(f"{label_of(config)} asks for a GPU and the Ray cluster has none",
                            "start GPU nodes (ray start --address HEAD:6379 on a GPU machine) or use --device cpu")
        return {"num_gpus": 1, "num_cpus": 1}
    return {"num_cpus": cpus}


def check_cpus(ray, cpus: int) -> int:
    """An explicit core count no node could grant would leave its tasks pending for ever."""
    most = max((int(n["Resources"].get("CPU", 0)) for n in alive_nodes(ray)), default=0)
    if not isinstance(cpus, int) or not 1 <= cpus <= most:
        raise UserError(f"{cpus} CPU cores per configuration: the largest node of the cluster has {most}",
                        f"ask for 1 to {most}")
    return cpus


def label_of(config) -> str:
    """What a configuration is called before it has a record (a RunConfig's label is its record's)."""
    return str(getattr(config, "label", None) or type(config).__name__)
