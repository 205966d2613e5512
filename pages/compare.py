"""Compare: sweep target precision × draft × draft precision × gamma × batch (plus peer systems), or pick stored runs."""
import streamlit as st

from pages import _ui
from engine import peers
from engine import present
from engine.common.vocab import DRAFT_KINDS, MAX_GAMMA, PRECISIONS
from engine.measure import RunConfig, sweep_configs

JOB = "sweep-job"

_ui.page_header("Compare (sweep)", "Every combination you tick is measured on this machine and stored as it "
                "finishes; cancel keeps what is done. Or pick runs you measured before.")

tab_sweep, tab_pick = st.tabs(["New sweep", "Pick stored runs"])

with tab_sweep:
    a, b, c = st.columns(3)
    with a:
        model = st.selectbox("Target model", _ui.model_options(), format_func=_ui.model_label, key="cmp-model")
        precisions = st.multiselect("Target precisions", PRECISIONS, default=["fp32", "int8", "int4"],
                                    key="cmp-precisions")
        batches = st.multiselect("Batch sizes", [1, 2, 4, 8, 16, 32, 64], default=[1], key="cmp-batches")
    with b:
        drafts = st.multiselect("Drafts", list(DRAFT_KINDS), default=["none", "model"], key="cmp-drafts")
        opts = _ui.model_options()
        dm_default = "tiny-draft" if model == "tiny" and "tiny-draft" in opts else "default-draft"
        draft_model = st.selectbox("Draft model (for 'model')", opts, index=opts.index(dm_default),
                                   format_func=_ui.model_label, key="cmp-draft-model")
        draft_precisions = st.multiselect("Draft precisions (model and self)", PRECISIONS, default=["int4"],
                                          key="cmp-draft-precisions")
    with c:
        gammas = st.multiselect("Gammas", list(range(1, MAX_GAMMA + 1)), default=[4], key="cmp-gammas")
        max_new = st.number_input("New tokens per run", 1, 1024, 32, key="cmp-tokens")
        workload = _ui.workload_input("cmp-workload", "chat:4,code:4")
        reps = st.number_input("Repetitions", 1, 20, 3, key="cmp-reps",
                               help="Every prompt is measured this many times after a warm-up: the intervals and "
                                    "the noise verdict need 2 or more.")
        quality = st.checkbox("Measure quality vs fp32", value=False, key="cmp-quality",
                              help="Adds a 256-token evaluation per run; needed for the cost-vs-quality frontier.")

    with st.expander("Peer systems as rows (transformers, bitsandbytes, llama.cpp)"):
        st.caption("Each peer runs on the same prompt and number of new tokens, greedy, in a fresh process, after a "
                   "warm-up. Only installed peers are offered; `make peers` builds llama-cpp-python.")
        peer_ok, peer_missing = [], {}
        try:
            peer_ok, peer_missing = peers.dashboard_peer_configs(model, draft_model, int(max_new))
        except Exception as e:
            _ui.show_error(e)
        peer_labels = {c.label: c for c in peer_ok}
        picked_peers = st.multiselect("Peers to measure", list(peer_labels), default=[], key="cmp-peers")
        for label, why in peer_missing.items():
            st.caption(f"Not offered: {_ui.md_escape(label)}: {_ui.md_escape(why)}")

    cfgs, problem = [], None
    try:
        base = RunConfig(model=model, draft_model=draft_model, max_new_tokens=int(max_new), quality=bool(quality),
                         workload=workload.strip() or None, reps=int(reps))
        if picked_peers and not precisions:
            cfgs = [peer_labels[p].validate() for p in picked_peers]  # peers alone are a valid comparison
        elif not precisions or not drafts or not batches:
            problem = "pick at least one target precision, one draft kind (none counts) and one batch size"
        elif any(d in ("model", "self") for d in drafts) and not draft_precisions:
            problem = "pick a draft precision for the model/self drafts"
        elif any(d != "none" for d in drafts) and not gammas:
            problem = "pick at least one gamma for the drafts"
        else:
            cfgs = [x.validate() for x in sweep_configs(base, precisions, drafts, draft_precisions or ["int4"],
                                                        gammas or [4], batches)]
            cfgs += [peer_labels[p].validate() for p in picked_peers]
    except Exception as e:
        _ui.show_error(e)
    if problem:
        st.warning(f"Nothing to run yet: {problem}.")
    else:
        st.caption(f"{len(cfgs)} run(s) in this grid. Models are loaded once and kept (up to 3 at a time).")
    running = _ui.job_running(JOB)
    col_run, col_ray = st.columns([1, 2])
    ray_at = col_ray.text_input("Ray cluster", "", key="cmp-ray",
                                placeholder="blank: this process; local, auto or HOST:6379",
                                help="Run each configuration as a task on a Ray cluster (docs/CLUSTER.md); records "
                                     "land in this lab's store as tasks finish, Cancel cancels the outstanding tasks."
                                ).strip()
    if col_run.button("Run sweep", type="primary", disabled=running or not cfgs, key="cmp-run"):
        if ray_at:
            from engine.cluster import sweep_job

            _ui.start_job(JOB, f"sweep of {len(cfgs)} runs on Ray ({ray_at})", cfgs, work=sweep_job(cfgs, ray_at))
        else:
            _ui.start_job(JOB, f"sweep of {len(cfgs)} runs", cfgs)
        st.rerun()
    _ui.job_section(JOB, "sweep")

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
    _ui.comparison_view(recs, key="cmp", price_where="cmp")
    noisy = [r for r in present.noisy_configs(recs) if RunConfig.from_record(r) is not None]
    if noisy:
        st.markdown("**Noisy runs**: " + _ui.md_escape("; ".join(f"{r.label} ({present.noise_label(r)})"
                                                                   for r in noisy)))
        if st.button(f"Re-run the {len(noisy)} noisy configuration(s)", key="cmp-rerun",
                     disabled=_ui.job_running(JOB),
                     help="Measures them again with the same settings; the new runs replace them in the "
                          "comparison (the old ones stay stored)."):
            try:
                again = [RunConfig.from_record(r).validate() for r in noisy]
                keep = [i for i in ids if i not in {r.run_id for r in noisy}]
                _ui.start_job(JOB, f"re-run of {len(again)} noisy runs", again, keep_ids=keep)
                st.rerun()
            except Exception as e:
                _ui.show_error(e)
else:
    st.info("Run a sweep, or pick stored runs, to fill the comparison.")
