"""Precision: load a model at a precision, see where its memory goes, and measure quality vs fp32."""
import pandas as pd
import streamlit as st

from pages import _backend, _ui
from engine import present
from engine.common.setup import EngineSetup
from engine.common.vocab import DESCRIPTIONS, GROUP_SIZES, METHOD_DESCRIPTIONS, PRECISIONS, QUANT_METHODS
from engine.present.accuracy_view import NOTE as ACCURACY_NOTE, accuracy_rows
from engine.present.quality_view import heading, table_rows

JOB = "prec-job"

_ui.page_header("Precision", "Load a model at a precision: memory by layer type, KV cache for your context and "
                "batch, load time, and what the precision costs in quality against fp32.", price_key="precision")

c1, c2, c3 = st.columns([2, 2, 1])
with c1:
    model = st.selectbox("Model", _backend.target_options(), format_func=_backend.model_label, key="prec-model")
    your_model = _backend.your_model_input("prec-your-model") if model == _backend.YOUR_MODEL else ""
with c2:
    precision = st.selectbox("Precision", PRECISIONS, index=PRECISIONS.index("int4"),
                             format_func=lambda p: f"{p} – {DESCRIPTIONS[p]}", key="prec-precision")
with c3:
    group = st.selectbox("int4 group size", GROUP_SIZES, index=GROUP_SIZES.index(64), key="prec-group",
                         disabled=precision != "int4")
method = st.selectbox("int4 method", QUANT_METHODS, key="prec-method", disabled=precision != "int4",
                      format_func=lambda m: f"{m} – {METHOD_DESCRIPTIONS[m]}",
                      help="How the int4 grid is chosen. The first load of GPTQ or AWQ calibrates on ShareGPT chat "
                           "and code exchanges the lab never scores (the status line shows each layer); later loads "
                           "read the cache. To cancel a calibration, stop the page (⏹, top right): it then shows the "
                           "backend's progress with a Cancel button, which stops it before its next layer.")
with st.expander("Advanced"):
    q_emb = st.checkbox("Quantize the embedding table too", value=False, key="prec-qemb")
    q_head = st.checkbox("Quantize the output head", value=True, key="prec-qhead")


def _llama_cpp_reason(name: str) -> str | None:
    """Why the backend cannot score llama.cpp's Q4_K_M of `name` (None when it can), as its /v1/info says."""
    try:
        info = _backend.info()
    except Exception as e:
        return f"the backend cannot be asked ({getattr(e, 'problem', e)})"
    for m in info.get("models") or []:
        if m.get("name") == name:
            return m.get("llama_cpp")
    return info.get("llama_cpp")


if _backend.job_running(JOB):  # a load or score this page started and left (a GPTQ/AWQ calibration takes minutes)
    _backend.job_panel(JOB)
if st.button("Load", type="primary", key="prec-load", disabled=_backend.job_running(JOB)):
    try:
        setup = EngineSetup(model=_backend.chosen_model(model, your_model), precision=precision,
                            group_size=int(group), quantize_embeddings=q_emb, quantize_head=q_head,
                            method=method if precision == "int4" else "rtn")
        with st.status(f"Loading {setup.label} on the backend…", expanded=False) as status:
            job = _backend.run_here(JOB, f"load {setup.label}",
                                    _backend.work([{"kind": "load", "setup": setup.to_dict()}]),
                                    say=lambda s: status.update(label=s))
            facts = job.result  # the model as the backend's pool holds it (sizes, shape, dtype)
            status.update(label=f"Loaded {facts['label']}", state="complete")
        st.session_state["prec-loaded"] = {**facts, "setup": setup.to_dict()}
        hist = [h for h in st.session_state.get("prec-history", []) if h["label"] != facts["label"]]
        hist.append({"label": facts["label"], "weights": facts["weights"], "weights_MB": facts["weight_bytes"] / 1e6,
                     "load_s": facts["load_s"]})
        st.session_state["prec-history"] = hist
    except Exception as e:
        _backend.show_problem(e)



def _accuracy_section() -> None:
    """HumanEval pass@1 of the stored accuracy runs, paired against the first, with KLD mean and p99 beside."""
    st.markdown("#### Task accuracy beside KLD")
    try:
        recs = _ui.get_store().list_runs(1000)
        acc = [r for r in recs if r.kind == "accuracy"][::-1]  # oldest first: the first run measured is the reference
        if not acc:
            st.caption("No accuracy runs stored yet. Measure them with `python -m engine accuracy --model default "
                       "--precisions bf16,int8,int4-g32,int4-g64` (HumanEval pass@1, llama-server's Q4_K_M beside).")
            return
        labels = [f"{r.label} ({r.metrics['accuracy']['subset']}, {r.created_at})" for r in acc]
        ref = st.selectbox("Reference", range(len(acc)), format_func=lambda i: labels[i], key="prec-acc-ref")
        st.dataframe(pd.DataFrame(accuracy_rows(acc, recs, int(ref))), hide_index=True, key="prec-acc-table")
        st.caption(ACCURACY_NOTE)
    except Exception as e:
        _ui.show_error(e)


