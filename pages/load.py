"""Load test: servers under concurrent load, side by side; throughput against latency, goodput, $/1M at the SLO,
the load at which speculation, a smaller precision or a quantized KV cache stops paying."""
import pandas as pd
import streamlit as st

from pages import _backend, _ui
from engine.common.vocab import KV_DTYPES
from engine.peers import load_sweep, servers
from engine.present import load_cost, load_view

JOB = "load-job"
PRECISIONS = ["int4", "int8", "bf16", "fp32"]

_ui.page_header("Load test", "The backend starts each server on its machine's 127.0.0.1 (or reaches a URL you type), "
                "sends the same real prompts at rising concurrency or request rate, times them on the client, and "
                "stops the server by its PID. Every load point is stored as a run.", price_key="load")
answer_box = st.container()  # the answer first: the load test's summary row, drawn here once it is known


def _availability() -> dict:
    """Why each kind of server cannot run on the backend's machine (None: it can), with the fix, as its /v1/info
    reports: the backend starts the servers, so a dashboard elsewhere offers what that machine has."""
    info = _backend.info_or_banner() or {}
    reported = info.get("servers")
    if reported is None:
        why = ("the backend does not say which servers its machine can start (an older backend?): restart it from "
               "this checkout (python -m engine backend)" if info else "the backend is not answering")
        return {s: why for s in (servers.OURS, "llama-server", "vllm")}
    return {s: reported.get(s, "the backend does not report this server") for s in (servers.OURS, "llama-server",
                                                                                     "vllm")}


avail = _availability()

# ---------------------------------------------------------------- endpoints and configurations
st.subheader("Endpoints and configurations")
left, right = st.columns(2)
with left:
    model = st.selectbox("Model every server runs", ["default-draft", "default"], format_func=_backend.model_label,
                         key="load-model")
    if avail[servers.OURS]:
        st.warning(f"Our engine cannot be served here: {_ui.md_escape(avail[servers.OURS])}")
        precisions, drafts = [], []
    else:
        precisions = st.multiselect("Our engine: precisions", PRECISIONS, default=["int4"], key="load-precisions")
        drafts = st.multiselect("Our engine: drafts", list(load_sweep.DRAFT_LABELS), default=["none"],
                                format_func=load_sweep.DRAFT_LABELS.get, key="load-drafts",
                                help="Each precision is served with each draft: spec on and off side by side shows "
                                     "the concurrency at which speculation stops paying.")
    slots = int(st.number_input("Slots per server (max sequences; llama-server -np)", min_value=1, max_value=64,
                                value=8, key="load-slots"))
    if not avail[servers.OURS]:
        kv_dtypes = st.multiselect("Our engine: KV cache precisions", list(KV_DTYPES), default=["auto"],
                                   key="load-kv-dtypes", help="auto stores K/V at the compute dtype; int8 keeps "
                                   "per-vector scales (CPU and GPU); fp8 needs a GPU of compute capability 8.9+. "
                                   "Each is served beside the others at the same budget: the Results price each.")
        kv_gib = float(st.number_input("Our engine: KV budget (GiB; 0 = the slots at the full context)", min_value=0.0,
                                       max_value=4096.0, value=0.0, step=0.25, key="load-kv-gib"))
    else:
        kv_dtypes, kv_gib = ["auto"], 0.0
with right:
    peers = []
    if avail["llama-server"]:
        st.caption(f"llama-server: {_ui.md_escape(avail['llama-server'])}")
    elif st.checkbox("llama-server (llama.cpp, the catalog's Q4_K_M GGUF)", value=False, key="load-llama"):
        peers.append("llama-server")
    if avail["vllm"]:
        st.caption(f"vLLM's CPU build is not offered: {_ui.md_escape(avail['vllm'])}")
    elif st.checkbox("vLLM's CPU build (bf16; about 2-3 minutes to start)", value=False, key="load-vllm"):
        peers.append("vllm")
    urls_text = st.text_area("Any OpenAI-compatible URL, one per line (nothing is started or stopped)", value="",
                             key="load-urls", height=80, placeholder="http://127.0.0.1:8000")

