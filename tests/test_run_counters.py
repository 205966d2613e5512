"""Kernel-path counters are per run: a record's fused_steps counts its own forward passes only.

The counts live in engine/ops/fused.py; a measured run opens ``ops.count_steps()`` around itself
and record.kernels (``ops.backend_info()``) reads that run's counter. The real 0.5B at int4 takes
the fused path (the tiny models' head_dim 8 does not), so these tests use it.
"""
from __future__ import annotations

import threading

import pytest
import torch

from engine import ops
from engine.infer.model import Rows
from engine.measure.runs import RunConfig, execute

IDS = torch.randint(0, 20000, (40,), generator=torch.Generator().manual_seed(3))


@pytest.fixture(autouse=True)
def _default_kernel_settings():
    with ops.using(ops.KernelConfig()):  # fused on, whatever the environment says
        yield


def _passes(model, n: int) -> None:
    """n forward passes of one sequence: a 5-row prefill, then n - 1 single rows."""
    cache = model.new_cache(1, 64)
    model.forward_rows(IDS[:5], Rows.of([(0, 0, 5)], "cpu"), cache)
    for i in range(n - 1):
        model.forward_rows(IDS[5 + i:6 + i], Rows.of([(0, 5 + i, 1)], "cpu"), cache)


def test_two_measured_runs_in_one_process_report_their_own_fused_steps(pool, small_int4, store):
    """One step per token of a one-prompt run (the prefill yields the first); before this, the third
    record carried the first two runs' steps as well."""
    recs = [execute(RunConfig.of(model="default-draft", precision="int4", max_new_tokens=n, reps=1, warmup=False),
                    pool, store) for n in (3, 7, 3)]
    for rec in recs:
        k = rec.kernels
        assert k["steps_counted"] == "this run" and k["reference_steps"] == 0, k
        assert k["fused_steps"] == len(rec.output["new_tokens"][0]) > 0, k
    assert recs[1].kernels["fused_steps"] > recs[2].kernels["fused_steps"]
    assert recs[0].kernels["fused_steps"] == recs[2].kernels["fused_steps"]
    assert ops.fused_info()["steps_counted"] == "this process"  # outside a run: the process's counts
    assert ops.fused_info()["fused_steps"] >= sum(r.kernels["fused_steps"] for r in recs)


def test_a_run_counts_its_own_paths_and_reasons(small_int4):
    m = small_int4.model
    with ops.count_steps():
        with ops.using(fused=False):
            _passes(m, 2)
        first = ops.backend_info()
    with ops.count_steps() as counts:
        _passes(m, 4)
        second = ops.backend_info()
    assert (first["fused_steps"], first["reference_steps"]) == (0, 2)
    assert first["reference_reasons"] == {"fused step off": 2} and first["last_step"].startswith("reference: ")
    assert (second["fused_steps"], second["reference_steps"], second["reference_reasons"]) == (4, 0, {})
    assert second["last_step"] == "fused" and counts.fused == 4


def test_nested_runs_each_count_and_the_outer_sees_the_inner(small_int4):
    m = small_int4.model
    with ops.count_steps() as outer:
        _passes(m, 2)
        with ops.count_steps() as inner:
            _passes(m, 3)
            assert ops.fused_info()["fused_steps"] == 3  # the innermost run is the one reported
        assert ops.fused_info()["fused_steps"] == 5
    assert (outer.fused, inner.fused) == (5, 3)


def test_runs_in_two_threads_do_not_count_each_other(small_int4):
    """Two dashboard sessions run in two threads: each run counts only its own thread's passes."""
    m = small_int4.model
    seen = {}
    go = threading.Barrier(2)

    def run(name: str, n: int) -> None:
        with ops.count_steps() as c:
            go.wait()
            _passes(m, n)
            go.wait()  # both have stepped before either reads
            seen[name] = (c.fused, ops.fused_info()["fused_steps"])

    threads = [threading.Thread(target=run, args=("a", 2)), threading.Thread(target=run, args=("b", 5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": (2, 2), "b": (5, 5)}
