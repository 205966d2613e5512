"""Speculative playground: stream a generation with each token coloured by where it came from."""
import time

import streamlit as st

from pages import _backend, _ui
from engine import present
from engine.backend.client import BackendUnavailable
from engine.common.fields import M
from engine.common.setup import EngineSetup
from engine.common.vocab import MAX_GAMMA, PRECISIONS
from engine.measure import default_prompts

JOB = "pg-job"
STREAM = "pg-stream"  # {"job_id", "pieces": [(text, origin)], "next": the next event to ask for}
STREAM_POLL_S = 0.3

_ui.page_header("Speculative playground", "A draft proposes gamma tokens, the target checks them in one pass and "
                "keeps the longest agreeing prefix plus one token of its own. The output is exactly what the "
                "target alone would produce; only the speed changes.", price_key="playground")

DRAFTS = {"none": "none (target only)", "model": "another model (draft model)",
          "self": "self-draft (the target's own weights at lower precision)", "ngram": "n-gram prompt lookup",
          "suffix": "suffix decoding (a suffix tree of the request and earlier outputs)"}
PREC = [p for p in PRECISIONS]

with st.form("pg-form"):
    a, b = st.columns(2)
    with a:
        st.markdown("**Target**")
        model = st.selectbox("Target model", _backend.target_options(), format_func=_backend.model_label,
                             key="pg-model")
        your_model = _backend.your_model_input("pg-your-model")
        precision = st.selectbox("Target precision", PREC, index=PREC.index("int4"), key="pg-precision")
        st.markdown("**Sampling**")
        s1, s2 = st.columns(2)
        temperature = s1.number_input("Temperature (0 = greedy)", 0.0, 5.0, 0.0, 0.1, key="pg-temp")
        seed = s2.number_input("Seed", 0, 2**31 - 1, 0, key="pg-seed")
        s3, s4 = st.columns(2)
        top_k = s3.number_input("Top-k (0 = off)", 0, 1000, 0, key="pg-topk")
        top_p = s4.number_input("Top-p (1 = off)", 0.01, 1.0, 1.0, 0.05, key="pg-topp")
    with b:
        st.markdown("**Draft**")
        draft = st.selectbox("Draft kind", list(DRAFTS), index=1, format_func=DRAFTS.get, key="pg-draft")
        opts = _backend.model_options()
        dm_default = "tiny-draft" if model == "tiny" and "tiny-draft" in opts else "default-draft"
        draft_model = st.selectbox("Draft model (for 'another model')", opts, index=opts.index(dm_default),
                                   format_func=_backend.model_label, key="pg-draft-model")
        draft_precision = st.selectbox("Draft precision (model and self)", PREC, index=PREC.index("int4"),
                                       key="pg-draft-precision")
        g1, g2 = st.columns(2)
        gamma = g1.slider("Gamma (draft tokens per round)", 1, MAX_GAMMA, 4, key="pg-gamma")
        adaptive = g2.checkbox("Adaptive gamma", value=False, key="pg-adaptive",
                               help="Grow gamma after a fully accepted round, shrink it after a rejection.")
        baseline = st.checkbox("Also time the same target without speculation", value=True, key="pg-baseline")
        max_new = st.number_input("New tokens", 1, 1024, 48, key="pg-tokens")
    prompt = st.text_area("Prompt", value=default_prompts()[0], height=100, key="pg-prompt")
    go = st.form_submit_button("Generate", type="primary", disabled=_backend.job_running(JOB))

st.markdown(present.legend_html(), unsafe_allow_html=True)
stream_box = st.empty()
status_box = st.empty()

if go:
    try:
        setup = EngineSetup(model=_backend.chosen_model(model, your_model), precision=precision, draft=draft,
                            draft_model=draft_model, draft_precision=draft_precision, gamma=int(gamma),
                            adaptive_gamma=bool(adaptive))
        cfg = {"setup": setup.to_dict(), "prompt": prompt, "max_new_tokens": int(max_new),
               "temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p), "seed": int(seed),
               "baseline": bool(baseline) and draft != "none",
               "reps": 1}  # one streamed generation (Compare measures repetitions and intervals)
        job = _backend.submit(JOB, f"playground: {setup.label}",
                              _backend.runs_work([cfg], record_kind="playground", stream=True))
        st.session_state[STREAM] = {"job_id": job.job_id, "pieces": [], "next": 0}
    except Exception as e:
        _backend.show_problem(e)