# ---------------------------------------------------------------- workload, SLOs, loads
st.subheader("Workload, SLOs and loads")
a, b, c = st.columns(3)
with a:
    workload = _ui.workload_input("load-workload", "chat:8")
    requests = int(st.number_input("Requests per load point", min_value=1, max_value=1000, value=8,
                                   key="load-requests"))
    max_out = int(st.number_input("Longest answer (tokens)", min_value=1, max_value=2048, value=64, key="load-max-out",
                                  help="Each request asks for its paired answer's length, capped here (ignore_eos "
                                       "forces it where the server accepts it)."))
with b:
    ttft = st.number_input("TTFT SLO (s)", min_value=0.01, max_value=600.0, value=2.0, step=0.5, key="load-ttft")
    itl = st.number_input("Inter-token latency SLO (s)", min_value=0.001, max_value=60.0, value=0.2, step=0.05,
                          format="%.3f", key="load-itl")
    attainment = st.number_input("Share of requests that must meet both", min_value=0.01, max_value=1.0, value=0.9,
                                 step=0.05, key="load-attainment")
with c:
    mode = st.radio("Loads", ["concurrency list", "rate sweep"], horizontal=True, key="load-mode",
                    help="Concurrency: N requests in flight at a time. Rate sweep (GuideLLM's): synchronous, then "
                         "everything at once, then constant rates between the two.")
    if mode == "concurrency list":
        loads = st.text_input("Concurrency", value="1,4,8", key="load-concurrency")
    else:
        loads = f"sweep:{int(st.number_input('Constant rates between', 1, 20, 4, key='load-steps'))}"
    max_seconds = float(st.number_input("Seconds per load point at most", min_value=10, max_value=3600, value=600,
                                        key="load-max-seconds"))


def _plan_and_specs():
    plan = load_sweep.SweepPlan(loads=loads, workload=workload, requests=requests, max_output_len=max_out,
                                slo=f"ttft={ttft:g},itl={itl:g}", slo_attainment=float(attainment),
                                max_seconds=max_seconds, request_timeout_s=min(max_seconds, 300.0)).validate()
    specs, notes = load_sweep.engine_specs(model, precisions, drafts, slots, kv_dtypes=kv_dtypes, kv_cache_gib=kv_gib)
    specs += [servers.ServerSpec.of(p, model=model, slots=slots).validate() for p in peers]
    specs += load_sweep.url_specs(urls_text)
    return plan, specs, notes


def _work(specs, plan) -> dict:
    """The sweep as the backend takes it: it starts, loads and stops every server on its own machine."""
    return _backend.work([{"kind": "load-sweep", "spec": x.to_dict(), "plan": plan.to_dict()} for x in specs])


running = _backend.job_running(JOB)
if st.button("Run load test", type="primary", disabled=running, key="load-run"):
    try:
        plan, specs, notes = _plan_and_specs()
        for n in notes:
            st.warning(_ui.md_escape(n))
        if not specs:
            st.error("Nothing to measure: pick a precision of our engine, a peer, or type a URL.")
        else:
            _backend.submit(JOB, "load test", _work(specs, plan))
            st.session_state.pop("load-runs", None)
            st.rerun()
    except Exception as e:
        _backend.show_problem(e)

job = _backend.job_section(JOB, "load test")
if job is not None and job.run_ids:  # the points that landed so far: the page reruns when one lands
    st.session_state["load-runs"] = list(job.run_ids)

# ---------------------------------------------------------------- results
ids = st.session_state.get("load-runs")
if not ids:
    if job is None:
        st.info("Pick the servers, the workload and the loads, then press **Run load test**. On this CPU a point of "
                "8 short requests takes well under a minute; vLLM takes 2-3 minutes to start.")
    st.stop()

