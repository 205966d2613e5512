"""A load sweep over configurations: each server started by the lab (or a URL someone else runs), every
load point sent to it, then stopped by its PID. One `load` record per point.

The Load test page's job and bench/load.py both run LoadSweepItems through engine.measure.runner.run_many
(`sweep_servers` for the scripts), so a sweep started in the dashboard and one started from the shell measure
the same way. Loads are a concurrency list
("1,4,8": one closed-loop point per concurrency) or a rate sweep ("sweep:4": GuideLLM's, see
engine.load.run_sweep_profile). Cancelling stops before the next point (the point in progress finishes and
is stored) and stops the server; a server still starting finishes starting first.
"""
from __future__ import annotations

import atexit
import threading
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from engine.common.errors import UserError
from engine.load.profiles import MAX_CONCURRENCY, Profile, parse_profile
from engine.load.run import LoadConfig, prepare, run_point, run_sweep_profile
from engine.peers import servers
from engine.peers.servers import ServerSpec

LOADS_HELP = "a concurrency list like 1,4,8, or a rate sweep like sweep:4 (synchronous, throughput, 4 rates)"


class Cancelled(Exception):
    """Raised inside a sweep when the caller asked it to stop."""


@dataclass
class SweepPlan:
    """What a sweep sends to every configuration (LoadConfig's settings, minus the URL)."""

    loads: str = "1,4,8"
    workload: str = "chat:16"
    requests: int | None = None          # per point (None: the workload's size)
    max_output_len: int = 128
    slo: str = "ttft=2,itl=0.2"
    slo_attainment: float = 0.9
    max_model_len: int = 2048
    warmup: int = 1
    max_seconds: float = 900.0
    request_timeout_s: float = 300.0
    tokenizer: str = "default-draft"

    def profiles(self) -> list[Profile]:
        """The closed-loop points of a concurrency list, or [the sweep profile]."""
        text = (self.loads or "").strip().lower()
        if text.startswith("sweep"):
            return [parse_profile(text)]
        out = []
        for part in text.split(","):
            if not part.strip():
                continue
            try:
                n = int(part)
            except ValueError:
                raise UserError(f"'{part.strip()}' in the loads is not a whole number", f"write {LOADS_HELP}") from None
            if not 1 <= n <= MAX_CONCURRENCY:
                raise UserError(f"concurrency {n} is out of range", f"use 1 to {MAX_CONCURRENCY}")
            out.append(Profile("concurrent", streams=n))
        if not out:
            raise UserError("no loads to run", f"write {LOADS_HELP}")
        return out

    def points_per_configuration(self) -> int:
        ps = self.profiles()
        return 2 + ps[0].steps if ps[0].kind == "sweep" else len(ps)

    def load_config(self, url: str, facts: dict) -> LoadConfig:
        return LoadConfig(url=url, workload=self.workload, requests=self.requests, max_output_len=self.max_output_len,
                          slo=self.slo, slo_attainment=self.slo_attainment, max_model_len=self.max_model_len,
                          warmup=self.warmup, max_seconds=self.max_seconds, request_timeout_s=self.request_timeout_s,
                          tokenizer=self.tokenizer, server=facts)

    def validate(self) -> "SweepPlan":
        self.profiles()
        self.load_config("http://127.0.0.1:1", {}).validate()
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SweepResult:
    records: list = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (configuration, why it was not measured)
    cancelled: bool = False


# Servers this process started and has not stopped yet: stopped at exit too (a dashboard stopped
# mid-sweep must not leave a server running).
_RUNNING: dict[int, servers.RunningServer] = {}
_LOCK = threading.Lock()


def _stop_all() -> None:
    with _LOCK:
        left = list(_RUNNING.values())
        _RUNNING.clear()
    for rs in left:
        rs.stop(timeout_s=10.0)


atexit.register(_stop_all)


class _Recorder:
    """A store that also tells the caller about each record as it is saved."""

    def __init__(self, store, on_record):
        self.store, self.on_record = store, on_record

    def save_run(self, rec):
        rid = self.store.save_run(rec) if self.store is not None else rec.run_id
        self.on_record(rec)
        return rid


