"""Serving Cost Lab dashboard: `streamlit run app.py`.

This file only sets up navigation; each page lives in pages/ and draws what engine/ computes.
"""
from pathlib import Path

import streamlit as st

from pages import _ui  # `streamlit run app.py` puts this folder on sys.path (engine is installed in the venv)

ROOT = Path(__file__).resolve().parent

st.set_page_config(page_title="Serving Cost Lab", page_icon=":material/science:", layout="wide")

PAGES = [
    st.Page(ROOT / "pages" / "home.py", title="Home", icon=":material/home:", url_path="home", default=True),
    st.Page(ROOT / "pages" / "precision.py", title="Precision", icon=":material/memory:", url_path="precision"),
    st.Page(ROOT / "pages" / "playground.py", title="Speculative playground", icon=":material/bolt:",
            url_path="playground"),
    st.Page(ROOT / "pages" / "compare.py", title="Compare (sweep)", icon=":material/table_chart:", url_path="compare"),
    st.Page(ROOT / "pages" / "reports.py", title="Reports", icon=":material/description:", url_path="reports"),
    st.Page(ROOT / "pages" / "cost.py", title="Cost & capacity", icon=":material/payments:", url_path="cost"),
    st.Page(ROOT / "pages" / "load.py", title="Load test", icon=":material/speed:", url_path="load"),
]

nav = st.navigation(PAGES)
sidebar_note = st.sidebar.empty()
_ui.UNDER_APP.active = True
try:
    nav.run()
finally:
    _ui.UNDER_APP.active = False
# After the page ran, so a comparison it just finished is counted.
n = len(st.session_state.get("comparison", []))
sidebar_note.caption(f"Current comparison: {n} run{'s' if n != 1 else ''}" if n else "No current comparison yet")
