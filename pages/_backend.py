"""The dashboard's side of the backend: which backend it drives, a banner when it cannot, and jobs run there.

The dashboard measures nothing itself. A page submits work to the backend (engine.backend.client),
keeps the job in its session (each browser tab is a client of its own), polls it lightly (a
fragment, every second and after 10 s every 5 s, draws only the progress bar) and imports the
records into the local store as runs land; the page redraws its tables and charts only then.
"""
from __future__ import annotations

import time
import uuid

import streamlit as st

from engine import present
from engine.backend.client import Backend, BackendError, BackendJobUnknown, BackendUnavailable
from engine.common.errors import UserError
from pages import _ui

URL_KEY = "backend-url"  # the session's override of SCL_BACKEND_URL (the Backend field on Home)
# A job's progress is polled every POLL_S for its first FAST_FOR_S (a short job, a tiny test model, ends
# promptly), then every SLOW_POLL_S. Each poll redraws the panel in the browser, and on a machine as small as
# the engine's (2 cores here) that CPU is taken from the run being measured: bench/dashboard_vs_cli.py --small
# read int8 0.73 and int4 0.68 of the CLI with 1 s polls, 0.89 and 0.86 with 5 s polls (docs/BENCHMARKS.md).
POLL_S = 1.0
SLOW_POLL_S = 5.0
FAST_FOR_S = 10.0
INFO_TIMEOUT_S = 3.0
SUBMIT_TIMEOUT_S = 30.0
TITLE_MAX = 200  # characters of a job's title the backend takes (engine.backend.validate.MAX_TEXT)
LOST_AFTER = 3  # polls in a row without an answer: the backend is gone, the run in progress failed
ACTIVE = ("queued", "running")
RESTART = ("restart the backend (`make run` starts one beside the dashboard, or `.venv/bin/python -m engine backend`) "
           "and run the rest again")


# ---------------------------------------------------------------- which backend

def backend() -> Backend:
    """The backend this session drives: SCL_BACKEND_URL (and its token), or the URL typed on Home."""
    env = Backend.from_env()
    url = (st.session_state.get(URL_KEY) or "").strip().rstrip("/")
    if not url or url == env.url:
        return env
    return Backend(url, token=env.token, timeout_s=env.timeout_s)


def show_problem(e: BaseException) -> None:
    """A backend that cannot be used (not running, unreachable, another version, 401, a refused request) as one
    red line with the fix (the client's BackendError says both); anything else as the dashboard shows errors."""
    _ui.show_error(e)


@st.cache_data(ttl=15, show_spinner=False)
def _info(url: str, token: str | None) -> dict:
    return Backend(url, token=token, timeout_s=INFO_TIMEOUT_S).info()


def info() -> dict:
    """The backend's /v1/info (cached 15 s); raises the client's errors.

    A backend that answers nothing for a moment while it measures keeps the facts this session saw
    last (they are the machine's; `stale_info` says so) rather than hiding the page behind a banner.
    """
    b = backend()
    seen = st.session_state.setdefault("backend-info-seen", {})
    try:
        got = _info(b.url, b.token)
    except BackendUnavailable as e:
        if b.url not in seen:
            raise
        st.session_state["backend-info-stale"] = e.problem
        return seen[b.url]
    seen[b.url] = got
    st.session_state.pop("backend-info-stale", None)
    return got


def stale_info() -> str | None:
    """Why the info shown is the last seen (the backend did not answer just now), or None."""
    return st.session_state.get("backend-info-stale")


def info_or_banner() -> dict | None:
    """The backend's info, or None after drawing the banner that says why there is none."""
    try:
        return info()
    except Exception as e:
        show_problem(e)
        return None


def client_id() -> str:
    """This tab's name for the backend: its jobs are its own (another tab's results never show here)."""
    if "backend-client" not in st.session_state:
        st.session_state["backend-client"] = uuid.uuid4().hex[:12]
    return st.session_state["backend-client"]


# ---------------------------------------------------------------- models the backend offers