def _methods_section(name: str) -> None:
    """Each stored quality run of the model at its weight bytes, by method, with the frontier (from the records)."""
    st.markdown("#### Quality against bytes, by method")
    try:
        points, left_out = present.bytes_points(_ui.get_store().list_runs(1000), name)
        if not points:
            st.caption(f"No quality runs of {_ui.md_escape(name)} stored yet: press **Measure quality** below for "
                       "each precision and method, or run `python -m engine quality --model "
                       f"{_ui.md_escape(name)} --precisions int4,int4-gptq-g32,int8` and `bench/quality_matched.py`.")
            return
        st.plotly_chart(present.bytes_quality_figure(points), key="prec-methods-chart", config={"displaylogo": False})
        st.dataframe(pd.DataFrame(points), hide_index=True, key="prec-methods-table",
                     column_config={"weight_MB": st.column_config.NumberColumn("weights MB", format="%.1f"),
                                    "top1_agreement": st.column_config.NumberColumn("same top-1", format="percent")})
        tokens = points[0].get("tokens")
        st.caption(f"The newest quality run of each configuration, all on one eval text ({tokens or '?'} tokens). "
                   "On the frontier: no other configuration has fewer weight bytes and a lower median KLD. "
                   "The reference is the catalog's shipped Q4_K_M dequantized: llama.cpp's requantization can "
                   "recover its grid (docs/BENCHMARKS.md).")
        if left_out:
            st.caption("Left out: " + "; ".join(_ui.md_escape(x) for x in left_out))
    except Exception as e:
        _ui.show_error(e)


f = st.session_state.get("prec-loaded")
if not f:
    st.info("Choose a model and a precision, then press **Load**. Loading converts the weights for real; "
            "nothing is simulated.")
    if model != _backend.YOUR_MODEL:
        _methods_section(model)
    _accuracy_section()
    st.stop()

st.subheader(f"{f['label']} on {f['device']}")
m1, m2, m3, m4 = st.columns(4)
m1.metric("Weights", f"{f['weight_bytes'] / 1e6:,.1f} MB")
m2.metric("Load time", f"{f['load_s']:.2f} s", help="Reading and converting the weights, when the backend first "
          "loaded this model (later loads reuse its pool).")
m3.metric("Layers × KV heads × head dim", f"{f['num_layers']} × {f['num_kv_heads']} × {f['head_dim']}")
m4.metric("Compute dtype", f["dtype"].replace("torch.", ""))
qf = f.get("quantized") or {}
if qf.get("fp32_bytes"):
    st.caption(f"Quantized layers hold {qf['quantized_bytes'] / 1e6:,.1f} MB, {qf['ratio']:.3f} of the same layers in "
               f"fp32 ({qf['fp32_bytes'] / 1e6:,.1f} MB).")

st.markdown("#### Memory breakdown")
k1, k2 = st.columns(2)
with k1:
    ctx_opts = [c for c in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if c <= max(f["max_position"], 256)]
    context = st.select_slider("Context (tokens)", ctx_opts, value=2048 if 2048 in ctx_opts else ctx_opts[-1],
                               key="prec-context")
with k2:
    batch = st.select_slider("Batch", [1, 2, 4, 8, 16, 32, 64], value=1, key="prec-batch")
try:
    kv = present.kv_cache_bytes(f["num_layers"], f["num_kv_heads"], f["head_dim"], int(context), int(batch),
                                f["dtype_bytes"])
    act = present.activation_bytes(f["hidden"], f["intermediate"], f["vocab"], f["num_heads"], int(context),
                                   int(batch), f["dtype_bytes"])
    breakdown = present.memory_breakdown(f["weights"], kv, act)
    st.plotly_chart(present.memory_figure(breakdown, f"{f['label']}, context {context}, batch {batch}"),
                    key="prec-mem-chart", config={"displaylogo": False})
    st.dataframe(pd.DataFrame(breakdown)[["part", "MB", "share"]], hide_index=True, key="prec-mem-table",
                 column_config={"share": st.column_config.ProgressColumn("share", min_value=0.0, max_value=1.0,
                                                                         format="percent")})
    st.caption("KV cache = 2 × layers × KV heads × head dim × context × batch × bytes per value "
               f"({f['dtype_bytes']} here). Activations: an upper-bound estimate of one prefill's workspace (hidden "
               "states and projections per token, one layer's attention matrix, the last logits).")
    grid = present.kv_grid(f["num_layers"], f["num_kv_heads"], f["head_dim"], ctx_opts, [1, 4, 16, 64],
                           f["dtype_bytes"])
    with st.expander("KV cache for every context × batch"):
        st.plotly_chart(present.kv_figure(grid), key="prec-kv-chart", config={"displaylogo": False})
