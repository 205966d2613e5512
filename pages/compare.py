"""Compare: sweep target precision × draft × draft precision × gamma × batch (plus peer systems), or pick
stored runs."""
import pandas as pd
import streamlit as st

from pages import _backend, _ui
from engine import peers
from engine import present
from engine.present.accuracy_view import NOTE as ACCURACY_NOTE, accuracy_rows
from engine.common.record_setup import SETUP_FIELDS, setup_from_record
from engine.common.vocab import DRAFT_KINDS, MAX_GAMMA, PRECISIONS, QUANT_METHODS
from engine.measure import RunConfig, sweep_configs

JOB = "sweep-job"


def peer_dict(pc) -> dict:
    """A PeerConfig as the backend takes it."""
    from dataclasses import asdict

    return pc.to_dict() if hasattr(pc, "to_dict") else asdict(pc)


def rerun_config(rec) -> dict | None:
    """The config that measures a stored run again, as the backend takes it (any readable schema), or None."""
    rc = (rec.config or {}).get("run_config")
    if rec.kind not in ("bench", "generate", "playground") or not isinstance(rc, dict):
        return None
    own = {k: v for k, v in rc.items() if k != "setup" and k not in SETUP_FIELDS}
    return {"setup": setup_from_record(rec.config).to_dict(), **own}

_ui.page_header("Compare (sweep)", "Every combination you tick is measured on this machine and stored as it "
                "finishes; cancel keeps what is done. Or pick runs you measured before.", price_key="cmp")
if _ui.current_ids():  # the answer first: the current comparison's (its evidence is below the sweep)
    _ui.runs_answer_row(_ui.load_records(_ui.current_ids()))

tab_sweep, tab_pick = st.tabs(["New sweep", "Pick stored runs"])

with tab_sweep:
    a, b, c = st.columns(3)
    with a:
        choice = st.selectbox("Target model", _backend.target_options(), format_func=_backend.model_label,
                              key="cmp-model")
        typed = _backend.your_model_input("cmp-your-model") if choice == _backend.YOUR_MODEL else ""
        model = choice if choice != _backend.YOUR_MODEL else typed.strip()
        methods = [f"int4-{m}" for m in QUANT_METHODS if m != "rtn"]  # int4-checkpoint: your quantized folder
        precisions = st.multiselect("Target precisions", [*PRECISIONS, *methods],
                                    default=["fp32", "int8", "int4"], key="cmp-precisions",
                                    help="int4 is round-to-nearest; int4-gptq, -awq and -gptq-mixed calibrate once on "
                                         "workload text the lab never scores, -gptq-llmc the same with llm-compressor "
                                         "(`make llmc`); int4-checkpoint runs your quantized "
                                         "checkpoint's own codes (docs/MODELS.md)")
        batches = st.multiselect("Batch sizes", [1, 2, 4, 8, 16, 32, 64], default=[1], key="cmp-batches")
    with b:
        drafts = st.multiselect("Drafts", list(DRAFT_KINDS), default=["none", "model"], key="cmp-drafts")
        opts = _backend.model_options()
        dm_default = "tiny-draft" if model == "tiny" and "tiny-draft" in opts else "default-draft"
        draft_model = st.selectbox("Draft model (for 'model')", opts, index=opts.index(dm_default),
                                   format_func=_backend.model_label, key="cmp-draft-model")
        draft_precisions = st.multiselect("Draft precisions (model and self)", PRECISIONS, default=["int4"],
                                          key="cmp-draft-precisions")
    with c:
        gammas = st.multiselect("Gammas", list(range(1, MAX_GAMMA + 1)), default=[4], key="cmp-gammas")
        max_new = st.number_input("New tokens per run", 1, 1024, 32, key="cmp-tokens")
        workload = _ui.workload_input("cmp-workload", "chat:4,code:4")
        reps = st.number_input("Repetitions", 1, 20, 3, key="cmp-reps",
                               help="Every prompt is measured this many times after a warm-up: the noise verdict "
                                    "needs 2 or more; below 5 the ± is the range of the repetitions, from 5 on a "
                                    "95% interval.")
        quality = st.checkbox("Measure quality vs fp32", value=False, key="cmp-quality",
                              help="Adds a 256-token evaluation per run; needed for the cost-vs-quality frontier.")

    with st.expander("Peer systems as rows (transformers, bitsandbytes, llama.cpp)"):
        st.caption("Each peer runs one prompt for the number of new tokens, greedy, in a fresh process, after a "
                   "warm-up, timed by wall-clock token arrivals: another method than the sweep's runs, so peers get "
                   "their own table below. Only the peers installed on the backend's machine are offered; "
                   "`make peers` there builds llama-cpp-python.")
        peer_ok, peer_missing = [], {}
        try:
            reported = (_backend.info_or_banner() or {}).get("peers")
            if reported is None:
                st.warning("The backend does not say which peers its machine has (an older backend?): restart it "
                           "from this checkout (python -m engine backend). No peer is offered until it does.")
                reported = {}
            peer_ok, peer_missing = peers.dashboard_peer_configs(model, draft_model, int(max_new), reported=reported)
        except Exception as e:
            _ui.show_error(e)
        peer_labels = {c.label: c for c in peer_ok}
        picked_peers = st.multiselect("Peers to measure", list(peer_labels), default=[], key="cmp-peers")
        for label, why in peer_missing.items():
            st.caption(f"Not offered: {_ui.md_escape(label)}: {_ui.md_escape(why)}")

    cfgs, peer_cfgs, problem = [], [], None
    try:
        base = RunConfig.of(model=_backend.chosen_model(choice, typed), draft_model=draft_model,
                            max_new_tokens=int(max_new), quality=bool(quality), workload=workload.strip() or None,
                            reps=int(reps))
        peer_cfgs = [peer_dict(peer_labels[p].validate()) for p in picked_peers]
        if picked_peers and not precisions:
            pass  # peers alone are a valid comparison
        elif not precisions or not drafts or not batches:
            problem = "pick at least one target precision, one draft kind (none counts) and one batch size"
        elif any(d in ("model", "self") for d in drafts) and not draft_precisions:
            problem = "pick a draft precision for the model/self drafts"
        elif any(d != "none" for d in drafts) and not gammas:
            problem = "pick at least one gamma for the drafts"
        else:
            left_out: list[str] = []
            cfgs = [x.validate().to_dict()
                    for x in sweep_configs(base, precisions, drafts, draft_precisions or ["int4"], gammas or [4],
                                           batches, left_out)]
            if left_out:
                st.caption("Left out: " + _ui.md_escape(", ".join(left_out)) + " (a self-draft must read fewer bytes "
                           "than its target to save anything).")
    except Exception as e:
        _ui.show_error(e)
    n = len(cfgs) + len(peer_cfgs)
    if problem:
        st.warning(f"Nothing to run yet: {problem}.")
    else:
        st.caption(f"{n} run(s) in this grid. The backend measures them one at a time and keeps loaded models for "
                   "the next run.")
    if st.button("Run sweep", type="primary", disabled=_backend.job_running(JOB) or not n or problem is not None,
                 key="cmp-run"):
        try:  # one job: our runs, then the peers beside them
            title = f"sweep of {len(cfgs)} runs" + (f" and {len(peer_cfgs)} peer runs" if peer_cfgs else "")
            _backend.submit(JOB, title, _backend.runs_work(cfgs, peers=peer_cfgs))
            st.rerun()
        except Exception as e:
            _backend.show_problem(e)
    _backend.job_section(JOB, "sweep")