def model_entries() -> list[dict]:
    """The backend's models (name, label, …); [] when it cannot be reached (the banner says why)."""
    try:
        return list(info().get("models") or [])
    except Exception:
        return []


def registered() -> dict[str, str]:
    """Test models the backend serves by name (tests/tiny.py's, registered in the backend's process)."""
    return {m["name"]: m.get("label") or m["name"] for m in model_entries() if m.get("registered")}


def model_options() -> list[str]:
    """The default pair, plus any model a test registered in the backend."""
    return ["default", "default-draft"] + [n for n in registered() if n not in ("default", "default-draft")]


def registered_pairs() -> dict[str, tuple]:
    """Registered models NAME with a NAME-draft beside them, as Home-page pairs (target, draft, self, label)."""
    reg = registered()
    return {n: (n, f"{n}-draft", False, f"{n} test pair (registered: {reg[n]})") for n in reg if f"{n}-draft" in reg}


def model_label(name: str) -> str:
    if name == YOUR_MODEL:
        return "your model: a folder or an org/name hub id (type it below)"
    return _ui.MODEL_LABELS.get(name) or registered().get(name, name)


YOUR_MODEL = "your-model"  # the target choice whose model the user types: a folder or a hub id
YOUR_MODEL_HELP = ("A Hugging Face model folder (config.json, *.safetensors and the tokenizer) on the backend's "
                   "machine, or an org/name hub id the backend downloads. The backend checks it when you run "
                   "(docs/MODELS.md lists the families it computes).")


def target_options() -> list[str]:
    """The models a target can be: the backend's, and 'your model' (typed)."""
    return model_options() + [YOUR_MODEL]


def your_model_input(key: str, disabled: bool = False) -> str:
    """The one-line field where a user types their model (read only when 'your model' is chosen)."""
    return st.text_input("Your model (folder on the backend's machine, or org/name)", key=key, disabled=disabled,
                         placeholder="/path/to/model-folder or org/name", help=YOUR_MODEL_HELP)


def chosen_model(choice: str, typed: str | None) -> str:
    """The model name to send: the choice, or what the user typed when the choice is 'your model'.
    The backend checks it (the folder lives on its machine); only an empty entry is refused here."""
    if choice != YOUR_MODEL:
        return choice
    name = (typed or "").strip()
    if not name:
        raise UserError("'your model' is chosen but no model is typed",
                        "type the path of a Hugging Face model folder on the backend's machine, or an org/name hub id")
    return name


# ---------------------------------------------------------------- jobs

