"""Shared Streamlit pieces for the pages: the model pool and store, errors, prices, background jobs,
and the comparison view (table + charts + Pareto). Pages only draw and collect input; every
number comes from engine/.

Test hook (documented in docs/DASHBOARD.md): models registered with engine.measure.register_model
(tests/conftest.py registers the tiny random-init models of tests/tiny.py) are offered beside the
default pair, so AppTests can drive every page in seconds. Production code registers none.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import streamlit as st

from engine import present
from engine.common.errors import UserError
from engine.common.formulas import DEFAULT_USD_PER_HOUR
from engine.common.paths import data_dir
from engine.measure import ModelPool, Store, registered_models, run_many

log = logging.getLogger("scl.dashboard")

MODEL_LABELS = {
    "default": "default: Qwen2.5-Coder-1.5B-Instruct (target)",
    "default-draft": "default-draft: Qwen2.5-Coder-0.5B-Instruct (draft, or a small target)",
}


# ---------------------------------------------------------------- pool and store

@st.cache_resource(show_spinner=False)
def get_pool() -> ModelPool:
    """One pool per server process: every tab shares the loaded models and the generation lock."""
    return ModelPool(keep=3)


@st.cache_resource(show_spinner=False)
def _store(path: str) -> Store:
    return Store(path)


def get_store() -> Store:
    return _store(str(data_dir() / "lab.sqlite"))


@contextmanager
def pool_turn(what: str):
    """Hold the pool's lock (one generation or load at a time), saying so when another run has it."""
    lock = get_pool().lock
    if not lock.acquire(blocking=False):
        note = st.empty()
        note.info(f"Waiting for the run in progress to finish before {what} (one at a time)…")
        lock.acquire()
        note.empty()
    try:
        yield
    finally:
        lock.release()


def model_options() -> list[str]:
    """The default pair, plus any model a test registered (measure.register_model)."""
    return ["default", "default-draft"] + list(registered_models())


def registered_pairs() -> dict[str, tuple]:
    """Registered models NAME with a NAME-draft beside them, as Home-page pairs (target, draft, self, label)."""
    reg = registered_models()
    return {n: (n, f"{n}-draft", False, f"{n} test pair (registered: {reg[n]})")
            for n in reg if f"{n}-draft" in reg}


def model_label(name: str) -> str:
    return MODEL_LABELS.get(name) or registered_models().get(name, name)


# ---------------------------------------------------------------- errors and text

def show_error(e: BaseException) -> None:
    """Engine errors (UserError) as they are; anything else as one line, the traceback only in the log."""
    if isinstance(e, UserError):
        st.error(str(e))
    else:
        log.exception("dashboard error")
        st.error(f"{type(e).__name__}: {e}")


_MD_SPECIAL = set("\\`*_{}[]()#+-.!|<>~$")


def md_escape(s) -> str:
    """Text safe to put inside st.markdown: markdown and HTML characters are backslash-escaped."""
    return "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(s))


# ---------------------------------------------------------------- current comparison and price

def current_ids() -> list[str]:
    return list(st.session_state.get("comparison", []))


def set_current(ids: list[str], source: str) -> None:
    st.session_state["comparison"] = list(dict.fromkeys(ids))
    st.session_state["comparison_source"] = source


def load_records(ids: list[str]):
    """Records for ids from the store, in order; ids no longer stored are skipped (and reported)."""
    store, out, missing = get_store(), [], []
    for i in ids:
        try:
            out.append(store.get_run(i))
        except UserError:
            missing.append(i)
    if missing:
        st.warning(f"{len(missing)} run(s) of the current comparison are no longer in the store; showing the rest.")
    return out


def usd_per_hour() -> float:
    """This machine's $/hour (the planner's price table keeps it), read once per session."""
    if "usd_per_hour" not in st.session_state:
        from engine.present import planning

        try:
            price = planning.machine_price(get_store())
        except Exception:  # a damaged override table must not hide the page
            price = DEFAULT_USD_PER_HOUR
        st.session_state["usd_per_hour"] = price
    return float(st.session_state["usd_per_hour"])


