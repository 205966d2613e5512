"""Home: what the lab answers, this machine, the models, and the one-click default comparison."""
from dataclasses import replace


import pandas as pd
import streamlit as st

from pages import _ui
from engine import present
from engine.measure import DEFAULT_WORKLOAD

JOB = "home-job"

_ui.page_header("Serving Cost Lab",
                "Which precision and which draft should I serve with, and what does it cost me? Measured on real "
                "models on this machine, then shared as a report.")

st.markdown(
    "- **Precision** – load a model at fp32, bf16, int8 or int4; see where the memory goes and what quality it costs.\n"
    "- **Speculative playground** – watch a draft propose tokens and the target accept them, live.\n"
    "- **Compare** – sweep precision × draft × gamma × batch; table, charts and the cost-vs-quality frontier.\n"
    "- **Reports** – save, compare, export as one offline HTML file or as JSON.\n"
    "- **Cost & capacity** – turn tokens/s into $ per 1M tokens, and plan GPUs for a workload.")


@st.cache_data(show_spinner="Measuring memory bandwidth (once per machine)…", ttl=300)
def _hardware():
    from engine.measure import bandwidth_gbs, kernel_info, machine_facts, nvml_gpus

    facts = machine_facts("cpu")
    try:
        bw = bandwidth_gbs("cpu")
    except Exception:
        bw = None
    try:  # never compile just to draw this box; the first quantized run builds the kernels
        kinfo = kernel_info(build=False)
    except Exception as e:
        kinfo = {"cpu": f"unavailable ({type(e).__name__})"}
    return facts, bw, nvml_gpus(), kinfo


@st.cache_data(ttl=60, show_spinner=False)
def _models():
    from engine.measure import list_models

    return list_models()


left, right = st.columns(2)
with left:
    st.subheader("This machine")
    try:
        facts, bw, gpus, kinfo = _hardware()
        st.table(pd.DataFrame(present.machine_rows(facts, bw, gpus, kinfo)).set_index("what"))
    except Exception as e:
        _ui.show_error(e)
with right:
    st.subheader("Models")
    try:
        ms = pd.DataFrame(_models())
        if not ms.empty:
            ms["GGUF_MB"] = (ms.pop("gguf_bytes") / 1e6).round(0)
        st.dataframe(ms, hide_index=True, key="models")
        st.caption("Models ship as GGUF chunks in pinned packages and are converted once (`make models`).")
    except Exception as e:
        _ui.show_error(e)

st.divider()
st.subheader("Default comparison")
st.caption("fp32 vs int8 vs int4 vs int4 with speculative decoding, on one model pair, over a small workload of "
           "real prompts, each repeated after a warm-up: every number is a median with its 95% interval, and a noise "
           "guard flags runs the machine disturbed. Each run is stored as it finishes.")

PAIRS = {
    "default": ("default", "default-draft", False,
                "Default pair: Qwen2.5-Coder-1.5B target, 0.5B draft (slower, the real answer)"),
    "small": ("default-draft", "default-draft", True,
              "Small pair: 0.5B target with its own int4 weights as self-draft (faster)"),
}
PAIRS.update(_ui.registered_pairs())

c1, c2, c3 = st.columns([3, 1, 1])
with c1:
    pair = st.radio("Model pair", list(PAIRS), format_func=lambda k: PAIRS[k][3], key="home-pair")
    workload = _ui.workload_input("home-workload", DEFAULT_WORKLOAD)
with c2:
    n_new = st.number_input("New tokens per run", min_value=4, max_value=512, value=32, step=4, key="home-tokens")
    reps = st.number_input("Repetitions", min_value=1, max_value=10, value=3, key="home-reps",
                           help="Every prompt is measured this many times after a warm-up; 2 or more give an "
                                "interval and the noise verdict.")
with c3:
    quality = st.checkbox("Measure quality vs fp32", value=True, key="home-quality",
                          help="Perplexity, KL and top-1 agreement against fp32 on the lab's eval text "
                               "(256 tokens; the fp32 reference is computed once and cached).")

running = _ui.job_running(JOB)
if st.button("Run default comparison", type="primary", disabled=running, key="home-run"):
    try:
        from engine.measure import default_comparison

        model, draft, self_draft, _ = PAIRS[pair]
        cfgs = [replace(c, quality=bool(quality)).validate()
                for c in default_comparison(model, draft, int(n_new), self_draft=self_draft, workload=workload,
                                            reps=int(reps))]
        _ui.start_job(JOB, "default comparison", cfgs)
        st.session_state.pop("home-runs", None)
        st.rerun()  # redraw with the button disabled and the progress bar
    except Exception as e:
        _ui.show_error(e)

job = _ui.job_section(JOB, "default comparison")
if job is not None and job.finished and job.run_ids:
    st.session_state["home-runs"] = list(job.run_ids)

ids = st.session_state.get("home-runs")
if ids:
    st.subheader("Results")
    recs = _ui.load_records(ids)
    _ui.comparison_view(recs, key="home", price_where="home")
    st.caption("These runs are now the current comparison: save them on the Reports page, or add to them on "
               "Compare.")
elif job is None:
    st.info("Pick a pair and press **Run default comparison**. On this CPU the small pair takes a few minutes with "
            "the default workload.")