st.subheader("Results")
recs = [r for r in _ui.load_records(ids) if r.kind == "load"]
usd = _ui.usd_per_hour()  # the sidebar's (page_header)
try:
    costs = load_cost.costs_at_slo(recs, usd)
    pairs = load_cost.crossover_pairs(recs)
    with answer_box:
        from engine.present.answer import load_answer

        _ui.answer_row(load_answer(recs, costs, pairs))
    spec_rows = load_view.spec_category_rows(recs)
    kv_rows = load_cost.kv_cost_rows(recs, usd)
    names = ["Table", "Charts (3)", "Cost at the SLO", "Crossover"] + (["Acceptance"] if spec_rows else [])
    tabs = dict(zip(names, st.tabs(names)))  # the evidence in tabs, under the answer row
    with tabs["Table"]:
        table = load_view.load_rows(recs)
        cols = load_view.load_columns(table)
        _ui.labelled_table([{c: r.get(c) for c in cols} for r in table], "load-table", load_view.column_labels(cols))
    with tabs["Charts (3)"]:
        st.plotly_chart(load_view.throughput_figure(recs), key="load-chart-latency", config={"displaylogo": False})
        st.plotly_chart(load_view.tradeoff_figure(recs), key="load-chart-tradeoff", config={"displaylogo": False})
        st.plotly_chart(load_view.goodput_figure(recs), key="load-chart-goodput", config={"displaylogo": False})

    with tabs["Cost at the SLO"]:
        st.markdown("**$ per 1M output tokens at the SLO**")
        st.dataframe(pd.DataFrame(load_cost.cost_rows(costs)), hide_index=True, key="load-costs", column_config={
            "usd_per_1m_out_at_slo": st.column_config.NumberColumn("$/1M out at the SLO", format="$%.4f"),
            "usd_per_1m_out_single_stream": st.column_config.NumberColumn("$/1M out, one stream", format="$%.4f"),
            "goodput_tok_s": st.column_config.NumberColumn("goodput tok/s", format="%.1f")})
        st.plotly_chart(load_view.slo_cost_figure(costs), key="load-chart-cost", config={"displaylogo": False})
        st.caption("Goodput = output tokens of the requests that met every SLO, per second of the load point. $/1M "
                   "at the SLO = $/hour ÷ (goodput at the highest load whose point met the SLO × 3600) × 10⁶; with "
                   "no such point the answer is 'infeasible at this SLO on this machine'. The one-stream figure "
                   "prices the concurrency-1 point's output tok/s.")
        if kv_rows:
            st.markdown("**KV cache quantized or not: $ per 1M output tokens at the SLO, at one KV budget**")
            st.dataframe(pd.DataFrame(kv_rows).rename(columns=load_cost.KV_COST_LABELS), hide_index=True,
                         key="load-kv-costs")
            st.caption("Each pair is our server with the same weights, draft, workload, SLO and KV budget, its KV "
                       "cache stored quantized (int8 with per-vector scales, fp8) or at the compute dtype. "
                       "Sequences: whole requests of the context the budget's blocks hold. More of them admitted at "
                       "once buys goodput only where decode is bound by memory, not compute; where prefill is "
                       "compute-bound, quantizing and dequantizing the cache costs per token instead (the ratio "
                       "column says which held here).")

    with tabs["Crossover"]:
        st.markdown("**Where speculation, a smaller precision or a quantized KV cache stops paying**")
        if pairs:
            st.plotly_chart(load_view.crossover_figure(pairs), key="load-chart-crossover",
                            config={"displaylogo": False})
            st.markdown("\n".join(f"- {_ui.md_escape(x.verdict)}" for x in pairs))
        else:
            st.caption("No pair to compare: serve a precision with and without a draft (or int4 beside int8/bf16) "
                       "at the same loads.")

    if spec_rows:
        with tabs["Acceptance"]:
            st.markdown("**Acceptance per workload category under load**")
            st.dataframe(pd.DataFrame(spec_rows).rename(columns=load_view.SPEC_CATEGORY_LABELS), hide_index=True,
                         key="load-spec-categories", column_config={
                             "acceptance": st.column_config.NumberColumn("acceptance", format="%.3f"),
                             "acceptance length": st.column_config.NumberColumn("acceptance length", format="%.2f")})
            st.caption("From each answer's own speculative stats (vLLM's per-request summary, which the lab's "
                       "server sends while it drafts): acceptance = accepted ÷ draft tokens, acceptance length = 1 "
                       "+ accepted ÷ drafting rounds, pooled over the category's requests at that load. Under an "
                       "adaptive policy a request drafts only in the steps that pay.")
    st.caption("These runs are now the current comparison: save them as a report on the Reports page.")
except Exception as e:
    _ui.show_error(e)
