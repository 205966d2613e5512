"""The backend's jobs: a FIFO queue and ONE worker thread, so two measurements never share the cores.

A job is a list of work items (our runs, peers, quality scores, model loads, load sweeps: validate.ITEMS). The
worker takes the oldest queued job, runs it to the end (or to a cancel, which stops before the next run), and the
next one starts only then. Every record is written to the backend's store the moment its run
finishes, so a cancel, an error or a killed backend keeps every finished run.

Jobs are journalled (a small SQLite file beside the store): after a restart the backend still
answers for the jobs it had, and a job that was queued or running when its backend died is marked
failed with that reason. Jobs are never resumed after a restart: the page resubmits what is missing.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections import deque
from contextlib import closing
from pathlib import Path

from engine.backend.contract import ENDED
from engine.backend.validate import Submission
from engine.common.errors import UserError

log = logging.getLogger("scl.backend")

JOURNAL_KEEP = 500  # jobs a restarted backend still answers for
CANCELLING = "cancelling: the run in progress finishes and is kept, the rest are skipped"


def token_event(text: str, origin: str, token_id: int) -> dict:
    """One streamed token: its text, where it came from, and whether a draft proposed it
    (True: an accepted draft token; False: the target's own token in a speculative round; None: no draft)."""
    accepted = True if origin == "accepted" else (False if origin in ("bonus", "resample") else None)
    return {"text": text, "origin": origin, "accepted": accepted, "token_id": int(token_id)}


class Job:
    """One submission's state, as GET /v1/jobs/{id} shows it. The worker calls add_run / skip / say;
    `store`, `cancelled` and `cancel_event` make it the `job` that engine.cluster.sweep_job works on."""

    def __init__(self, sub: Submission | None, store=None, job_id: str | None = None):
        self.job_id = job_id or uuid.uuid4().hex[:12]
        self.sub = sub
        self.store = store
        self.title = sub.title if sub else ""
        self.client = sub.client if sub else None
        self.kind = "+".join(dict.fromkeys(sub.work.kinds)) if sub else ""  # its items' kinds, e.g. "run+peer"
        self.state = "queued"
        self.done = 0
        self.total = sub.work.total if sub else 0
        self.eta_s: float | None = None
        self.message = "queued"
        self.run_ids: list[str] = []
        self.skipped: list[str] = []
        self.error: str | None = None
        self.result: dict | None = None  # the last item's result that has one: a quality score, a load's facts
        self.created_at = time.time()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.pid = os.getpid()
        self.cancel_event = threading.Event()
        self.events: list[dict] = []  # streamed tokens of the first run (work.stream)
        self.stream_done = False
        self.on_change = lambda job: None  # the journal's hook
        # Held while a change is made and journaled; to_dict waits on it, so a client is never shown a run or a
        # state that a backend killed before the write would not list after its restart.
        self.publish = threading.RLock()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def say(self, msg: str) -> None:
        if not self.cancelled:
            self.message = msg

    def add_run(self, run_id: str) -> None:
        """A run finished and is stored: counted, with the time left at the pace so far, journaled before any
        reader sees it."""
        with self.publish:
            self.run_ids.append(run_id)
            self.done += 1
            elapsed = time.time() - (self.started_at or self.created_at)
            self.eta_s = elapsed / self.done * max(0, self.total - self.done)
            self.on_change(self)

    def skip(self, what: str, runs: int = 0) -> None:
        """Something this job could not measure (with why), and the runs it will therefore not make."""
        with self.publish:
            self.skipped.append(what)
            self.total = max(self.done, self.total - runs)
            self.on_change(self)

    def token(self, i: int, token_id: int, text: str, origin: str) -> None:
        if i == 0:  # the first sequence, as the playground draws it
            self.events.append(token_event(text, origin, token_id))

    def to_dict(self, position: int | None = None) -> dict:
        with self.publish:
            return {"job_id": self.job_id, "title": self.title, "client": self.client, "kind": self.kind,
                    "state": self.state, "position": position, "done": self.done, "total": self.total,
                    "eta_s": self.eta_s, "message": self.message, "run_ids": list(self.run_ids),
                    "skipped": list(self.skipped), "error": self.error, "result": self.result,
                    "created_at": self.created_at, "started_at": self.started_at, "finished_at": self.finished_at,
                    "pid": self.pid}

    @classmethod
    def from_journal(cls, d: dict) -> "Job":
        job = cls(None, job_id=d["job_id"])
        for k in ("title", "client", "kind", "state", "done", "total", "eta_s", "message", "run_ids", "skipped",
                  "error", "result", "created_at", "started_at", "finished_at", "pid"):
            if k in d:
                setattr(job, k, d[k])
        job.stream_done = True
        return job


class Journal:
    """Jobs as JSON rows in SQLite, rewritten at each change (a few per run, never during one)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        with self.lock, closing(sqlite3.connect(self.path, timeout=30)) as c, c:
            c.execute("CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, created_at REAL, body TEXT NOT NULL)")

    def save(self, job: Job) -> None:
        body = json.dumps(job.to_dict())
        with self.lock, closing(sqlite3.connect(self.path, timeout=30)) as c, c:
            c.execute("INSERT OR REPLACE INTO jobs (job_id, created_at, body) VALUES (?,?,?)",
                      (job.job_id, job.created_at, body))

    def recent(self, n: int = JOURNAL_KEEP) -> list[dict]:
        with self.lock, closing(sqlite3.connect(self.path, timeout=30)) as c:
            rows = c.execute("SELECT body FROM jobs ORDER BY created_at DESC LIMIT ?", (n,)).fetchall()
        return [json.loads(b) for (b,) in reversed(rows)]


def _pid_alive(pid) -> bool:
    try:
        import psutil

        return bool(pid) and psutil.pid_exists(int(pid))
    except Exception:
        return False


class JobQueue:
    """Jobs by id, the FIFO of queued ones, and the one worker thread that runs them."""

    def __init__(self, store, pool, ray: str | None = None, journal: Journal | None = None):
        self.store, self.pool, self.ray, self.journal = store, pool, ray, journal
        self.jobs: dict[str, Job] = {}
        self.queue: deque[str] = deque()
        self.running: str | None = None
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._worker, name="scl-backend-worker", daemon=True)
        if journal is not None:
            self._recover()

    # ---- journal
    def _persist(self, job: Job) -> None:
        if self.journal is not None:
            try:
                self.journal.save(job)
            except sqlite3.Error:  # the journal is a convenience; a measurement never fails for it
                log.exception("could not journal job %s", job.job_id)

    def _recover(self) -> None:
        """Jobs of earlier backends on this store: the ended ones as they were; a queued or running one
        whose backend is gone is failed, saying so (never resumed)."""
        for d in self.journal.recent():
            job = Job.from_journal(d)
            if not job.ended:
                if job.pid != os.getpid() and _pid_alive(job.pid):
                    continue  # another live backend's job on the same store: not ours to judge
                was = job.state
                job.state, job.finished_at = "failed", job.finished_at or time.time()
                job.error = (f"the backend (pid {job.pid}) stopped while this job was {was}; jobs are not resumed "
                             f"after a restart: its {job.done} finished run(s) are stored, resubmit the rest")
                job.message = "lost: the backend stopped"
                self._persist(job)
            job.on_change = self._persist
            self.jobs[job.job_id] = job

    # ---- the HTTP side
    def start(self) -> "JobQueue":
        self.thread.start()
        return self

    def submit(self, sub: Submission) -> Job:
        job = Job(sub, self.store)
        job.on_change = self._persist
        with self.cond:
            if self.stopping:
                raise UserError("the backend is stopping", "start it again: python -m engine backend")
            self.jobs[job.job_id] = job
            self.queue.append(job.job_id)
            self._persist(job)
            self.cond.notify()
        return job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def position(self, job: Job) -> int | None:
        """0 while running, 1.. while queued (1: next), None once ended."""
        if job.state == "running":
            return 0
        try:
            return list(self.queue).index(job.job_id) + 1
        except ValueError:
            return None

    def view(self, job: Job) -> dict:
        return job.to_dict(self.position(job))

    def for_client(self, client: str | None) -> list[Job]:
        return [j for j in list(self.jobs.values()) if client is None or j.client == client]

    def cancel(self, job: Job) -> Job:
        """A queued job is dropped; a running one stops before its next run (finished runs stay stored)."""
        with self.cond:
            with job.publish:
                if job.state == "queued":
                    self.queue.remove(job.job_id)
                    job.state, job.finished_at, job.message = "cancelled", time.time(), "cancelled before it started"
                    job.cancel_event.set()
                    self._persist(job)
                elif job.state == "running" and not job.cancelled:
                    job.cancel_event.set()
                    job.message = CANCELLING
                    self._persist(job)
        return job

    def status(self) -> dict:
        return {"running": self.running, "queued": list(self.queue)}

    def stop(self, reason: str = "the backend was stopped") -> None:
        """Fail what is queued or running (the journal says why), and let the worker end."""
        with self.cond:
            self.stopping = True
            for jid in list(self.queue) + ([self.running] if self.running else []):
                job = self.jobs[jid]
                with job.publish:
                    job.cancel_event.set()
                    was = job.state
                    job.state, job.finished_at = "failed", time.time()
                    job.error = f"{reason} while this job was {was}: its {job.done} finished run(s) are stored"
                    self._persist(job)
            self.queue.clear()
            self.cond.notify_all()

    # ---- the worker
    def _worker(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                job = self.jobs[self.queue.popleft()]
                self.running = job.job_id
                with job.publish:
                    job.state, job.started_at, job.message = "running", time.time(), "starting"
                    self._persist(job)
            try:
                self._run(job)
            except UserError as e:
                job.error = str(e)
            except Exception as e:  # one line for the page; the traceback in the backend's log
                log.exception("job %s failed", job.job_id)
                job.error = f"{type(e).__name__}: {e}"
            finally:
                with self.cond, job.publish:
                    self.running = None
                    nothing = not job.run_ids and job.skipped
                    if job.state == "running" and not job.error and not job.cancelled and nothing:
                        job.error = f"nothing was measured: {len(job.skipped)} skipped, the first: {job.skipped[0]}"
                    if job.state == "running":  # stop() may have failed it already
                        job.state = "failed" if job.error else ("cancelled" if job.cancelled and job.done < job.total
                                                                else "finished")
                        job.finished_at = time.time()
                        job.eta_s = 0.0 if job.state == "finished" else None
                        job.message = {"finished": "finished", "failed": "failed",
                                       "cancelled": f"cancelled: {job.done} of {job.total} run(s) finished and kept"
                                       }[job.state]
                    job.stream_done = True
                    self._persist(job)

    def _run(self, job: Job) -> None:
        """The job's items through run_many, in order. On Ray (a streamed generation is interactive, so it runs
        here) our runs go to the cluster first, one task each, and the other items follow here."""
        from engine.measure.runner import run_many
        from engine.measure.run_config import RunConfig

        work = job.sub.work
        items = work.items
        if self.ray and not work.stream and any(isinstance(i, RunConfig) for i in items):
            from engine.cluster import sweep_job

            sweep_job([i for i in items if isinstance(i, RunConfig)], self.ray)(job)
            items = [i for i in items if not isinstance(i, RunConfig)]

        def landed(rec) -> None:
            job.stream_done = True  # the streamed first run is over once any run has landed
            job.add_run(rec.run_id)

        def over(item, outcome) -> None:
            if getattr(item, "result", None) is not None:  # a quality score's statistics, a load's facts
                job.result = item.result
            if outcome is None:  # done without a record (a model loaded): one step of the job
                job.done += 1
                job.on_change(job)

        run_many(items, self.pool, self.store, say=job.say, should_cancel=lambda: job.cancelled, on_record=landed,
                 on_skip=lambda rec: job.skip(f"{rec.label}: {rec.notes}", runs=getattr(rec, "runs", 1)),
                 on_item=over, on_token=job.token if work.stream else None, kind=work.record_kind)