def _stream(job: _backend.RemoteJob, stream: dict) -> None:
    """Draw the tokens as the backend produces them (polled every STREAM_POLL_S) until the job ends.

    A rerun meanwhile (a widget touched) resumes from the tokens already drawn: they live in the session.
    """
    store = _ui.get_store()
    last_status = 0.0
    while not job.finished:
        try:
            t = job.backend.tokens(job.job_id, stream["next"])
        except BackendUnavailable:
            t = None  # job.poll below counts the silence and gives up after a few
        if t:
            stream["pieces"] += [(e["text"], e.get("origin") or ("accepted" if e.get("accepted") else "target"))
                                 for e in t["events"]]
            stream["next"] = t["next"]
            if t["events"]:
                stream_box.markdown(present.token_spans_html(stream["pieces"]), unsafe_allow_html=True)
        if t is None or t.get("done") or time.monotonic() - last_status > 1.0:
            job.poll(store)
            last_status = time.monotonic()
            status_box.caption(f"{_ui.md_escape(job.title)} · {_ui.md_escape(job.message)} · on "
                               f"{_ui.md_code(job.url)}")
        if not job.finished:
            time.sleep(STREAM_POLL_S)
    status_box.empty()
    if job.run_ids:
        st.session_state["pg-last"] = {"run_id": job.run_ids[0], "pieces": stream["pieces"]}
    if job.error:
        st.error(job.error)


job = st.session_state.get(JOB)
stream = st.session_state.get(STREAM)
if job is not None and stream and stream.get("job_id") == job.job_id and not stream.get("shown"):
    if stream["pieces"]:
        stream_box.markdown(present.token_spans_html(stream["pieces"]), unsafe_allow_html=True)
    _stream(job, stream)
    stream["shown"] = True
    if not job.run_ids:
        st.stop()

last_run = st.session_state.get("pg-last")
if not last_run:
    stream_box.info("Set up a target and a draft, then press **Generate**. Tokens appear as they are produced.")
    st.stop()

try:
    rec = _ui.get_store().get_run(last_run["run_id"])  # imported from the backend when the run landed
except Exception as e:
    _ui.show_error(e)
    st.stop()
stream_box.markdown(present.token_spans_html(last_run["pieces"]), unsafe_allow_html=True)
counts = present.origin_counts([o for _, o in last_run["pieces"]])
st.caption(" · ".join(f"{present.ORIGINS[k][0]}: {v}" for k, v in counts.items() if k in present.ORIGINS))

m = rec.metrics
summary = present.spec_summary(rec)
c = st.columns(4)
speedup = summary["speedup"] if summary else None
# the speedup badge sits under the speculative figure it describes, and is green only when it is a gain
c[0].metric("Tokens/s", f"{m[M.decode_tok_s]:.2f}" if m.get(M.decode_tok_s) else "n/a",
            f"{(speedup - 1) * 100:+.0f}% ({speedup:.2f}x) vs without speculation" if speedup else None,
            delta_color="normal" if speedup and abs(speedup - 1) >= 0.005 else "off")
c[1].metric("TTFT", f"{m[M.ttft_s] * 1000:.0f} ms" if m.get(M.ttft_s) is not None else "n/a")
if summary:
    c[2].metric("Without speculation", f"{summary['baseline_tok_s']:.2f} tok/s" if summary["baseline_tok_s"] else
                "not timed", help="The same target, prompt and settings, timed without a draft in this run.")
    c[3].metric("Acceptance rate", f"{summary['acceptance_rate']:.0%}" if summary["acceptance_rate"] is not None
                else "n/a")
    d = st.columns(3)
    d[0].metric("Mean acceptance length", f"{summary['mean_acceptance_length']:.2f}"
                if summary["mean_acceptance_length"] else "n/a",
                help="Tokens emitted per target pass, counting the bonus/resampled token.")
    d[1].metric("Theoretical (1-a^(g+1))/(1-a)", f"{summary['theoretical_length']:.2f}"
                if summary["theoretical_length"] else "n/a",
                help="What i.i.d. acceptance at the measured rate a and the mean gamma g predicts.")
    d[2].metric("Draft vs verify time", f"{summary['draft_s']:.2f} s / {summary['verify_s']:.2f} s"
                if summary["draft_s"] is not None else "n/a")
    rows = present.acceptance_rows(m.get(M.spec))
    p1, p2 = st.columns(2)
    with p1:
        if rows:
            st.plotly_chart(present.acceptance_figure(rows), key="pg-accept", config={"displaylogo": False})
    with p2:
        st.plotly_chart(present.expected_length_figure(summary["acceptance_rate"], summary["mean_acceptance_length"],
                                                       summary["mean_gamma"]), key="pg-expected",
                        config={"displaylogo": False})
else:
    c[2].metric("Token latency p50", f"{m['token_latency_ms_median']:.1f} ms"
                if m.get("token_latency_ms_median") else "n/a")
    st.caption("No draft: every token came from the target. Pick a draft kind to see acceptance.")

st.caption("One generation, timed once: no interval. Compare measures a workload with repetitions. Noise guard: "
           + _ui.md_escape(present.noise_label(rec) or "not checked"))
b1, b2 = st.columns([1, 3])
if b1.button("Add to current comparison", key="pg-add"):
    _ui.set_current(_ui.current_ids() + [rec.run_id], "playground")
    st.toast("Added to the current comparison")
b2.caption(f"Run {rec.run_id} · {_ui.md_escape(rec.label)} · measured by the backend, stored")
st.caption(" · ".join(f"{label}: {_ui.md_escape(text)}" for label, text in present.detail(rec)))
with st.expander("Full text"):
    st.text(rec.output.get("texts", [""])[0] if rec.output.get("texts") else "")
