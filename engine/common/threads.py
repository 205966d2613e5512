"""Work done once before another thread takes over the cores, run on a thread that ends with it.

OpenMP (libgomp, which torch's CPU ops and our fused step use) gives each host thread that runs a parallel region
a team of its own, kept until that thread exits. Once a process holds more OpenMP threads than cores, every team
spins less and sleeps at its barriers: on 2 cores, after one parallel op on the main thread, a 2-thread linear on
another thread took 30% longer, the 0.5B's fused int4 step 11% (docs/BENCHMARKS.md, session 20). A server or the
backend measures on a thread of its own, so what their main thread would do first (load the model, build the
engine, probe the bandwidth) runs here instead, and its team goes when it ends.
"""
from __future__ import annotations

import threading


def on_a_passing_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) on a new thread that ends when fn returns; its result, or its exception raised here."""
    out: dict = {}

    def call() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller, traceback and all
            out["error"] = e

    t = threading.Thread(target=call, name=f"scl-once-{getattr(fn, '__name__', 'fn')}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