def price_input(where: str) -> float:
    """The editable $/hour of this machine; saved as the planner's override for 'this machine'.

    One price for every page: a widget the user did not touch follows a price changed elsewhere
    (another page, the Cost page's GPU price form), and an edit here is saved for all of them.
    """
    key, seen = f"price-{where}", f"price-{where}-seen"
    cur = usd_per_hour()
    if key not in st.session_state or (st.session_state.get(seen) == st.session_state[key]
                                       and abs(st.session_state[key] - cur) > 1e-12):
        st.session_state[key] = cur
    v = float(st.number_input("$ per hour for this machine", min_value=0.0001, max_value=10_000.0, step=0.01,
                              format="%.4f", key=key,
                              help="What an hour of this machine costs you (cloud price, or power + amortisation). "
                                   "Used for $ per 1M output tokens and saved for the Cost & capacity planner."))
    st.session_state[seen] = v
    if abs(v - cur) > 1e-12:
        st.session_state["usd_per_hour"] = v
        try:
            from engine.present import planning

            planning.set_machine_price(get_store(), v)
        except Exception as e:
            show_error(e)
    return v


# ---------------------------------------------------------------- background jobs (comparison, sweep)

class Job:
    """run_many in a thread: the page polls it, Cancel stops it before the next run (finished runs stay stored).

    `work(job)` runs instead of run_many when given (the Load test page's sweep): it reports through
    job.add_run / job.skip / job.say and stops when job.cancelled; `total` is then its number of runs.
    """

    def __init__(self, title: str, configs, pool: ModelPool, store: Store, keep_ids: list[str] | None = None,
                 work=None, total: int | None = None):
        self.title, self.configs, self.pool, self.store = title, list(configs), pool, store
        self.keep_ids = list(keep_ids or [])  # a re-run keeps these beside its new runs in the comparison
        self.work = work
        self.total = len(self.configs) if total is None else total
        self.done = 0
        self.eta_s: float | None = None
        self.run_ids: list[str] = []
        self.skipped: list[str] = []  # peers that could not run, with the reason
        self.message = "starting"
        self.error: str | None = None
        self.cancel_event = threading.Event()
        self.finished = False
        self.started = time.time()
        self.thread = threading.Thread(target=self._run, name=f"scl-job-{title}", daemon=True)

    def start(self) -> "Job":
        self.thread.start()
        return self

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def cancel(self) -> None:
        self.cancel_event.set()
        self.message = "cancelling: the run in progress finishes and is kept, the rest are skipped"

    def _progress(self, done, total, eta_s, rec):
        self.done, self.eta_s = done, eta_s
        if rec.kind == "peer" and not rec.metrics:  # a peer that could not run: said, not stored
            self.skipped.append(f"{rec.label}: {rec.notes}")
        else:
            self.run_ids.append(rec.run_id)

    def _say(self, msg: str):
        if not self.cancelled:
            self.message = msg

    say = _say

    def add_run(self, run_id: str) -> None:
        """A run a `work` job finished (stored): counted, with the time left at the pace so far."""
        self.run_ids.append(run_id)
        self.done += 1
        left = max(0, self.total - self.done)
        self.eta_s = (time.time() - self.started) / self.done * left

    def skip(self, what: str, runs: int = 0) -> None:
        """Something a `work` job could not measure (said on the page), and the runs it will not make."""
        self.skipped.append(what)
        self.total = max(self.done, self.total - runs)

    def _run(self):
        try:
            if not self.pool.lock.acquire(blocking=False):
                self.message = "waiting for another run to finish (the lab runs one generation at a time)"
                self.pool.lock.acquire()
            try:
                if self.work is not None:
                    self.work(self)
                else:
                    run_many(self.configs, self.pool, self.store, on_progress=self._progress,
                             should_cancel=self.cancel_event.is_set, progress=self._say)
            finally:
                self.pool.lock.release()
        except UserError as e:
            self.error = str(e)
        except Exception as e:  # shown as one line on the page; the traceback goes to the server log
            log.exception("job %s failed", self.title)
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.message = "finished"
            self.finished = True

    def wait(self, timeout: float | None = None) -> bool:
        self.thread.join(timeout)
        return self.finished


