"""Precision: load a model at a precision, see where its memory goes, and measure quality vs fp32."""
import pandas as pd
import streamlit as st

from pages import _ui
from engine import present
from engine.common.vocab import DESCRIPTIONS, GROUP_SIZES, PRECISIONS
from engine.measure import load_into_pool, quality_in_pool
from engine.measure.loaded import reference_in_pool
from engine.peers.quality_worker import llama_cpp_quality, llama_cpp_unavailable
from engine.present.quality_view import heading, table_rows, unavailable_line

_ui.page_header("Precision", "Load a model at a precision: memory by layer type, KV cache for your context and "
                "batch, load time, and what the precision costs in quality against fp32.")

c1, c2, c3 = st.columns([2, 2, 1])
with c1:
    model = st.selectbox("Model", _ui.model_options(), format_func=_ui.model_label, key="prec-model")
with c2:
    precision = st.selectbox("Precision", PRECISIONS, index=PRECISIONS.index("int4"),
                             format_func=lambda p: f"{p} – {DESCRIPTIONS[p]}", key="prec-precision")
with c3:
    group = st.selectbox("int4 group size", GROUP_SIZES, index=GROUP_SIZES.index(64), key="prec-group",
                         disabled=precision != "int4")
with st.expander("Advanced"):
    q_emb = st.checkbox("Quantize the embedding table too", value=False, key="prec-qemb")
    q_head = st.checkbox("Quantize the output head", value=True, key="prec-qhead")


if st.button("Load", type="primary", key="prec-load"):
    try:
        with _ui.pool_turn("loading"), st.status(f"Loading {model} at {precision}…", expanded=False) as status:
            facts = load_into_pool(_ui.get_pool(), model, precision, int(group), q_emb, q_head,
                                   progress=lambda s: status.update(label=s))
            status.update(label=f"Loaded {facts['label']}", state="complete")
        st.session_state["prec-loaded"] = facts
        hist = [h for h in st.session_state.get("prec-history", []) if h["label"] != facts["label"]]
        hist.append({"label": facts["label"], "weights": facts["weights"], "weights_MB": facts["weight_bytes"] / 1e6,
                     "load_s": facts["load_s"]})
        st.session_state["prec-history"] = hist
    except Exception as e:
        _ui.show_error(e)

f = st.session_state.get("prec-loaded")
if not f:
    st.info("Choose a model and a precision, then press **Load**. Loading converts the weights for real; "
            "nothing is simulated.")
    st.stop()

st.subheader(f"{f['label']} on {f['device']}")
m1, m2, m3, m4 = st.columns(4)
m1.metric("Weights", f"{f['weight_bytes'] / 1e6:,.1f} MB")
m2.metric("Load time", f"{f['load_s']:.2f} s", help="Reading and converting the weights, when this model was "
          "first loaded in this server (later loads reuse the pool).")
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
llama_reason = llama_cpp_unavailable(f["name"])
with q1:
    q_tokens = st.selectbox("Eval tokens", [256, 1024, 2048, 8192], index=1, key="prec-qtokens",
                            help="Scored tokens, half ShareGPT answers (chat), half HumanEval solutions (code). "
                                 "8,192 is what docs/BENCHMARKS.md reports.")
    run_q = st.button("Measure quality", key="prec-quality",
                      help="llama.cpp's --kl-divergence statistics against fp32: KL mean ± error and percentiles, "
                           "same top-1, Δp, perplexity ratio, overall and per category. The fp32 reference is "
                           "computed once per model and text and cached.")
    run_llama = st.button("Measure llama.cpp Q4_K_M", key="prec-quality-llama", disabled=llama_reason is not None,
                          help="llama.cpp's own Q4_K_M GGUF scored on the same tokens against the same reference, in "
                               "a fresh process. It takes a while: about 2 minutes per 1,024 tokens of the 1.5B on "
                               "2 CPU cores (longer while the machine is busy).")
    if llama_reason:
        st.caption(f"llama.cpp: {_ui.md_escape(llama_reason)}")
if run_q:
    try:
        with _ui.pool_turn("measuring quality"), st.spinner("Measuring quality against fp32…"):
            qres = quality_in_pool(_ui.get_pool(), f, int(q_tokens))
        st.session_state["prec-qres"] = {"label": f["label"], **qres}
        for h in st.session_state.get("prec-history", []):
            if h["label"] == f["label"]:
                h.update(kl_mean=qres["kld_mean"], top1=qres["top1_agreement"], ppl=qres["perplexity"])
    except Exception as e:
        _ui.show_error(e)
if run_llama:
    try:
        with _ui.pool_turn("measuring llama.cpp's quality"), \
                st.spinner(f"Scoring llama.cpp Q4_K_M on {int(q_tokens):,} tokens (this takes a while)…"):
            reference_in_pool(_ui.get_pool(), f, int(q_tokens))
            lres = llama_cpp_quality(f["name"], int(q_tokens))
        st.session_state["prec-qllama"] = {"model": f["name"], "tokens_asked": int(q_tokens), **lres}
    except Exception as e:
        _ui.show_error(e)
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
    if lq and lq.get("model") == f["name"]:
        if unavailable_line(lq):
            st.warning(unavailable_line(lq))
        else:
            results.append((f"{f['name']} llama.cpp Q4_K_M", lq))
    if results:
        st.dataframe(pd.DataFrame(table_rows(results)), hide_index=True, key="prec-quality-table")
        st.caption(f"{_ui.md_escape(heading(results[0][0], results[0][1]))}: ShareGPT answers and HumanEval "
                   "solutions, each document scored from its start. KL counts the reference's tokens with p ≥ 1e-6 "
                   "plus one bucket for the rest (about 0.6% under the full sum). The catalog's fp32 is the shipped "
                   "Q4_K_M GGUF dequantized, so llama.cpp's row measures its arithmetic on the same weights.")

hist = st.session_state.get("prec-history", [])
if len(hist) > 1:
    st.markdown("#### Precisions loaded in this session")
    st.dataframe(pd.DataFrame([{k: v for k, v in h.items() if k != "weights"} for h in hist]), hide_index=True,
                 key="prec-history-table")
