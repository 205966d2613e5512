"""Cost & capacity: $ per 1M output tokens from measured tokens/s, and the GPU planner for a workload."""
import pandas as pd
import streamlit as st

from pages import _ui
from engine import present
from engine.common.fields import M
from engine.common.vocab import KLD_STATS

_ui.page_header("Cost & capacity", "What the measured speed costs on this machine, and what a workload would "
                "cost on production GPUs.", price_key="cost")
answer_box = st.container()  # the answer first: the plan's summary row, drawn here once the plan is known
store = _ui.get_store()

# the plan first (its answer opens the page); the rest in tabs
tab_plan, tab_measured, tab_kv, tab_fleet, tab_prices = st.tabs(
    ["Plan GPUs for a workload", "Measured on this machine", "KV cache", "A fleet of models", "GPU prices"])

# ---------------------------------------------------------------- measured
with tab_measured:
    ids = _ui.current_ids()
    recs = _ui.load_records(ids) if ids else []
    load_recs = [r for r in recs if r.kind == "load"]  # priced at the SLO below, not as one stream
    recs = [r for r in recs if r.kind != "load"]
    if not recs:
        try:
            recs = [r for r in store.list_runs(limit=20) if (r.metrics or {}).get(M.decode_tok_s)]
        except Exception as e:
            _ui.show_error(e)
        if recs:
            st.caption("No current comparison: showing the 20 most recent stored runs.")
    usd = _ui.usd_per_hour()  # the sidebar's (page_header)
    per_day = st.number_input("Output tokens you need per day", min_value=1.0, value=1_000_000.0, step=100_000.0,
                              format="%.0f", key="cost-per-day")
    if not recs:
        st.info("No measured runs yet: run the default comparison on Home or a sweep on Compare.")
    else:
        try:
            rows = present.comparison_rows(recs, usd)
            cap = present.capacity_rows(rows, usd, per_day)
            _ui.labelled_table(cap, "cost-capacity", present.CAPACITY_LABELS,
                               usd_per_1m_out=st.column_config.NumberColumn(
                _ui.USD_LABEL, format="$%.4f", help="one stream at the measured batch size"),
                usd_per_month=st.column_config.NumberColumn("$/month", format="$%.2f"),
                utilization=st.column_config.ProgressColumn("busy", min_value=0.0, max_value=1.0, format="percent"))
            fig = present.bar_figure(rows, "usd_per_1m_out", "$ per 1M output tokens on this machine, one stream at "
                                     "the "
                                     "measured batch size", "USD", "lower")
            st.plotly_chart(fig, key="cost-chart", config={"displaylogo": False})
            st.caption("$ per 1M output tokens = $/hour ÷ (tokens/s × 3600) × 10⁶ at the measured decode speed (the "
                       "median, whiskers its 95% interval): the cost of one stream at the measured batch size, with "
                       "the "
                       "machine busy all the time; not the cost under load. Machines = ⌈tokens per day ÷ (tokens/s × "
                       "86 400)⌉.")
        except Exception as e:
            _ui.show_error(e)

    # ---------------------------------------------------------------- measured under load
    try:
        load_recs = load_recs or store.list_runs(limit=60, kind="load")
    except Exception as e:
        _ui.show_error(e)
    if load_recs:
        from engine.present import load_cost

        st.markdown("**Under load: $ per 1M output tokens at the SLO** (from the Load test page's runs)")
        st.dataframe(pd.DataFrame(load_cost.cost_rows(load_cost.costs_at_slo(load_recs, usd))), hide_index=True,
                     key="cost-at-slo", column_config={
                         "usd_per_1m_out_at_slo": st.column_config.NumberColumn("$/1M out at the SLO", format="$%.4f",
                                                                                help="goodput at the highest load "
                                                                                     "whose point met the SLO"),
                         "usd_per_1m_out_single_stream": st.column_config.NumberColumn(_ui.USD_LABEL, format="$%.4f")})
        kv_rows = load_cost.kv_cost_rows(load_recs, usd)
        if kv_rows:
            st.markdown("**Under load: the KV cache quantized or not, $ per 1M output tokens at the SLO** (same "
                        "weights, "
                        "workload, SLO and KV budget)")
            st.dataframe(pd.DataFrame(kv_rows).rename(columns=load_cost.KV_COST_LABELS), hide_index=True,
                         key="cost-kv-at-slo")