def job_running(key: str) -> bool:
    job = st.session_state.get(key)
    return job is not None and not job.finished


def start_job(key: str, title: str, configs, keep_ids: list[str] | None = None, work=None,
              total: int | None = None) -> Job:
    job = Job(title, configs, get_pool(), get_store(), keep_ids, work, total).start()
    st.session_state[key] = job
    return job


def job_panel(key: str, poll_s: float = 1.0) -> None:
    """Progress bar with time left and a Cancel button, refreshed every poll_s while the job runs.

    When the job has finished the fragment asks for a full rerun, so the page draws the results.
    """
    if st.session_state.get(key) is None:
        return

    @st.fragment(run_every=poll_s)
    def _panel():
        j: Job = st.session_state[key]
        if j.finished:
            st.rerun()
        frac = (j.done / j.total) if j.total else 1.0
        st.progress(min(frac, 1.0), text=present.eta_text(j.done, j.total, j.eta_s))
        st.caption(f"{md_escape(j.title)} · {md_escape(j.message)} · {time.time() - j.started:.0f} s elapsed")
        if st.button("Cancel", key=f"{key}-cancel", disabled=j.cancelled,
                     help="Stops after the run in progress; finished runs are already saved."):
            j.cancel()
            st.toast("Cancelling after the current run")

    _panel()


def job_section(key: str, source: str) -> Job | None:
    """Draw the job under `key`: its progress while running, how it ended once finished."""
    job: Job | None = st.session_state.get(key)
    if job is None:
        return None
    if not job.finished:
        job_panel(key)
        return job
    return finish_job(key, source)


def finish_job(key: str, source: str) -> Job | None:
    """When a job has finished: make its runs the current comparison and say how it ended."""
    job: Job | None = st.session_state.get(key)
    if job is None or not job.finished:
        return None
    if not st.session_state.get(f"{key}-reported") == id(job):
        st.session_state[f"{key}-reported"] = id(job)
        if job.run_ids:
            set_current(job.keep_ids + job.run_ids, source)
    if job.error:
        st.error(job.error)
    for s in job.skipped:
        st.warning(f"Not measured: {s}")
    if job.cancelled:
        st.warning(f"Cancelled: {job.done} of {job.total} runs finished and are kept.")
    elif not job.error:
        st.success(f"{job.title}: {job.done} of {job.total} runs finished in {time.time() - job.started:.0f} s.")
    return job


# ---------------------------------------------------------------- the comparison view

USD_LABEL = present.COLUMNS_BY_NAME["usd_per_1m_out"].label  # one stream at the measured batch size, not under load


def _table(rows: list[dict], view: str, key: str) -> None:
    """A view of present.columns drawn as a sortable table: its columns that hold a value, with the columns'
    labels, help and formats."""
    df = pd.DataFrame(present.with_half_widths(rows))
    cells = [c for c in present.table_cells(view) if c.name in df.columns and df[c.name].notna().any()]
    kind = {True: st.column_config.TextColumn, False: st.column_config.NumberColumn}
    config = {c.name: kind[c.text](c.label, help=c.help, **({"format": c.fmt} if c.fmt else {})) for c in cells}
    st.dataframe(df[[c.name for c in cells]], hide_index=True, key=key, column_config=config)


def comparison_table(rows: list[dict], key: str) -> None:
    _table(rows, "page", key)


