"""`python -m engine backend`: the long-lived process that owns the models, the kernels and the runs."""
from __future__ import annotations

import argparse
import logging
import os
import socket
import stat
import sys
import time
from pathlib import Path

from engine.backend.contract import DEFAULT_HOST, DEFAULT_PORT, is_loopback
from engine.common.errors import UserError

TOKEN_FIX = ("create one and pass it: python -c 'import secrets; print(secrets.token_urlsafe(32))' > F && chmod 600 F; "
             "then --token-file F here, and SCL_BACKEND_TOKEN_FILE=F (or the token in SCL_BACKEND_TOKEN) "
             "for the dashboard")
POOL_KEEP = 8  # models; the byte budget is what usually evicts
MODELS_TTL_S = 10.0  # how stale GET /v1/info's catalog (installed, converted) may be


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("backend", help="the measuring process the dashboard drives (here or on a GPU box); "
                       "docs/BACKEND.md")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help="address to bind (default loopback; anything else requires --token-file)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--token-file", default=None, help="a file holding the token every request must carry")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="weights the model pool may keep loaded, GiB (default: half of this machine's memory, "
                        "or of the GPU's on CUDA); least recently used dropped first")
    p.add_argument("--device", default="auto", help="the device whose facts and bandwidth /v1/info reports")
    p.add_argument("--ray", default=None, metavar="ADDRESS|auto|local",
                   help="measure each configuration of a job as a task on this Ray cluster (docs/CLUSTER.md)")
    p.add_argument("--store", default=None, help="the SQLite store runs land in (default: the lab's)")
    p.set_defaults(fn=run)
    return p


def read_token(path: str) -> str:
    f = Path(path).expanduser()
    try:
        token = f.read_text().strip()
    except OSError as e:
        raise UserError(f"cannot read the token file {f} ({e.strerror})", TOKEN_FIX) from None
    if len(token) < 16:
        raise UserError(f"the token in {f} is {'empty' if not token else 'shorter than 16 characters'}", TOKEN_FIX)
    if f.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(f"WARNING: {f} is readable by other users of this machine (chmod 600 {f})", file=sys.stderr, flush=True)
    return token


def check_args(a) -> str | None:
    """Refuse a bad port, and a non-loopback bind without a token; the token (None: loopback, no auth)."""
    if not 1 <= a.port <= 65535:
        raise UserError(f"port {a.port} is out of range", "use 1 to 65535")
    if a.memory_gib is not None and not a.memory_gib > 0:
        raise UserError(f"--memory-gib {a.memory_gib:g} holds no model", "give the GiB of weights to keep, e.g. 8")
    if a.token_file is None:
        if not is_loopback(a.host):
            raise UserError(f"listening on {a.host} lets anyone who reaches this machine run jobs on it, so it "
                            "needs a token", TOKEN_FIX)
        return None
    return read_token(a.token_file)


def default_budget_bytes(device: str) -> int:
    import psutil

    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_properties(0).total_memory // 2
    return psutil.virtual_memory().total // 2


def machine(device: str) -> dict:
    """This machine's facts as the Home page shows them, the bandwidth probed once now."""
    from engine.common.threads import on_a_passing_thread
    from engine.measure import bandwidth_gbs, machine_facts, nvml_gpus

    try:
        # probed on a thread that ends, so the worker thread's OpenMP team is the process's only one
        bw = round(on_a_passing_thread(bandwidth_gbs, device, refresh=True), 1)
    except Exception as e:  # the facts still stand
        bw, bw_error = None, f"{type(e).__name__}: {e}"
    else:
        bw_error = None
    return {**machine_facts(device), "hostname": socket.gethostname(), "gpus": nvml_gpus(), "bandwidth_GBs": bw,
            "bandwidth_error": bw_error}