class RemoteJob:
    """A job on the backend as this session sees it: its last known state and the runs imported from it."""

    def __init__(self, b: Backend, job_id: str, title: str, keep_ids: list[str] | None = None):
        self.backend, self.job_id, self.title = b, job_id, title
        self.url = b.url
        self.keep_ids = list(keep_ids or [])  # a re-run keeps these beside its new runs in the comparison
        self.status: dict = {"state": "queued", "done": 0, "total": 0, "eta_s": None, "message": "submitted",
                             "run_ids": [], "skipped": [], "error": None, "position": None}
        self.run_ids: list[str] = []  # imported into the local store, in the order they landed
        self.started = time.time()
        self.cancel_requested = False
        self.silent_polls = 0

    # the state, as the pages read it
    @property
    def state(self) -> str:
        return self.status.get("state", "queued")

    @property
    def finished(self) -> bool:
        return self.state not in ACTIVE

    @property
    def cancelled(self) -> bool:
        return self.state == "cancelled" or self.cancel_requested

    @property
    def done(self) -> int:
        return int(self.status.get("done") or 0)

    @property
    def total(self) -> int:
        return int(self.status.get("total") or 0)

    @property
    def error(self) -> str | None:
        return self.status.get("error")

    @property
    def skipped(self) -> list[str]:
        return list(self.status.get("skipped") or [])

    @property
    def message(self) -> str:
        return str(self.status.get("message") or "")

    @property
    def result(self) -> dict | None:
        """What a job answered beside its runs (a llama-quality job's statistics), else None."""
        return self.status.get("result")

    def poll(self, store) -> int:
        """Ask the backend how the job stands and import the runs that landed; returns how many landed now."""
        if self.finished:
            return 0
        try:
            s = self.backend.job(self.job_id)
        except BackendUnavailable as e:
            self.silent_polls += 1
            if self.silent_polls >= LOST_AFTER:
                self._lost(f"the backend at {self.url} stopped answering mid-run ({e.problem})")
            return 0
        except BackendJobUnknown:
            self._lost(f"the backend at {self.url} no longer knows this job (it was restarted on another store)")
            return 0
        except BackendError as e:  # it answers, but refuses us now (token, version)
            self._lost(str(e))
            return 0
        self.silent_polls = 0
        landed = self._import([i for i in s.get("run_ids") or [] if i not in self.run_ids], store)
        self.status = s
        return landed

    def _import(self, ids: list[str], store) -> int:
        if not ids:
            return 0
        try:
            recs = self.backend.records(ids)
        except BackendUnavailable:
            self.silent_polls += 1
            return 0
        for rec in recs:
            store.import_run(rec)
        got = [r["run_id"] if isinstance(r, dict) else r.run_id for r in recs]
        self.run_ids += [i for i in ids if i in got]
        return len(got)

    def _lost(self, why: str) -> None:
        """The backend went away: what landed stays stored, the run in progress is failed with the reason."""
        kept = len(self.run_ids)
        self.status = {**self.status, "state": "failed", "message": "failed",
                       "error": f"{why}: the run in progress failed; the {kept} finished run{'s' * (kept != 1)} "
                                f"{'are' if kept != 1 else 'is'} kept. Fix: {RESTART}."}

    def cancel(self) -> None:
        self.cancel_requested = True
        self.backend.cancel(self.job_id)

    def wait(self, store, timeout_s: float | None = None, every_s: float = 0.3) -> bool:
        """Poll until the job ends (tests and scripts; a page polls from its progress fragment)."""
        deadline = None if timeout_s is None else time.time() + timeout_s
        while not self.finished and (deadline is None or time.time() < deadline):
            self.poll(store)
            if not self.finished:
                time.sleep(every_s)
        return self.finished


def submit(key: str, title: str, work: dict, keep_ids: list[str] | None = None) -> RemoteJob:
    """Send `work` to the backend as this tab's job, remembered under `key`; raises the client's errors.

    keep_ids: runs kept beside the new ones in the comparison.
    """
    b = backend()
    if len(title) > TITLE_MAX:  # a label with a long folder path: the title only names the job
        title = title[:TITLE_MAX - 1] + "…"
    # the backend checks the whole submission first (a workload's prompts are read once: seconds)
    checked = Backend(b.url, token=b.token, timeout_s=max(b.timeout_s, SUBMIT_TIMEOUT_S))
    job = RemoteJob(b, checked.submit(title, work, client=client_id()), title, keep_ids)
    st.session_state[key] = job
    st.session_state.pop(f"{key}-reported", None)
    return job


def run_here(key: str, title: str, work: dict, say=None, every_s: float = 0.5) -> RemoteJob:
    """Submit and wait in this script run (a short job the page cannot draw without: a load, a quality score),
    polling every `every_s` and passing the backend's progress to say(); raises when it ends without a run
    (or, for a job that stores none, without its result)."""
    job = submit(key, title, work)
    store = _ui.get_store()
    while not job.finished:
        time.sleep(every_s)
        job.poll(store)
        if say is not None:
            say(f"{job.message} (on {job.url})" if job.state == "running" else "queued on the backend: it runs one "
                "measurement at a time")
    if job.error or not (job.run_ids or job.result):
        raise BackendError(f"{title} did not finish: {job.error or job.state}", "see the message above, then try again")
    return job


