"""Reports: save the current comparison, open/delete/compare saved reports, export HTML/JSON, import JSON."""
import pandas as pd
import streamlit as st

from pages import _ui
from engine.present import reports
from engine import present

_ui.page_header("Reports", "A report is a named set of runs with your notes. Share it as one HTML file that opens "
                "offline, or as JSON another lab can import.", price_key="reports")
if _ui.current_ids():  # the answer first: the current comparison's
    _ui.runs_answer_row(_ui.load_records(_ui.current_ids()))
store = _ui.get_store()

# ---------------------------------------------------------------- save
st.subheader("Save the current comparison")
ids = _ui.current_ids()
if not ids:
    st.info("There is no current comparison yet: run the default comparison on Home, a sweep on Compare, or pick "
            "stored runs there.")
else:
    st.caption(f"{len(ids)} runs from the {_ui.md_escape(st.session_state.get('comparison_source', 'dashboard'))}.")
    with st.form("rep-save", clear_on_submit=False):
        name = st.text_input("Name", max_chars=reports.MAX_NAME, key="rep-name")
        notes = st.text_area("Notes", key="rep-notes", max_chars=reports.MAX_NOTES,
                             help="What you measured and why; shown at the top of the exported report.")
        usd = _ui.usd_per_hour()
        sv = st.session_state.get("plan-savings")
        with_plan = st.checkbox(f"With the savings answer from Cost & capacity ({_ui.md_escape(sv['headline'])})"
                                if sv else "With the savings answer from Cost & capacity (plan a workload there first)",
                                value=bool(sv), disabled=not sv, key="rep-with-plan")
        save = st.form_submit_button("Save report", type="primary")
    if save:
        try:
            recs = _ui.load_records(ids)
            plan = {"workload": sv.get("workload") or {}, "savings": sv} if sv and with_plan else None
            rid = reports.save(store, name, notes, recs, usd, plan)
            st.session_state["rep-pending"] = rid
            st.success(f"Saved report '{_ui.md_escape(name.strip())}' with {len(recs)} runs.")
        except Exception as e:
            _ui.show_error(e)

# ---------------------------------------------------------------- list / open / delete
st.subheader("Saved reports")
try:
    saved = store.list_reports()
except Exception as e:
    saved = []
    _ui.show_error(e)

deleted = st.session_state.pop("rep-deleted", None)
if deleted is not None:
    st.session_state.pop("rep-confirm-delete", None)
    st.success(f"Deleted report '{_ui.md_escape(deleted)}'.")
if st.session_state.pop("rep-import-ok", False):
    st.success("Imported the report; it is open below.")
if not saved:
    st.info("No saved reports yet.")
else:
    st.dataframe(pd.DataFrame(saved)[["name", "created_at", "notes", "report_id"]], hide_index=True,
                 key="rep-list")
    by_id = {r["report_id"]: r for r in saved}
    label = {rid: f"{r['name']} · {r['created_at'].replace('T', ' ')[:19]} · {rid}" for rid, r in by_id.items()}
    ids_sorted = list(by_id)
    pending = st.session_state.pop("rep-pending", None)
    if pending in by_id:
        st.session_state["rep-select"] = pending
    elif st.session_state.get("rep-select") not in by_id:
        st.session_state.pop("rep-select", None)
    sel = st.selectbox("Open a report", ids_sorted, format_func=label.get, key="rep-select")
    try:
        rep = reports.load(store, sel)
    except Exception as e:
        rep = None
        _ui.show_error(e)
    if rep is not None:
        st.markdown(f"### {_ui.md_escape(rep.name)}")
        if rep.notes:
            st.text(rep.notes)
        if rep.plan:
            from engine.present import planning

            sv = rep.plan["savings"]
            st.markdown(f"**Your bill on {_ui.md_escape(sv['gpu'])}:** {_ui.md_escape(sv['headline'])}")
            st.plotly_chart(planning.savings_figure(sv), key="rep-savings-chart", config={"displaylogo": False})
        b1, b2, b3, b4 = st.columns(4)
        try:
            b1.download_button("Export HTML", reports.export_html(rep), file_name=reports.html_filename(rep),
                               mime="text/html", key="rep-export-html", on_click="ignore",
                               help="One self-contained file: plotly inline, no network needed to open it.")
            b2.download_button("Export JSON", reports.export_json(rep), file_name=reports.html_filename(rep, "json"),
                               mime="application/json", key="rep-export-json", on_click="ignore")
        except Exception as e:
            _ui.show_error(e)
        if b3.button("Make it the current comparison", key="rep-use"):
            missing = []
            for r in rep.records:  # runs imported from another lab are added to this store
                try:
                    store.get_run(r.run_id)
                except Exception:
                    try:
                        store.save_run(r)
                    except Exception:
                        missing.append(r.run_id)
            _ui.set_current([r.run_id for r in rep.records if r.run_id not in missing], f"report {rep.name}")
            st.toast("The report's runs are now the current comparison")
        confirm = b4.checkbox("Confirm delete", key="rep-confirm-delete")
        if b4.button("Delete report", disabled=not confirm, key="rep-delete"):
            store.delete_report(sel)
            st.session_state["rep-deleted"] = rep.name
            st.rerun()
        st.caption(f"{len(rep.records)} runs, priced at ${rep.usd_per_hour:.4g}/hour when saved.")
        _ui.comparison_view(rep.records, key="rep-view", usd=rep.usd_per_hour)

    # ------------------------------------------------------------ compare two
    st.subheader("Compare two reports")
    if len(saved) < 2:
        st.caption("Save a second report to compare them.")
    else:
        c1, c2 = st.columns(2)
        base_id = c1.selectbox("Baseline", ids_sorted, format_func=label.get, index=min(1, len(ids_sorted) - 1),
                               key="rep-base")
        other_id = c2.selectbox("Compared with", ids_sorted, format_func=label.get, index=0, key="rep-other")
        try:
            base, other = reports.load(store, base_id), reports.load(store, other_id)
            price = _ui.usd_per_hour()
            diff = present.report_diff(present.comparison_rows(base.records, price),
                                       present.comparison_rows(other.records, price))
            st.dataframe(pd.DataFrame(present.diff_table(diff)), hide_index=True, key="rep-diff",
                         column_config={f"{m} %": st.column_config.NumberColumn(f"{m} %", format="%+.1f%%")
                                        for m, _ in present.DIFF_METRICS})
            st.caption("Runs matched by configuration label; % = (compared − baseline) / baseline. Both priced at "
                       f"${price:.4g}/hour. For tokens/s and acceptance higher is better; for the rest lower is.")
        except Exception as e:
            _ui.show_error(e)

# ---------------------------------------------------------------- import
st.subheader("Import a report (JSON)")
up = st.file_uploader("Report exported by this lab", type=["json"], key="rep-import")
if up is not None:
    token = (up.name, up.size)
    if st.session_state.get("rep-imported") != token:
        try:
            rid = reports.import_report(store, up.getvalue())
            st.session_state["rep-imported"] = token
            st.session_state["rep-pending"] = rid
            st.session_state["rep-import-ok"] = True
            st.rerun()
        except Exception as e:
            _ui.show_error(e)