def loaded_facts(pool) -> list[dict]:
    """What the pool holds (pool.loaded()'s entries), each with engine.measure.model_facts (sizes, shape, dtype:
    what the Precision page draws); a snapshot, so /v1/info answers while a run holds the pool's lock."""
    from engine.measure.loaded import facts_json
    from engine.measure.pool import describe

    return [{**describe(lm), "facts": facts_json(lm)} for lm in pool.models()]


def info_source(device: str, pool, ray: str | None, store, started_at: float):
    """The function GET /v1/info calls: fixed facts computed once, what changes (kernels, models, pool) each time."""
    from engine.backend.contract import API_VERSION, lab_version
    from engine.measure import kernel_info, list_models, registered_models
    from engine.peers.matrix import peer_availability
    from engine.peers.quality_worker import llama_cpp_unavailable
    from engine.peers.servers import server_availability

    facts, version = machine(device), lab_version()
    catalog = {"at": 0.0, "models": []}  # list_models reads package metadata (~0.1 s): at most once per MODELS_TTL_S

    def info() -> dict:
        try:  # never compile just to say so; the first quantized run builds the kernels
            kernels = kernel_info(build=False)
        except Exception as e:
            kernels = {"cpu": f"unavailable ({type(e).__name__})"}
        if time.monotonic() - catalog["at"] > MODELS_TTL_S:
            catalog.update(at=time.monotonic(), models=[{**m, "registered": False} for m in list_models()])
        models = catalog["models"] + [{"name": n, "label": lbl, "registered": True}
                                      for n, lbl in registered_models().items()]
        for m in models:  # why llama.cpp's Q4_K_M cannot be scored for it (None: it can); cheap, loads nothing
            m["llama_cpp"] = llama_cpp_unavailable(m["name"])
        return {"api_version": API_VERSION, "lab_version": version, "machine": {**facts, "kernels": kernels},
                "servers": server_availability(), "peers": peer_availability(),  # file checks: about 1 ms
                "models": models, "loaded": loaded_facts(pool), "pool_budget_bytes": pool.budget_bytes, "ray": ray,
                "store": str(store.path), "started_at": started_at, "llama_cpp": llama_cpp_unavailable("default")}
    return info


def run(a) -> int:
    try:
        import uvicorn

        from engine.backend.app import create_app
    except ImportError as e:
        raise UserError(f"the backend's HTTP stack is missing ({e.name} not installed)",
                        "pip install -e . (fastapi and uvicorn are dependencies)") from e
    token = check_args(a)
    from engine.backend.jobs import JobQueue, Journal
    from engine.infer.loader import resolve_device
    from engine.measure import ModelPool, Store

    if a.ray:
        from engine.cluster import connect

        connect(a.ray)  # a missing Ray or a wrong address is refused now, not at the first job
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    device = resolve_device(a.device)
    budget = int(a.memory_gib * 2**30) if a.memory_gib is not None else default_budget_bytes(device)
    store = Store(a.store) if a.store else Store()
    pool = ModelPool(keep=POOL_KEEP, budget_bytes=budget)
    journal = Journal(store.path.with_name(store.path.stem + "-backend-jobs.sqlite"))
    queue = JobQueue(store, pool, a.ray, journal)
    info = info_source(device, pool, a.ray, store, time.time())
    app = create_app(queue, info, token)
    queue.start()
    if not is_loopback(a.host):
        print(f"WARNING: listening on {a.host}: anyone who can reach this machine and holds the token can run jobs.",
              file=sys.stderr, flush=True)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            print(f"backend on http://{a.host}:{a.port} (pid {os.getpid()}, store {store.path}, "
                  f"{budget / 2**30:.1f} GiB of weights at most{', Ray ' + a.ray if a.ray else ''})", flush=True)

    server = Server(uvicorn.Config(app, host=a.host, port=a.port, log_level="warning", lifespan="off",
                                   timeout_graceful_shutdown=5))
    try:
        server.run()
    finally:
        queue.stop("the backend was stopped")
    return 0