@dataclass
class LoadSweepItem:
    """A work item (engine.measure.runner.run_many): one configuration's server started (or reached), every
    load point of `plan` sent to it, then stopped by its PID. It lands a `load` record per point as each
    finishes, so it owns its progress: the runner gives it should_cancel and on_record."""
    spec: ServerSpec
    plan: SweepPlan
    log_dir: object = None  # where the server's log goes (None: the lab's log folder)
    owns_progress: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def steps(self) -> int:
        """The records it makes when every point runs (a job's total counts them)."""
        return self.plan.points_per_configuration()

    def measure(self, pool=None, store=None, progress=None, *, should_cancel=None, on_record=None):
        """The records of the points sent (a cancel stops before the next point), or Skipped saying why the
        server could not start or failed part-way (its first points are landed already; `runs`: those left)."""
        from engine.measure.runner import Skipped

        self.plan.validate()
        self.spec.validate()
        say = progress or (lambda s: None)
        cancel = should_cancel or (lambda: False)
        landed: list = []

        def record(rec):
            landed.append(rec)
            if on_record:
                on_record(rec)

        def say_or_stop(msg: str):
            if cancel():
                raise Cancelled()
            say(msg)

        def skip(why: str) -> Skipped:
            return Skipped(self.label, why, runs=self.steps - len(landed))

        try:
            rs = servers.start(self.spec, log_dir=self.log_dir, progress=say)
        except servers.ServerUnavailable as e:
            return skip(str(e))
        except (servers.ServerFailed, UserError) as e:
            return skip(f"did not start: {e}")
        with _LOCK:
            _RUNNING[id(rs)] = rs
        sink = _Recorder(store, record)
        try:
            cfg = self.plan.load_config(rs.url, rs.facts())
            prepared = prepare(cfg, say_or_stop)
            for p in self.plan.profiles():
                if p.kind == "sweep":
                    run_sweep_profile(cfg, p, prepared, sink, say_or_stop)
                else:
                    say_or_stop(f"{self.label}: {p.label}")
                    run_point(cfg, p, prepared, sink, progress=say)
        except Cancelled:
            pass
        except UserError as e:
            return skip(f"load test failed: {e}")
        finally:
            rs.stop()
            with _LOCK:
                _RUNNING.pop(id(rs), None)
        return landed


def sweep_servers(specs: list[ServerSpec], plan: SweepPlan, store=None, progress=None, on_record=None,
                  should_cancel=None, log_dir=None) -> SweepResult:
    """Every configuration in turn (run_many over their LoadSweepItems): start or reach its server, send every
    load point, stop it. on_record(rec) after each stored point; what could not run is in the result."""
    from engine.measure.runner import run_many

    res = SweepResult()

    def landed(rec) -> None:  # every point, a configuration's first points too when it failed part-way
        res.records.append(rec)
        if on_record:
            on_record(rec)

    run_many([LoadSweepItem(s, plan, log_dir) for s in specs], None, store, say=progress, should_cancel=should_cancel,
             on_record=landed, noun="configuration", on_skip=lambda sk: res.skipped.append((sk.label, sk.notes)))
    res.cancelled = bool(should_cancel and should_cancel())
    return res


DRAFT_LABELS = {"none": "no draft", "ngram": "n-gram (prompt lookup)", "model": "0.5B draft model (default-draft)",
                "self": "self-draft (its own int4 weights)", "suffix": "suffix decoding (suffix tree)"}


def engine_specs(model: str, precisions: list[str], drafts: list[str], slots: int = 8, max_model_len: int = 2048,
                 gamma: int = 4, kv_dtypes=("auto",), kv_cache_gib: float = 0.0) -> tuple[list[ServerSpec], list[str]]:
    """Our engine at every precision x draft x KV dtype asked for (all at one KV budget; 0: slots x context),
    and notes on the combinations left out (a model draft that is the target itself, or a self-draft no
    cheaper than its target, says nothing about drafting)."""
    from engine.common.errors import UserError
    from engine.common.setup import EngineSetup
    from engine.infer.catalog import canonical_name

    specs, notes = [], []
    for p in precisions:
        for d in drafts:
            if d == "model" and canonical_name(model) == canonical_name("default-draft"):
                notes.append(f"{model} {p} with the 0.5B draft model: the draft is the target itself, left out "
                             "(pick the 1.5B target, or the n-gram draft)")
                continue
            setup = EngineSetup(model=model, precision=p, draft=d, draft_model="default-draft", draft_precision="int4",
                                gamma=gamma)
            if d == "self":
                try:
                    setup.validate()
                except UserError as e:  # the self-draft reads as much as its target: it saves nothing
                    notes.append(f"{model} {p} with a self-draft: {e.problem}, left out")
                    continue
            specs += [ServerSpec(servers.OURS, setup, slots=slots, max_model_len=max_model_len, kv_dtype=kv,
                                 kv_cache_gib=kv_cache_gib).validate() for kv in (kv_dtypes or ("auto",))]
    return specs, notes


def url_specs(text: str) -> list[ServerSpec]:
    """One 'url' configuration per non-empty line (each an http(s) URL, else a UserError naming it); the
    record's model is the one the server says it serves."""
    from engine.load.client import check_url

    return [ServerSpec.of("url", url=check_url(u.strip()), model=None).validate()
            for u in (text or "").splitlines() if u.strip()]