with tab_pick:
    try:
        recs = _ui.get_store().list_runs(limit=500)
    except Exception as e:
        recs = []
        _ui.show_error(e)
    if not recs:
        st.info("No stored runs yet.")
    else:
        labels = {r.run_id: present.run_choice_label(r) for r in recs}
        picked = st.multiselect("Stored runs (newest first)", list(labels), format_func=labels.get,
                                default=[i for i in _ui.current_ids() if i in labels], key="cmp-picked")
        if st.button("Use these as the current comparison", disabled=not picked, key="cmp-use"):
            _ui.set_current(picked, "picked runs")
            st.toast(f"{len(picked)} runs are now the current comparison")

st.divider()
ids = _ui.current_ids()
st.subheader(f"Current comparison ({len(ids)} runs)")
if ids:
    recs = _ui.load_records(ids)
    _ui.comparison_view(recs, key="cmp")
    acc = [r for r in recs if r.kind == "accuracy"]
    if acc:  # HumanEval pass@1 paired against the reference picked (the first by default), KLD beside
        st.markdown("#### Task accuracy beside KLD")
        try:
            ref = st.selectbox("Reference", range(len(acc)), format_func=lambda i: acc[i].label, key="cmp-acc-ref",
                               help="Every other accuracy run is paired against this one, problem by problem "
                               "(docs/ACCURACY.md).") if len(acc) > 1 else 0
            st.dataframe(pd.DataFrame(accuracy_rows(acc, _ui.get_store().list_runs(1000), int(ref))),
                         hide_index=True, key="cmp-acc-table")
            st.caption(ACCURACY_NOTE)
        except Exception as e:
            _ui.show_error(e)
    noisy = [r for r in present.noisy_configs(recs) if rerun_config(r) is not None]
    if noisy:
        st.markdown("**Noisy runs**: " + _ui.md_escape("; ".join(f"{r.label} ({present.noise_label(r)})"
                                                                   for r in noisy)))
        if st.button(f"Re-run the {len(noisy)} noisy configuration(s)", key="cmp-rerun",
                     disabled=_backend.job_running(JOB),
                     help="Measures them again with the same settings; the new runs replace them in the "
                          "comparison (the old ones stay stored)."):
            try:
                again = [rerun_config(r) for r in noisy]
                keep = [i for i in ids if i not in {r.run_id for r in noisy}]
                _backend.submit(JOB, f"re-run of {len(again)} noisy runs", _backend.runs_work(again), keep_ids=keep)
                st.rerun()
            except Exception as e:
                _backend.show_problem(e)
else:
    st.info("Run a sweep, or pick stored runs, to fill the comparison.")