def category_table(records, key: str) -> None:
    """Speed and acceptance per workload category, when a run measured more than one prompt."""
    rows = present.category_rows(records)
    if not any(r.get("category") not in ("all", "default", "prompt") for r in rows):
        return
    with st.expander("By workload category", expanded=True):
        _table(rows, "category", key)
        st.caption("Speed: median over the category's samples, ± over repetitions. Acceptance: token-weighted "
                   "(accepted / drafted) and per request (the mean of each prompt's), ± over prompts.")


def comparison_view(records, key: str, price_where: str | None = None, usd: float | None = None) -> list[dict]:
    """Sortable table, the metric charts side by side, and the cost-vs-quality Pareto view."""
    if not records:
        st.info("No runs to show yet.")
        return []
    if usd is None:
        usd = price_input(price_where or key)
    rows = present.comparison_rows(records, usd)
    hl = present.highlights(rows)
    if hl:
        st.markdown("\n".join(f"- {md_escape(h)}" for h in hl))
    comparison_table(rows, key=f"{key}-table")
    noisy = present.noisy_configs(records)
    if noisy:
        st.warning(f"{len(noisy)} of {len(records)} runs were measured on a noisy machine (the noise column says "
                   "why): their numbers may be the machine's, not the configuration's.")
    category_table(records, key=f"{key}-categories")
    charts = present.available_charts(rows)
    for i in range(0, len(charts), 2):
        cols = st.columns(2)
        for c, (col, title, unit, better) in zip(cols, charts[i:i + 2]):
            with c:
                st.plotly_chart(present.bar_figure(rows, col, title, unit, better), key=f"{key}-chart-{col}",
                                config={"displaylogo": False})
    st.caption("Bars: the median; whiskers: its 95% interval (speed over repetitions, acceptance over prompts); "
               "⚠ marks a run the noise guard flagged. $/1M is the cost of one stream at the measured batch size.")
    missing = present.missing_charts(rows)
    if missing:
        st.caption("Not measured in these runs: " + md_escape(", ".join(missing))
                   + ". Quality needs the quality option; acceptance needs a draft.")
    pf = present.pareto_figure(rows)
    if pf is not None:
        axes = present.pareto_axes(rows)
        st.plotly_chart(pf, key=f"{key}-pareto", config={"displaylogo": False})
        if axes and axes[1] != "quality_loss_kl":
            st.caption("Quality was not measured, so the frontier is cost vs memory. Tick 'measure quality' to see "
                       "cost vs quality.")
    return rows


def workload_input(key: str, default: str) -> str:
    """The workload text box (category:count, ...), with the categories and their sizes in its help."""
    from engine.measure import workload_categories

    try:
        cats = ", ".join(f"{c} ({n})" for c, n in workload_categories().items())
    except UserError as e:
        cats = f"unavailable: {e}"
    return st.text_input("Workload", value=default, key=key,
                         help="Prompts from real data: category:count, comma-separated (e.g. code:8,edit:8). "
                              f"Categories (prompts available): {cats}. Prompts longer than the context are "
                              "skipped and counted.")


# Set by app.py while st.navigation runs a page (per script thread).
UNDER_APP = threading.local()


def hand_over_to_app() -> None:
    """Run app.py when Streamlit runs a page file as the main script, then stop this run.

    On a server whose first session opens a deep link (/compare), Streamlit's pages/ discovery
    runs pages/compare.py by itself: no page config, and a menu listing the files of pages/. app.py
    then builds the real navigation, which runs the asked-for page inside it. AppTests run page
    files directly on purpose and set SCL_PAGE_DIRECT=1.
    """
    if getattr(UNDER_APP, "active", False) or os.environ.get("SCL_PAGE_DIRECT") == "1":
        return
    import runpy

    runpy.run_path(str(Path(__file__).resolve().parent.parent / "app.py"), run_name="__main__")
    st.stop()


def page_header(title: str, blurb: str) -> None:
    hand_over_to_app()
    st.title(title)
    st.caption(blurb)