except Exception as e:
    _ui.show_error(e)

st.markdown("#### Quality vs fp32")
q1, q2 = st.columns([1, 3])
with q1:
    q_tokens = st.selectbox("Eval tokens", [256, 1024, 2048, 8192], index=1, key="prec-qtokens",
                            help="Scored tokens, half ShareGPT answers (chat), half HumanEval solutions (code). "
                                 "8,192 is what docs/BENCHMARKS.md reports.")
    run_q = st.button("Measure quality", key="prec-quality", disabled=_backend.job_running(JOB),
                      help="llama.cpp's --kl-divergence statistics against fp32: KL mean ± error and percentiles, "
                           "same top-1, Δp, perplexity ratio, overall and per category. The fp32 reference is "
                           "computed once per model and text and cached, on the backend.")
    llama_reason = _llama_cpp_reason(f["name"])
    run_llama = st.button("Measure llama.cpp Q4_K_M", key="prec-quality-llama",
                          disabled=llama_reason is not None or _backend.job_running(JOB),
                          help="llama.cpp's own Q4_K_M GGUF scored on the same tokens against the same reference, in "
                               "a fresh process on the backend. On a CPU it takes minutes per thousand tokens "
                               "of the 1.5B (longer while the machine is busy).")
    if llama_reason:
        st.caption(f"llama.cpp: {_ui.md_escape(llama_reason)}")
if run_q:
    try:
        setup = EngineSetup.from_dict(f["setup"])
        with st.spinner("Measuring quality against fp32 on the backend…"):
            job = _backend.run_here(JOB, f"quality of {setup.label}",
                                    _backend.work([{"kind": "quality", "setup": setup.to_dict(),
                                                   "tokens": int(q_tokens)}]))
            qres = _ui.get_store().get_run(job.run_ids[0]).metrics["quality"]
        st.session_state["prec-qres"] = {"label": f["label"], **qres}
        for h in st.session_state.get("prec-history", []):
            if h["label"] == f["label"]:
                h.update(kl_mean=qres["kld_mean"], top1=qres["top1_agreement"], ppl=qres["perplexity"])
    except Exception as e:
        _backend.show_problem(e)
if run_llama:
    try:
        with st.spinner(f"Scoring llama.cpp Q4_K_M on {int(q_tokens):,} tokens on the backend (this takes a while)…"):
            job = _backend.run_here(JOB, f"llama.cpp Q4_K_M quality of {f['name']}",
                                    _backend.work([{"kind": "llama-quality", "model": f["name"],
                                                   "tokens": int(q_tokens)}]))
        st.session_state["prec-qllama"] = job.result
    except Exception as e:
        _backend.show_problem(e)
q = st.session_state.get("prec-qres")
lq = st.session_state.get("prec-qllama")
with q2:
    if q and q["label"] == f["label"]:
        a, b, c, d = st.columns(4)
        a.metric("Perplexity", f"{q['perplexity']:.3f}", f"{q['perplexity'] - q['ref_perplexity']:+.3f} vs fp32",
                 delta_color="inverse")
        b.metric("KL mean", f"{q['kld_mean']:.5f}", help=f"± {q.get('kld_mean_err', 0):.5f} (standard error)")
        c.metric("KL p99", f"{q['kld_p99']:.4f}")
        d.metric("Top-1 agreement", f"{q['top1_agreement']:.2%}")
    else:
        st.caption("Press **Measure quality** to compare this precision with fp32.")
    results = []
    if q and q["label"] == f["label"]:
        results.append((q["label"], q))
    if lq and lq.get("model") == f["name"]:  # a llama.cpp that could not score failed its job (the banner says why)
        results.append((f"{f['name']} llama.cpp Q4_K_M", lq))
    if results:
        st.dataframe(pd.DataFrame(table_rows(results)), hide_index=True, key="prec-quality-table")
        st.caption(f"{_ui.md_escape(heading(results[0][0], results[0][1]))}: ShareGPT answers and HumanEval "
                   "solutions, each document scored from its start. KL counts the reference's tokens with p ≥ 1e-6 "
                   "plus one bucket for the rest (slightly under the full sum: docs/BENCHMARKS.md says by how much). "
                   "The catalog's fp32 is the shipped "
                   "Q4_K_M GGUF dequantized, so llama.cpp's row measures its arithmetic on the same weights.")

hist = st.session_state.get("prec-history", [])
if len(hist) > 1:
    st.markdown("#### Precisions loaded in this session")
    st.dataframe(pd.DataFrame([{k: v for k, v in h.items() if k != "weights"} for h in hist]), hide_index=True,
                 key="prec-history-table")

_methods_section(f["name"])
_accuracy_section()
