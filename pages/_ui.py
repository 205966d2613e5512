"""Shared Streamlit pieces for the pages: the store, errors, prices and the comparison view (table + charts +
Pareto). Pages only draw and collect input; every number comes from engine/, and every measurement runs
in the backend (pages/_backend.py): this process never loads a model.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pandas as pd
import streamlit as st

from engine import present
from engine.common.errors import UserError
from engine.common.formulas import DEFAULT_USD_PER_HOUR
from engine.common.paths import data_dir
from engine.measure.store import Store

log = logging.getLogger("scl.dashboard")

MODEL_LABELS = {
    "default": "default: Qwen2.5-Coder-1.5B-Instruct (target)",
    "default-draft": "default-draft: Qwen2.5-Coder-0.5B-Instruct (draft, or a small target)",
}


# ---------------------------------------------------------------- the store (records the backend sent)

@st.cache_resource(show_spinner=False)
def _store(path: str) -> Store:
    return Store(path)


def get_store() -> Store:
    return _store(str(data_dir() / "lab.sqlite"))


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


def md_code(s) -> str:
    """Text as a markdown code span (a URL stays one piece of text: escapes would show inside an auto-link)."""
    return "`" + str(s).replace("`", "'") + "`"


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


def labelled_table(rows: list[dict], key: str, labels: dict[str, str], **config) -> None:
    """Rows as a table under their labels (with units), the first column pinned, no "None" in a cell; `config`: a
    column's own st.column_config (its label included)."""
    df = pd.DataFrame(rows)
    for c in df.columns:
        if df[c].dtype == object:
            df[c] = df[c].map(lambda v: "" if v is None else v)
    cols = {c: config.get(c) or st.column_config.Column(labels.get(c, c)) for c in df.columns}
    if len(df.columns):
        first = df.columns[0]
        cols[first] = st.column_config.Column(labels.get(first, first), pinned=True)
    st.dataframe(df, hide_index=True, key=key, column_config=cols)


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


PEER_METHOD = ("Peer rows are measured another way than the lab's runs: each system (ours included, as "
               "serving-cost-lab) gets one prompt, greedy with EOS ignored, in a fresh process, one warm-up and the "
               "repetitions shown, timed by wall-clock token arrivals in Python (engine/peers/peer.py). The lab's runs "
               "time the workload's prompts by the engine's own step sums. Compare peers with each other; set "
               "against the runs above they are a different method.")


def comparison_view(records, key: str, usd: float | None = None) -> list[dict]:
    """Sortable table, the metric charts side by side, and the cost-vs-quality Pareto view; peer records
    (another timing method) get their own table below the lab's runs, never rows among them."""
    if not records:
        st.info("No runs to show yet.")
        return []
    if usd is None:
        usd = usd_per_hour()  # the sidebar's price (page_header)
    runs = [r for r in records if r.kind != "peer"]
    peer_recs = [r for r in records if r.kind == "peer"]
    for d in present.drifts(runs, get_store().list_runs(limit=1000)):
        st.warning("Drift: " + md_escape(d.words))
    rows = _group_view(runs, key, usd) if runs else []
    if peer_recs:
        st.markdown("**Peer systems** (a separate table: another method)")
        st.caption(PEER_METHOD)
        rows += _group_view(peer_recs, f"{key}-peers", usd)
    return rows


def _group_view(records, key: str, usd: float | None) -> list[dict]:
    """The answers in words, then the evidence in tabs: the table (and per category), the charts, the frontier."""
    rows = present.comparison_rows(records, usd)
    hl = present.highlights(rows)
    if hl:
        st.markdown("\n".join(f"- {md_escape(h)}" for h in hl))
    noisy = present.noisy_configs(records)
    if noisy:
        st.warning(f"{len(noisy)} of {len(records)} runs were measured on a noisy machine (the noise column says "
                   "why): their numbers may be the machine's, not the configuration's.")
    charts = present.available_charts(rows)
    pf = present.pareto_figure(rows)
    t_table, t_charts, t_front = st.tabs(["Table", f"Charts ({len(charts)})", "Cost vs quality"])
    with t_table:
        comparison_table(rows, key=f"{key}-table")
        category_table(records, key=f"{key}-categories")
    with t_charts:
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
    with t_front:
        if pf is None:
            st.caption("Fewer than two runs with a cost: no frontier to draw.")
        else:
            axes = present.pareto_axes(rows)
            st.plotly_chart(pf, key=f"{key}-pareto", config={"displaylogo": False})
            if axes and axes[1] != "quality_loss_kl":
                st.caption("Quality was not measured, so the frontier is cost vs memory. Tick 'measure quality' to "
                           "see cost vs quality.")
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


def answer_row(answer) -> None:
    """The answer first (engine.present.answer): one row of figures, each with what it is against under it."""
    if answer is None:
        return
    with st.container(border=True, key="answer-row"):
        st.markdown(f"**Recommended: {md_escape(answer.recommended)}** · " + (
            f"instead of {md_escape(answer.baseline)}" if answer.recommended != answer.baseline
            else "the baseline itself: nothing measured here is cheaper"))
        cols = st.columns(len(answer.cells))
        for col, c in zip(cols, answer.cells):
            col.metric(c.label, c.value, c.note or None, delta_color="off", delta_arrow="off", help=c.help or None)


def runs_answer_row(records) -> None:
    """The answer row for stored runs, priced at the sidebar's $/hour."""
    from engine.present.answer import runs_answer

    runs = [r for r in records if r.kind not in ("peer", "load", "accuracy")]
    if runs:
        answer_row(runs_answer(present.comparison_rows(runs, usd_per_hour())))


def page_header(title: str, blurb: str, price_key: str | None = None) -> None:
    """The page's title and blurb; with `price_key`, this machine's $/hour in the sidebar (one price for every
    page: price_input)."""
    hand_over_to_app()
    if price_key is not None:
        with st.sidebar:
            price_input(price_key)
    st.title(title)
    st.caption(blurb)