# ---------------------------------------------------------------- planner
with tab_plan:
    try:
        from engine.present import planning

        PLANNER = True
    except Exception as e:  # the planner is optional: the measured section above still stands
        PLANNER = False
        st.warning(f"The planner is not available in this build ({type(e).__name__}: {e}); only measured costs are "
                   "shown.")

if PLANNER:
    with tab_plan:
        try:
            overrides = store.gpu_overrides()
            inputs = planning.planner_inputs([r.to_dict() for r in store.list_runs(limit=1000)], overrides)
            models, gpus, cal = inputs["models"], inputs["gpus"], inputs["calibration"]
        except Exception as e:
            _ui.show_error(e)
            st.stop()
        gpu_names = planning.gpu_names(inputs)
        model_names = list(models)
        # defaults that show a decision: an 8B model at 5 req/s and a 30 ms TPOT SLO, where on an L40S fp8 halves the
        # bf16 fleet and a draft halves it again (band included); docs/PLANNER.md
        default_model = "llama-3.1-8b" if "llama-3.1-8b" in models else model_names[0]
        with st.form("cost-plan"):
            a, b, c = st.columns(3)
            with a:
                model = st.selectbox("Model", model_names, index=model_names.index(default_model), key="plan-model")
                rate = st.number_input("Requests per second", min_value=0.001, value=5.0, step=1.0, key="plan-rate")
                use_cal = st.checkbox("Use the lab's measurements (calibration)", value=cal is not None,
                                      disabled=cal is None, key="plan-cal",
                                      help="Acceptance rates and efficiency fits from your stored runs.")
            with b:
                inp = st.number_input("Input tokens per request", min_value=1, value=1024, step=128, key="plan-in")
                out = st.number_input("Output tokens per request", min_value=1, value=256, step=64, key="plan-out")
                spec = st.selectbox("Speculative decoding", ["auto", "off", "on"], key="plan-spec",
                                    help="auto plans with and without a draft.")
                what_if = st.number_input("What-if acceptance rate (blank: measured, else assumed)", value=None,
                                          step=0.05, format="%.2f", key="plan-acceptance",
                                          help="A draft acceptance rate in [0, 1) to project through the same "
                                               "speculation model: the plan says which rate it used and where from.")
            with c:
                ttft = st.number_input("TTFT p90 SLO (ms)", min_value=1.0, value=2000.0, step=100.0, key="plan-ttft")
                tpot = st.number_input("Time per output token p90 SLO (ms)", min_value=0.1, value=30.0, step=5.0,
                                       key="plan-tpot")
                sel_gpus = st.multiselect("GPUs (empty = all data-center GPUs)", gpu_names, key="plan-gpus",
                                          help="A consumer card (RTX 4090) is planned only when picked here.")
            precs = st.multiselect("Precisions (empty = all)", list(planning.PLAN_PRECISIONS),
                                   default=["bf16", "fp8", "int8", "int4"],
                                   key="plan-precisions")
            t1, t2, t3, t4, t5 = st.columns([2, 1, 1, 1, 1])
            shape = t1.selectbox("Traffic over the day", planning.TRAFFIC_CHOICES, key="plan-traffic",
                                 help="constant: the rate above all day. Otherwise the rate above is the busiest "
                                      "hour's (for 'my CSV', the file's busiest hour), and the plan compares a fleet "
                                      "sized for "
                                      "the peak with an autoscaled one.")
            ratio = t2.number_input("Peak / trough (diurnal)", min_value=1.0, value=4.0, step=0.5, key="plan-ratio")
            up_min = t3.number_input("Scale-up minutes", min_value=0.0, max_value=60.0, value=5.0, step=1.0,
                                     key="plan-scale-up")
            min_rep = t4.number_input("Min replicas", min_value=0, value=1, step=1, key="plan-min-rep")
            max_rep = t5.number_input("Max replicas (0 = none)", min_value=0, value=0, step=1, key="plan-max-rep")
            q0, q1, q2 = st.columns([1, 2, 2])
            kld_stat = q0.selectbox("KLD statistic", list(KLD_STATS), key="plan-kld-stat",
                                    help="Which statistic of the per-position KL the budget limits: the mean "
                                         "(llama.cpp's; a few outlier positions move it), the median (a typical "
                                         "token) or the 99th percentile (the tail).")
            max_kld = q1.number_input("Quality budget: largest KLD (nats/token, of that statistic; blank = none)",
                                      value=None, min_value=0.0, step=0.001, format="%.4f", key="plan-max-kld",
                                      help="Plan only configurations whose measured KL divergence from the fp32 "
                                           "reference is at most this (your quality runs).")
            max_drop = q2.number_input("Quality budget: largest pass@1 drop (points; blank = none)", value=None,
                                       min_value=0.0, step=0.5, format="%.1f", key="plan-max-pass-drop",
                                       help="Plan only configurations whose HumanEval pass@1, paired against the fp32 "
                                            "run, drops at most this many points (your accuracy runs).")
            day_csv = st.file_uploader("Your day as a CSV (hour,rate: 24 rows, requests/s)", type=["csv"],
                                       key="plan-traffic-csv")
            go_plan = st.form_submit_button("Plan", type="primary")
        if go_plan:
            try:
                rates = planning.traffic_rates(shape, float(rate), float(ratio),
                                               day_csv.getvalue() if day_csv is not None else None)
                day = None if rates is None else {"rates": rates, "name": shape, "min_replicas": int(min_rep),
                                                  "max_replicas": int(max_rep) or None, "scale_up_min": float(up_min)}
                args = (inputs, model, max(rates) if rates else rate, inp, out, float(ttft) / 1e3, float(tpot) / 1e3,
                        sel_gpus, precs, spec, use_cal)
                # one search: the answer and the plans agree
                res_d, sv_d = planning.plan_workload(*args, day=day, acceptance=what_if, max_kld=max_kld,
                                                     max_pass_drop=max_drop, kld_stat=kld_stat)
                st.session_state["plan-result"], st.session_state["plan-savings"] = res_d, sv_d
            except Exception as e:
                st.session_state.pop("plan-result", None)
                st.session_state.pop("plan-savings", None)
                _ui.show_error(e)
        res = st.session_state.get("plan-result")
        sv = st.session_state.get("plan-savings") if res else None
        if sv:
            from engine.present.answer import plan_answer

            with answer_box:
                _ui.answer_row(plan_answer(sv))
        if sv:
            st.markdown(f"**The answer on {_ui.md_escape(sv['gpu'])}:** {_ui.md_escape(sv['headline'])}")
            st.plotly_chart(planning.savings_figure(sv), key="plan-savings-chart", config={"displaylogo": False})
            st.dataframe(pd.DataFrame(planning.savings_rows(sv)), hide_index=True, key="plan-savings-steps")
            for n in sv.get("notes") or []:
                st.caption(_ui.md_escape(n))
            try:
                tf = planning.tradeoff_figure(inputs, sv, use_cal)
                if tf is not None:
                    st.plotly_chart(tf, key="plan-tradeoff-chart", config={"displaylogo": False})
            except Exception as e:
                _ui.show_error(e)
            with st.expander(f"Each precision on {sv['gpu']}, without and with speculation"):
                _ui.labelled_table(sv["precisions"], "plan-savings-precisions", planning.PRECISION_LABELS)
            day = sv.get("day")
            if day:
                st.markdown(f"**A day of {_ui.md_escape(day['traffic'])} traffic on {_ui.md_escape(day['plan'])}** "
                            f"({day['capacity_per_replica']:.3g} req/s per replica of {day['gpus_per_replica']} GPU(s) "
                            "at the SLOs)")
                d = st.columns(4)
                d[0].metric("Sized for the peak", f"${day['peak_usd_per_month']:,.0f}/month",
                            f"{day['peak_gpu_hours']:,.0f} GPU-hours/day", delta_color="off")
                d[1].metric("Autoscaled", f"${day['auto_usd_per_month']:,.0f}/month",
                            f"{day['auto_gpu_hours']:,.0f} GPU-hours/day", delta_color="off")
                saved = day["peak_usd_per_month"] - day["auto_usd_per_month"]
                d[2].metric("Autoscaling saves", f"${saved:,.0f}/month",  # no arrow on a saving of nothing
                            f"{saved / day['peak_usd_per_month']:.0%}" if day["peak_usd_per_month"] and saved >= 0.5
                            else None)
                d[3].metric("Hours missing the SLO while scaling", len(day["missed_hours"]),
                            ", ".join(f"{h}:00" for h in day["missed_hours"][:6]) or "none", delta_color="off")
                st.plotly_chart(planning.day_figure(day), key="plan-day-chart", config={"displaylogo": False})
                for n in day.get("notes") or []:
                    st.caption(_ui.md_escape(n))
                pol = sv.get("day_policy")
                if pol:
                    st.markdown(f"**By the hour:** {_ui.md_escape(pol['headline'])}")
                    p = st.columns(3)
                    p[0].metric("Best configuration per hour", f"${pol['usd_per_day']:,.2f}/day",
                                f"{len(pol['switches'])} switch(es), ${pol['switch_usd_per_day']:,.2f}/day",
                                delta_color="off")
                    p[1].metric("Best single configuration, autoscaled", f"${pol['single_usd_per_day']:,.2f}/day",
                                pol["single"]["plan"], delta_color="off")
                    p[2].metric("Changing by hour saves", f"${pol['saving_usd_per_day']:,.2f}/day",
                                f"{pol['saving_usd_per_day'] / pol['single_usd_per_day']:.1%}"
                                if pol["saving_usd_per_day"] >= 0.005 else None)
                    with st.expander("Configuration and replicas by hour"):
                        _ui.labelled_table(pol["rows"], "plan-day-policy", planning.DAY_POLICY_LABELS)
                    for n in pol.get("notes") or []:
                        st.caption(_ui.md_escape(n))
        if res:
            best = res.get("best")
            if best and sv:  # one answer: the waterfall's last step (at equal cost, fewer changes from bf16)
                last = sv["steps"][-1]
                best = next((p for p in res["plans"] if p.get("label") == last["plan"]), best)
            if best:
                m = st.columns([2, 1, 1, 1])
                m[0].metric("Recommended plan", best.get("label", ""),
                            help="The answer above: the cheapest plan that meets the SLOs (and the quality budget); at "
                                 "equal cost, the one with fewer changes from bf16 without speculation.")
                m[1].metric("$ per month", f"${best['usd_per_month']:,.0f}" if best.get("usd_per_month") else "n/a")
                m[2].metric("$ per 1M output tokens", f"${best['usd_per_1m_output']:.4f}"
                            if best.get("usd_per_1m_output") else "n/a")
                m[3].metric("GPUs", best.get("gpus_total", "n/a"))
            else:
                st.warning("No plan meets these SLOs; the reasons are in the table.")
            rows = present.plan_rows(res["plans"])
            feas = [r for r in rows if r["feasible"]]
            if feas:
                st.plotly_chart(planning.plans_figure(feas), key="plan-chart", config={"displaylogo": False})
            show_all = st.checkbox("Show infeasible plans too", value=not feas, key="plan-all")
            _ui.labelled_table(rows if show_all else feas, "plan-table", present.PLAN_LABELS)
            for n in res.get("notes") or []:
                st.caption("Note: " + _ui.md_escape(n))
            if best and best.get("why"):
                with st.expander(f"Why {best.get('label', '')}: the formula terms"):
                    st.dataframe(pd.DataFrame(best["why"]), hide_index=True, key="plan-why")
            if best and best.get("assumptions"):
                with st.expander("Assumptions"):
                    st.markdown("\n".join(f"- {_ui.md_escape(x)}" for x in best["assumptions"]))

    with tab_kv:
        k1, k2, k3 = st.columns(3)
        kv_model = k1.selectbox("Model", model_names, index=model_names.index(default_model), key="kv-model")
        kv_gib = k2.number_input("KV budget (GiB)", min_value=0.01, value=8.0, step=1.0, key="kv-gib")
        kv_ctx = k3.number_input("Tokens per sequence (prompt + output)", min_value=1, value=2048, step=256,
                                 key="kv-ctx")
        try:
            _ui.labelled_table(planning.kv_fit_rows(inputs, kv_model, float(kv_gib), int(kv_ctx)), "kv-fit",
                               planning.KV_FIT_LABELS,
                               kib_per_token=st.column_config.NumberColumn("KiB per token", format="%.1f"),
                               vs_bf16=st.column_config.NumberColumn("× bf16", format="%.2f"))
            st.caption("Sequences = ⌊budget ÷ KV bytes of one sequence⌋; bytes per token = layers × KV heads × (K + V "
                       "bytes of a head, with int8's fp16 scales: one per 32 key values, one per value vector). The "
                       "engine's paged cache (`serve --kv-cache-gib`, `--kv-dtype`) allocates its blocks by the same "
                       "formula; docs/SERVING.md.")
        except Exception as e:
            _ui.show_error(e)

    with tab_fleet:
        with st.form("cost-fleet"):
            f1, f2 = st.columns([3, 1])
            fleet_text = f1.text_input("Models and their request rates (model:req/s, comma-separated)",
                                       value="llama-3.1-8b:1, qwen2.5-7b:0.5, mistral-7b:0.5", key="fleet-models",
                                       help="Each model plans with the input/output lengths and SLOs of the form "
                                            "above.")
            fleet_gpu = f2.selectbox("GPU", gpu_names, index=gpu_names.index("L40S") if "L40S" in gpu_names else 0,
                                     key="fleet-gpu")
            go_fleet = st.form_submit_button("Plan the fleet")
        if go_fleet:
            try:
                st.session_state["fleet-result"] = planning.fleet_plan(
                    inputs, fleet_text, fleet_gpu, st.session_state.get("plan-in", 1024),
                    st.session_state.get("plan-out", 256), st.session_state.get("plan-ttft", 2000.0) / 1e3,
                    st.session_state.get("plan-tpot", 50.0) / 1e3)
            except Exception as e:
                st.session_state.pop("fleet-result", None)
                _ui.show_error(e)
        fp = st.session_state.get("fleet-result")
        if fp and fp.get("best"):
            b = fp["best"]
            answer = (f"At {b['precision']}, {b['gpus_packed']} {fp['gpu']} GPU(s) shared against {b['gpus_separate']} "
                      f"with one model per GPU: ${b['usd_per_month_packed']:,.0f}/month against "
                      f"${b['usd_per_month_separate']:,.0f}")
            st.markdown(f"**{_ui.md_escape(answer)}**")
            st.plotly_chart(planning.fleet_figure(fp), key="fleet-chart", config={"displaylogo": False})
            st.dataframe(pd.DataFrame(planning.fleet_rows(fp)), hide_index=True, key="fleet-table")
            for r in fp.get("refused") or []:
                st.caption("Not at " + _ui.md_escape(r))
            st.caption("A GPU takes another model while the memory at each one's peak concurrency (weights, reserve, "
                       "KV for twice its mean decode batch) fits, and their shares of the GPU's time add to at most 1.")

    with tab_prices:
        try:
            pt = pd.DataFrame(planning.price_rows(inputs))
            st.dataframe(pt, hide_index=True, key="gpu-prices")
        except Exception as e:
            _ui.show_error(e)
        with st.form("gpu-override"):
            o1, o2, o3 = st.columns([2, 1, 2])
            og = o1.selectbox("GPU", list(gpus), key="ov-gpu")
            op = o2.number_input("Your $/GPU-hour", min_value=0.0, value=1.0, step=0.1, key="ov-price")
            osrc = o3.text_input("Source (e.g. our contract)", value="my price", key="ov-src", max_chars=200)
            if st.form_submit_button("Save price"):
                try:
                    planning.set_gpu_price(store, og, float(op), osrc)  # refused by name before anything is stored
                    if og == planning.THIS_MACHINE:
                        st.session_state["usd_per_hour"] = float(op)
                    st.session_state["ov-saved"] = f"Saved: {og} at ${op:.2f}/hour. Plans use it from now on."
                    st.rerun()
                except Exception as e:
                    _ui.show_error(e)
        saved_msg = st.session_state.pop("ov-saved", None)
        if saved_msg:
            st.success(_ui.md_escape(saved_msg))
        if overrides:
            names = [o["name"] for o in overrides]
            d1, d2 = st.columns([2, 1])
            gone = d1.selectbox("Your overrides", names, key="ov-del-name")
            if d2.button("Remove override", key="ov-del"):
                store.delete_gpu_override(gone)
                st.rerun()
