"""A sweep across a Ray cluster: each configuration one task, records streamed back and stored on the driver.

The driver submits every configuration at once (Ray queues what the cluster cannot run yet), then
`ray.wait`s: each record is validated and written to the lab's store the moment its task ends, so a
cancel, a crash or a lost node keeps everything already measured. A task that fails (its worker
died, its node went away, the configuration raised) is reported with the reason and the sweep goes
on. Tasks are not retried: a configuration that kills its worker (out of memory, a segfault) would
do so again, and measuring it twice on different nodes would hide that.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.cluster.connect import alive_nodes, check_cpus, connect, default_cpus, label_of, resources
from engine.cluster.tasks import measure_task
from engine.measure.records import RunRecord

CANCEL_GRACE_S = 10.0  # after ray.cancel, how long tasks get to stop (or finish, and be kept)


@dataclass
class Failure:
    """A configuration that produced no record, and why."""

    label: str
    reason: str

    def line(self) -> str:
        return f"{self.label}: {self.reason}"


@dataclass
class Outcome:
    """What a cluster sweep gave: records (in the configurations' order), failures, and what was cancelled."""

    total: int
    records: list[RunRecord] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)


def failure_reason(ray, e: BaseException) -> str:
    """One line for a task's exception: the configuration's own error, or what happened to its worker."""
    exc = ray.exceptions
    if isinstance(e, exc.TaskCancelledError):
        return "cancelled"
    if isinstance(e, exc.RayTaskError):
        cause = getattr(e, "cause", None)
        if cause is not None:
            return f"{type(cause).__name__}: {str(cause).splitlines()[0][:300] if str(cause) else ''}"
    if isinstance(e, exc.WorkerCrashedError):
        return "its worker process died while measuring it (killed, out of memory or crashed)"
    if isinstance(e, exc.NodeDiedError):
        return "the node it ran on left the cluster"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}"


def run_on_ray(configs: list, address: str, store=None, on_record=None, on_failure=None, should_cancel=None,
              progress=None, cpus: int | None = None, poll_s: float = 0.5) -> Outcome:
    """Measure `configs` as Ray tasks on the cluster at `address`; see the module docstring.

    on_record(rec) after each stored record, on_failure(Failure) after each failed configuration;
    should_cancel() is polled every poll_s: when it says so, the outstanding tasks are cancelled.
    A GPU configuration asks for one GPU; a CPU one for `cpus` cores (default: a whole node's).
    """
    say = progress or (lambda s: None)
    ray = connect(address)
    gpus = ray.cluster_resources().get("GPU", 0)
    cpus = default_cpus(ray) if cpus is None else check_cpus(ray, cpus)
    options = [resources(c, cpus, gpus) for c in configs]  # every config checked before anything is sent
    remote = ray.remote(measure_task)
    index = {}
    for i, (c, opt) in enumerate(zip(configs, options)):
        ref = remote.options(**opt, max_retries=0, name=f"scl: {label_of(c)}"[:100]).remote(c)
        index[ref] = i
    out = Outcome(total=len(configs))
    got: dict[int, RunRecord] = {}
    pending = list(index)
    t0 = time.perf_counter()
    say(f"{len(configs)} configuration(s) sent to the Ray cluster ({len(alive_nodes(ray))} node(s), {gpus:g} GPU(s); "
        f"each CPU configuration asks for {cpus} cores)")

    def collect(ref):
        i = index[ref]
        label = label_of(configs[i])
        try:
            rec = RunRecord.from_dict(ray.get(ref))
        except Exception as e:  # a task's error, re-raised by ray.get
            reason = failure_reason(ray, e)
            if reason == "cancelled":
                out.cancelled.append(label)
                return
            f = Failure(label, reason)
            out.failures.append(f)
            if on_failure:
                on_failure(f)
            return
        if rec.kind == "peer" and not rec.metrics:  # a peer that could not run: said, not stored (run_many's rule)
            f = Failure(rec.label, rec.notes or "the peer did not run")
            out.failures.append(f)
            if on_failure:
                on_failure(f)
            return
        if store is not None:
            store.save_run(rec)
        got[i] = rec
        if on_record:
            on_record(rec)

    try:
        while pending:
            if should_cancel and should_cancel():
                say(f"cancelling {len(pending)} outstanding task(s)")
                pending = cancel(ray, pending, collect)
                for ref in pending:
                    out.cancelled.append(label_of(configs[index[ref]]))
                pending = []
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=poll_s)
            for ref in ready:
                collect(ref)
            if ready:
                done = out.total - len(pending)
                per = (time.perf_counter() - t0) / done
                say(f"{done}/{out.total} finished on the cluster ({len(out.failures)} failed), "
                    f"about {per * len(pending):.0f} s left")
    finally:
        for ref in pending:  # the driver was interrupted (Ctrl-C, an error): nothing keeps running for nobody
            ray.cancel(ref, force=True)
    out.records = [got[i] for i in sorted(got)]
    return out


def cancel(ray, refs: list, collect) -> list:
    """ray.cancel every task: a pending one never starts, a running one gets KeyboardInterrupt. Tasks that
    end within the grace period are collected (a record that made it is kept); those still running are
    force-cancelled (their worker exits) and returned."""
    for ref in refs:
        ray.cancel(ref)
    ready, rest = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)
    for ref in ready:
        collect(ref)
    for ref in rest:
        ray.cancel(ref, force=True)
    return rest


def sweep_job(configs: list, address: str, cpus: int | None = None):
    """The dashboard's Job `work` for a cluster sweep: records counted as they land, failures said on the
    page, Cancel cancelling the outstanding tasks."""
    def work(job):
        run_on_ray(configs, address, job.store, on_record=lambda r: job.add_run(r.run_id),
                  on_failure=lambda f: job.skip(f.line(), runs=1),
                  should_cancel=lambda: job.cancelled, progress=job.say, cpus=cpus)
    return work