def work(items: list[dict], record_kind: str = "bench", stream: bool = False) -> dict:
    """A job as the backend takes it: work items run in order, each {"kind": run | peer | quality | llama-quality |
    load | load-sweep, its fields}; `record_kind` is what our runs are stored as, `stream` streams the first."""
    return {"items": list(items), "record_kind": record_kind, "stream": bool(stream)}


def runs_work(configs: list[dict], record_kind: str = "bench", stream: bool = False,
              peers: list[dict] | None = None) -> dict:
    """Our RunConfigs, then any PeerConfigs beside them (each peer in a fresh process), as one job."""
    return work([{"kind": "run", **c} for c in configs] + [{"kind": "peer", **p} for p in peers or []],
                record_kind, stream)


def job_running(key: str) -> bool:
    job = st.session_state.get(key)
    return job is not None and not job.finished


def job_panel(key: str) -> None:
    """Progress with the time left and a Cancel button, polled while the job runs (POLL_S, then SLOW_POLL_S).

    Only this panel redraws on a poll. When runs land, or the job ends, the whole page reruns so its
    tables and charts show what landed.
    """
    job: RemoteJob | None = st.session_state.get(key)
    fast = job is not None and time.time() - job.started < FAST_FOR_S

    @st.fragment(run_every=POLL_S if fast else SLOW_POLL_S)
    def _panel():
        j: RemoteJob | None = st.session_state.get(key)
        if j is None:
            return
        if j.poll(_ui.get_store()) or j.finished or (fast and time.time() - j.started >= FAST_FOR_S):
            st.rerun()  # the whole page: what landed, how it ended, or the panel again at the slow interval
        s = j.status
        if j.state == "queued":
            pos = s.get("position")
            ahead = f"{pos} job{'s' * (pos != 1)} ahead" if isinstance(pos, int) and pos > 0 else "next"
            st.progress(0.0, text=f"Queued on the backend ({ahead}): it runs one measurement at a time")
        else:
            frac = (j.done / j.total) if j.total else 0.0
            st.progress(min(frac, 1.0), text=present.eta_text(j.done, j.total, s.get("eta_s")))
        silent = f" · the backend has not answered {j.silent_polls} poll(s)" if j.silent_polls else ""
        st.caption(f"{_ui.md_escape(j.title)} · {_ui.md_escape(j.message)} · {time.time() - j.started:.0f} s elapsed "
                   f"· on {_ui.md_code(j.url)}{silent}")
        if st.button("Cancel", key=f"{key}-cancel", disabled=j.cancelled,
                     help="Stops after the run in progress; finished runs are already saved."):
            try:
                j.cancel()
                st.toast("Cancelling after the current run")
            except Exception as e:
                show_problem(e)

    _panel()


def job_section(key: str, source: str) -> RemoteJob | None:
    """Draw the job under `key`: its progress while it runs, how it ended once it has."""
    job: RemoteJob | None = st.session_state.get(key)
    if job is None:
        return None
    if not job.finished:
        job_panel(key)
        return job
    return finish_job(key, source)


def finish_job(key: str, source: str) -> RemoteJob | None:
    """When a job has ended: its runs become the current comparison (once), and how it ended is said."""
    job: RemoteJob | None = st.session_state.get(key)
    if job is None or not job.finished:
        return None
    if st.session_state.get(f"{key}-reported") != job.job_id:
        st.session_state[f"{key}-reported"] = job.job_id
        if job.run_ids:
            _ui.set_current(job.keep_ids + job.run_ids, source)
            st.rerun()  # the page above this section drew the previous comparison: its answer row first
    if job.error:
        st.error(job.error)
    for s in job.skipped:
        st.warning(f"Not measured: {s}")
    if job.state == "cancelled":
        st.warning(f"Cancelled: {job.done} of {job.total} runs finished and are kept.")
    elif job.state == "finished" and not job.error:
        took = job.status.get("elapsed_s")
        took = took if isinstance(took, (int, float)) else time.time() - job.started
        st.success(f"{job.title}: {job.done} of {job.total} runs finished in {took:.0f} s.")
    return job
