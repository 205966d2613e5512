"""Home: what the lab answers, the backend it drives and that machine, the models, and the one-click default
comparison."""
import pandas as pd
import streamlit as st

from pages import _backend, _ui
from engine import present
from engine.common.setup import EngineSetup
from engine.measure import DEFAULT_WORKLOAD

JOB = "home-job"

_ui.page_header("Serving Cost Lab",
                "Which precision and which draft should I serve with, and what does it cost me? Measured on real "
                "models on this machine, then shared as a report.", price_key="home")
answer_box = st.container()  # the answer first: the results' summary row, drawn here once they are known

st.markdown(
    "- **Precision** – load a model at fp32, bf16, int8 or int4; see where the memory goes and what quality it costs.\n"
    "- **Speculative playground** – watch a draft propose tokens and the target accept them, live.\n"
    "- **Compare** – sweep precision × draft × gamma × batch; table, charts and the cost-vs-quality frontier.\n"
    "- **Reports** – save, compare, export as one offline HTML file or as JSON.\n"
    "- **Cost & capacity** – turn tokens/s into $ per 1M tokens, and plan GPUs for a workload.")


def _use_backend():
    """The Backend field: this session drives the URL typed there (blank: SCL_BACKEND_URL's)."""
    st.session_state[_backend.URL_KEY] = st.session_state["home-backend"].strip()


st.subheader("Backend")
b1, b2 = st.columns([2, 3])
with b1:
    try:
        here = _backend.backend().url
    except Exception as e:  # a malformed SCL_BACKEND_URL: said, and the field lets the user type another
        here = ""
        _backend.show_problem(e)
    st.text_input("Backend", value=here, key="home-backend", on_change=_use_backend,
                  help="The backend this dashboard drives: every measurement runs there, never in the dashboard. "
                       "Default: SCL_BACKEND_URL (http://127.0.0.1:8502, which `make run` starts). A GPU box: "
                       "http://box:8502 with SCL_BACKEND_TOKEN_FILE set (docs/DASHBOARD.md). Applies to this tab.")
info = _backend.info_or_banner()
with b2:
    if info:
        st.caption(f"Driving the backend at {_ui.md_code(here)} (pid {info.get('pid')}, lab "
                   f"{_ui.md_escape(info.get('lab_version'))}, API {info.get('api_version')}). It owns the models and "
                   "the kernels and runs one measurement at a time; this dashboard only draws."
                   + (f" Runs go to the Ray cluster at {_ui.md_escape(info['ray'])}." if info.get("ray") else ""))
        loaded = info.get("loaded") or []
        if loaded:
            st.caption("Loaded there now: " + _ui.md_escape(", ".join(f"{m['name']}@{m['precision']}"
                                                                        for m in loaded)))

left, right = st.columns(2)
with left:
    st.subheader("The backend's machine")
    if info:
        facts = info.get("machine") or {}
        rows = [{"what": "backend", "value": f"{here} ({facts.get('hostname') or 'unknown host'})"},
                {"what": "measures on", "value": str(facts.get("device") or "unknown")}]
        rows += present.machine_rows(facts, facts.get("bandwidth_GBs"), facts.get("gpus") or [], facts.get("kernels"))
        st.table(pd.DataFrame(rows).set_index("what"))
        if facts.get("bandwidth_error"):
            st.caption("Bandwidth not measured: " + _ui.md_escape(facts["bandwidth_error"]))
with right:
    st.subheader("Models")
    if info:
        ms = pd.DataFrame([m for m in info.get("models") or [] if not m.get("registered")]).drop(
            columns=["registered"], errors="ignore")
        if not ms.empty and "gguf_bytes" in ms:
            ms["GGUF_MB"] = (ms.pop("gguf_bytes") / 1e6).round(0)
        st.dataframe(ms, hide_index=True, key="models")
        st.caption("Models ship as GGUF chunks in pinned packages and are converted once (`make models`), on the "
                   "backend's machine.")

st.divider()
st.subheader("Default comparison")
st.caption("fp32 vs int8 vs int4 vs int4 with speculative decoding, on one model pair, over a small workload of "
           "real prompts, each repeated after a warm-up: every number is a median with its 95% interval, and a noise "
           "guard flags runs the machine disturbed. Each run is stored as it finishes.")

PAIRS = {
    "default": ("default", "default-draft", False,
                "Default pair: Qwen2.5-Coder-1.5B target, 0.5B draft (slower, the real answer)"),
    "small": ("default-draft", "default-draft", True,
              "Small pair: 0.5B target, its int8 drafted by its own cheaper int4 weights (faster)"),
}
PAIRS.update(_backend.registered_pairs())

c1, c2, c3 = st.columns([3, 1, 1])
with c1:
    pair = st.radio("Model pair", list(PAIRS), format_func=lambda k: PAIRS[k][3], key="home-pair")
    workload = _ui.workload_input("home-workload", DEFAULT_WORKLOAD)
with c2:
    n_new = st.number_input("New tokens per run", min_value=4, max_value=512, value=32, step=4, key="home-tokens")
    reps = st.number_input("Repetitions", min_value=1, max_value=10, value=3, key="home-reps",
                           help="Every prompt is measured this many times after a warm-up; 2 or more give the "
                                "noise verdict and a ± (a range of the repetitions below 5, a 95% interval from 5).")
with c3:
    quality = st.checkbox("Measure quality vs fp32", value=True, key="home-quality",
                          help="Perplexity, KL and top-1 agreement against fp32 on the lab's eval text "
                               "(256 tokens; the fp32 reference is computed once and cached).")


def _configs() -> list[dict]:
    """The comparison's runs as the backend takes them (RunConfig.to_dict()), quality as ticked."""
    from engine.measure import default_comparison  # the one definition of the default comparison

    model, draft, self_draft, _ = PAIRS[pair]
    return [{**c.to_dict(), "quality": bool(quality)}
            for c in default_comparison(model, draft, int(n_new), self_draft=self_draft,
                                        workload=workload.strip() or None, reps=int(reps))]


try:
    st.caption("Runs: " + _ui.md_escape(" · ".join(EngineSetup.from_dict(c["setup"]).label for c in _configs()))
               + ". The speculative run is timed against the same target without its draft.")
except Exception as e:
    _ui.show_error(e)

running = _backend.job_running(JOB)
if st.button("Run default comparison", type="primary", disabled=running or info is None, key="home-run"):
    try:
        _backend.submit(JOB, "default comparison", _backend.runs_work(_configs()))
        st.session_state.pop("home-runs", None)
        st.rerun()  # redraw with the button disabled and the progress bar
    except Exception as e:
        _backend.show_problem(e)

job = _backend.job_section(JOB, "default comparison")
if job is not None and job.run_ids:  # runs that landed so far: the page reruns when one lands
    st.session_state["home-runs"] = list(job.run_ids)

ids = st.session_state.get("home-runs")
if ids:
    st.subheader("Results")
    recs = _ui.load_records(ids)
    with answer_box:
        _ui.runs_answer_row(recs)
    _ui.comparison_view(recs, key="home")
    st.caption("These runs are now the current comparison: save them on the Reports page, or add to them on "
               "Compare." if job is None or job.finished else "The runs that finished so far; the rest follow.")
elif job is None:
    st.info("Pick a pair and press **Run default comparison**. On this CPU the small pair takes a few minutes with "
            "the default workload.")
