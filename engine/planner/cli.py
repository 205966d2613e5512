"""`python -m engine plan`: the cost & capacity planner on the command line.

Thin layer over engine.planner: parse, call, print a table (or --json). Also:
  --check-published   recompute the docs' table of predictions vs published measurements, with the
                      leave-one-out error of every point the efficiency fit uses
  --refit             rewrite data/efficiency_fit.csv from data/published_measurements.csv (developers)
  --check-load        the plan for this machine against its own load records of the lab's server
  --sweep GPU         decode cost vs batch per precision, with/without speculation
  --packing GPU       replicas of the model that fit on one GPU per precision
  --gpus-table        the GPU catalog with prices and their spread

The lab's store is the caller's: engine/__main__.py passes `stored_runs` (run records as plain
dicts, RunRecord.to_dict()) and `stored_gpu_overrides` to `add_parser`; the planner never imports
it. Without them (tests, `python -m engine.planner.cli`) only --records and --overrides files count.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path
from typing import Callable

from engine import planner
from engine.common.errors import UserError
from engine.planner import shapes
from engine.planner.gpus import CatalogError, find_gpu, load_gpus, price_table
from engine.planner import batchjob, fit, fleet, hf_config, selfcheck, traffic
from engine.planner.savings import plan_with_savings

StoreReader = Callable[[], list]      # () -> list of plain dicts read from the lab's store


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in _csv(s)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{s}'") from None


def _price(s: str) -> tuple[str, float]:
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"expected GPU=USD_PER_HR, got '{s}'")
    k, v = s.rsplit("=", 1)
    try:
        return k.strip(), float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"price in '{s}' is not a number") from None


def add_parser(subparsers, stored_runs: StoreReader | None = None,
               stored_gpu_overrides: StoreReader | None = None) -> argparse.ArgumentParser:
    """Register the `plan` subcommand on an argparse subparsers object. `stored_runs` and
    `stored_gpu_overrides` read the lab's store (called only without --no-store)."""
    p = subparsers.add_parser(
        "plan", help="GPUs, precision and speculation for a workload, ranked by cost",
        description="Project the lab's measurements onto production GPUs: GPUs needed, $/1M tokens, $/month.")
    p.add_argument("--model", default=None, help="catalog model (see --models-table); default: the lab's default")
    p.add_argument("--model-config", default=None, metavar="CONFIG_JSON",
                   help="plan any model from its Hugging Face config.json instead of a catalog model "
                        f"(model types: {', '.join(hf_config.HF_MODEL_TYPES)})")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second (default 1)")
    p.add_argument("--input", type=int, default=512, help="prompt tokens per request (default 512)")
    p.add_argument("--output", type=int, default=256, help="output tokens per request (default 256)")
    p.add_argument("--ttft", type=float, default=2.0, help="p90 time-to-first-token SLO, seconds (default 2)")
    p.add_argument("--tpot", type=float, default=0.05, help="p90 per-token latency SLO, seconds (default 0.05)")
    p.add_argument("--gpus", type=_csv, default=None, help="comma-separated GPU names (default: all shipped GPUs)")
    p.add_argument("--precisions", type=_csv, default=None,
                   help=f"comma-separated: {','.join(shapes.PLAN_PRECISIONS)} (fp4: Blackwell only, never by default)")
    p.add_argument("--tp", type=_ints, default=None, help="tensor-parallel sizes to try (default 1,2,4,8)")
    p.add_argument("--spec", choices=["auto", "on", "off"], default="auto", help="speculative decoding plans")
    p.add_argument("--acceptance", type=float, default=None,
                   help="draft acceptance rate (default: measured by the lab)")
    p.add_argument("--gamma", type=int, default=None, help="draft tokens per round (default 4 or measured)")
    p.add_argument("--draft-kind", choices=["model", "self", "ngram", "heads"], default=None)
    p.add_argument("--draft-model", default=None, help="catalog model used as draft (default: smallest of the family)")
    p.add_argument("--family", default="serving", choices=list(planner.FAMILIES), help="kernel family (efficiencies)")
    p.add_argument("--kv-dtype", default="bf16", choices=list(shapes.KV_DTYPES))
    p.add_argument("--group-size", type=int, default=64, help="int4 group size")
    p.add_argument("--quantize-head", action="store_true", help="quantize the output head too")
    p.add_argument("--traffic", default=None, choices=list(traffic.SHAPES),
                   help="a day of traffic whose busiest hour is --rate: size a fleet for the peak and "
                        "an autoscaled one")
    p.add_argument("--peak-to-trough", type=float, default=4.0, help="diurnal traffic: peak / trough (default 4)")
    p.add_argument("--traffic-csv", default=None, metavar="CSV",
                   help="the day as a CSV of hour,rate (24 rows, requests/s); its busiest hour is the rate planned")
    p.add_argument("--min-replicas", type=int, default=1, help="autoscaler floor (default 1)")
    p.add_argument("--max-replicas", type=int, default=None, help="autoscaler ceiling (default none)")
    p.add_argument("--scale-up-min", type=float, default=5.0, help="minutes a new replica takes to serve (default 5)")
    p.add_argument("--fleet", default=None, metavar="MODEL:RATE,...",
                   help="plan several models on one GPU kind (--gpus, one): one model per GPU against sharing GPUs; "
                        "each at RATE req/s with --input/--output/--ttft/--tpot")
    p.add_argument("--batch-job", type=float, default=None, metavar="TOKENS_PER_DAY",
                   help="plan a batch job instead: this many output tokens a day, no latency SLO, within --deadline")
    p.add_argument("--deadline", type=float, default=8.0, help="batch job: hours each day's tokens must finish in")
    p.add_argument("--price", type=_price, action="append", default=[], metavar="GPU=USD",
                   help="price override for this plan, e.g. --price 'H100 SXM=2.49' (repeatable)")
    p.add_argument("--prices", choices=["reference", "low", "high"], default="reference",
                   help="which price column: reference on-demand, cheapest or dearest provider")
    p.add_argument("--overrides", default=None, help="JSON file: list of GPU override dicts (see load_gpus)")
    p.add_argument("--records", action="append", default=[],
                   help="JSON/JSONL file of lab run records for calibration and acceptance (repeatable)")
    p.add_argument("--no-store", action="store_true", help="ignore the lab's SQLite store (its overrides and runs)")
    p.add_argument("--top", type=int, default=12, help="rows to show (default 12)")
    p.add_argument("--all", action="store_true", help="show infeasible plans too")
    p.add_argument("--why", action="store_true", help="print the formula breakdown of the best plan")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--check-published", action="store_true",
                   help="predictions vs published measurements, with the fit's leave-one-out errors")
    p.add_argument("--refit", action="store_true",
                   help="rewrite data/efficiency_fit.csv from the published measurements (developers; then update "
                        "docs/PLANNER.md from --check-published)")
    p.add_argument("--check-load", action="store_true",
                   help="the plan for this machine against the load records of the lab's server (from --records "
                        "/ the store): output tok/s, TTFT and ITL per point, and the term that misses")
    p.add_argument("--in-sample", action="store_true",
                   help="with --check-load: calibrate on every record, the predicted point included (the default holds "
                        "each point out of its own fit)")
    p.add_argument("--sweep", default=None, metavar="GPU", help="decode cost vs batch on this GPU")
    p.add_argument("--batches", type=_ints, default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    p.add_argument("--context", type=int, default=None, help="context tokens for --sweep (default input+output/2)")
    p.add_argument("--packing", default=None, metavar="GPU", help="replicas per GPU, per precision")
    p.add_argument("--gpus-table", action="store_true", help="list the GPU catalog and prices")
    p.add_argument("--models-table", action="store_true", help="list catalog model shapes and sizes")
    p.add_argument("--calibration", action="store_true", help="print the fit from --records / the store")
    p.set_defaults(fn=functools.partial(run, stored_runs=stored_runs, stored_gpu_overrides=stored_gpu_overrides))
    return p


# ------------------------------------------------------------------ helpers

def _from_store(read: StoreReader | None) -> list[dict]:
    """What a store reader returns; nothing when there is none, or when the store is broken (a
    broken store must not stop planning)."""
    if read is None:
        return []
    try:
        return list(read() or [])
    except Exception:
        return []


def _load_records(paths: list[str], stored_runs: StoreReader | None = None) -> list[dict]:
    recs: list[dict] = []
    for path in paths:
        text = Path(path).read_text()
        try:
            data = json.loads(text)
            recs += data if isinstance(data, list) else [data]
        except ValueError:
            for i, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        raise UserError(f"{path} line {i} is not JSON", "pass a JSON list or JSONL of run records")
    return recs + _from_store(stored_runs)


def _overrides(a, stored_gpu_overrides: StoreReader | None = None) -> list[dict]:
    ov: list[dict] = _from_store(None if a.no_store else stored_gpu_overrides)
    if a.overrides:
        data = json.loads(Path(a.overrides).read_text())
        if not isinstance(data, list):
            raise UserError(f"{a.overrides} must hold a JSON list of override dicts", "see load_gpus' docstring")
        ov += data
    return ov


def _f(x, nd=2, scale=1.0):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return f"{x * scale:,.{nd}f}"


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    heads = [h for h, _ in cols]
    cells = [[str(r.get(k, "")) for _, k in cols] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    out = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def _plan_rows(plans) -> list[dict]:
    rows = []
    for p in plans:
        rows.append({
            "plan": p.label, "gpus": p.gpus_total or "", "usd_hr": _f(p.usd_per_hr),
            "usd_month": _f(p.usd_per_month, 0), "in_1m": _f(p.usd_per_1m_input, 3),
            "out_1m": _f(p.usd_per_1m_output, 3), "ttft_p90": _f(p.ttft_p90_s, 0, 1e3),
            "tpot_p90": _f(p.tpot_p90_s, 1, 1e3), "margin": (f"{min(p.ttft_margin, p.tpot_margin):.2f}x"
                                                            if p.feasible else ""),
            "tok_s_gpu": _f(p.output_tok_s_per_gpu, 0), "max_conc": p.max_concurrency or "",
            "bound": p.bound, "why_not": "; ".join(p.reasons)[:170],
        })
    return rows


_PLAN_COLS = [("plan", "plan"), ("GPUs", "gpus"), ("$/hr", "usd_hr"), ("$/month", "usd_month"),
              ("$/1M in", "in_1m"), ("$/1M out", "out_1m"), ("TTFT p90 ms", "ttft_p90"), ("TPOT p90 ms", "tpot_p90"),
              ("SLO margin", "margin"), ("out tok/s/GPU", "tok_s_gpu"), ("max conc", "max_conc"), ("bound", "bound")]


def _fleet(a, gpus, models) -> int:
    """--fleet: several models on one GPU kind, one per GPU against packed, at each precision."""
    items = fleet.parse_fleet(a.fleet, a.input, a.output, a.ttft, a.tpot)
    if not a.gpus or len(a.gpus) != 1:
        raise planner.PlanError("gpus", "a fleet plans on one GPU kind: give --gpus with one GPU")
    fp = fleet.plan_fleet(items, a.gpus[0], gpus, models, a.precisions or ("bf16", "fp8", "int8", "int4"))
    if a.json:
        print(json.dumps(fp.to_dict(), indent=1, default=str))
        return 0
    b = fp.best
    print(f"a fleet of {len(items)} models on {fp.gpu} "
          f"({', '.join(f'{i.model} at {i.request_rate:g} req/s' for i in items)})"
          f"\n\nthe answer: at {b.precision}, {b.gpus_packed} GPU(s) shared against {b.gpus_separate} with one model "
          f"per GPU: ${b.usd_per_month_packed:,.0f}/month against ${b.usd_per_month_separate:,.0f}\n")
    rows = [{"precision": o.precision, "sep": o.gpus_separate, "packed": o.gpus_packed,
             "usd_sep": _f(o.usd_per_month_separate, 0), "usd_packed": _f(o.usd_per_month_packed, 0),
             "gpus": " | ".join(" + ".join(f"{r.model} {r.memory_gib:.1f} GiB {r.share:.0%}" for r in bn)
                                for bn in o.bins)} for o in fp.options]
    print(_table(rows, [("precision", "precision"), ("GPUs, one model each", "sep"), ("GPUs shared", "packed"),
                        ("$/month one each", "usd_sep"), ("$/month shared", "usd_packed"),
                        ("each GPU: model, memory at peak concurrency, share of time", "gpus")]))
    for r in fp.refused:
        print(f"  not at {r}")
    return 0


def _batch_job(a, gpus, models) -> int:
    """--batch-job: the cheapest day for N output tokens within the deadline, each option's tokens per dollar."""
    job = batchjob.BatchJob(a.model, a.batch_job, a.input, a.output, a.deadline, a.gpus, a.precisions,
                            tuple(a.tp or (1, 2, 4, 8)))
    bp = batchjob.plan_batch(job, gpus, models)
    if a.json:
        d = bp.to_dict()
        d["options"] = d["options"][: a.top]
        print(json.dumps(d, indent=1, default=str))
        return 0 if bp.best else 1
    print(f"{a.model}: a batch job of {a.batch_job:,.0f} output tokens a day ({a.input} in / {a.output} out per "
          f"request), done within {a.deadline:g} h, no latency SLO\n")
    if bp.best is None:
        print("no configuration fits.")
        return 1
    b = bp.best
    print(f"the answer: {b.label}, {b.replicas} replica(s) for {a.deadline:g} h: ${b.usd_per_day:,.2f}/day, "
          f"${b.usd_per_1m_output:.4f} per 1M output tokens ({b.tok_per_usd:,.0f} tokens per $)\n")
    rows = [{"plan": o.label, "replicas": o.replicas, "tok_s": _f(o.output_tok_s, 0),
             "tok_usd": f"{o.tok_per_usd:,.0f}",
             "usd_day": _f(o.usd_per_day), "out_1m": _f(o.usd_per_1m_output, 4),
             "latency": _f(o.request_latency_s / 60, 1)} for o in bp.options[: a.top]]
    print(_table(rows, [("plan", "plan"), ("replicas", "replicas"), ("out tok/s per replica", "tok_s"),
                        ("tokens per $", "tok_usd"), ("$/day", "usd_day"), ("$/1M out", "out_1m"),
                        ("one request, min", "latency")]))
    return 0


def _traffic(a) -> list[float] | None:
    """The day's hourly rates from --traffic (peak --rate) or --traffic-csv; None for a constant rate."""
    if a.traffic and a.traffic_csv:
        raise planner.PlanError("traffic", "give either --traffic or --traffic-csv, not both")
    if a.traffic_csv:
        try:
            data = Path(a.traffic_csv).read_bytes()
        except OSError as e:
            raise planner.PlanError("traffic-csv", f"cannot read {a.traffic_csv}: {e.strerror}") from None
        return traffic.from_csv(data)
    return traffic.shape(a.traffic, a.rate, a.peak_to_trough) if a.traffic else None


def _day_text(day, a) -> str:
    """A day of traffic: the fleet sized for the peak against the autoscaled one."""
    what = f"{a.traffic} traffic" if a.traffic else f"the day in {a.traffic_csv}"
    saved = day.peak_usd_per_month - day.auto_usd_per_month
    miss = (", ".join(f"hour {h} ({day.missed_minutes[h]:.0f} min)" for h in day.missed_hours)
            or "none")
    return "\n".join([
        f"a day of {what} (peak {max(day.rates):g} req/s, lowest {min(day.rates):g}) on {day.plan}: "
        f"{day.capacity_per_replica:.3g} req/s per replica of {day.gpus_per_replica} GPU(s) at the SLOs",
        f"  sized for the peak: {day.peak_replicas} replica(s) all day = {day.peak_gpu_hours:,.0f} GPU-hours/day, "
        f"${day.peak_usd_per_month:,.0f}/month",
        f"  autoscaled (min {a.min_replicas}, max {a.max_replicas or 'none'}, {a.scale_up_min:g} min to scale up): "
        f"{day.auto_gpu_hours:,.0f} GPU-hours/day, ${day.auto_usd_per_month:,.0f}/month, "
        f"{'saving' if saved >= 0 else 'costing'} ${abs(saved):,.0f}/month "
        f"({abs(saved) / day.peak_usd_per_month:.0%}) against the peak-sized fleet",
        "  replicas by hour: " + " ".join(str(n) for n in day.auto_replicas),
        f"  SLO missed while scaling up: {miss}",
        *[f"  {n}" for n in day.notes]])


def _savings_text(sv) -> str:
    """The waterfall as text: the answer, one row per step, each step's cause, the band."""
    rows = [{"step": s.step, "plan": (s.plan.label if s.plan else "none") + ("" if s.taken else " (not taken)"),
             "usd_month": _f(s.usd_per_month, 0), "change": "" if i == 0 else f"{s.delta_usd_per_month:+,.0f}",
             "band": (f"{s.low_usd_per_month:,.0f}-{s.high_usd_per_month:,.0f}"
                      if s.low_usd_per_month is not None and s.high_usd_per_month is not None else ""),
             "out_1m": _f(s.plan.usd_per_1m_output, 3) if s.plan and s.plan.feasible else "",
             "gpus": (s.plan.gpus_total or "") if s.plan else ""} for i, s in enumerate(sv.steps)]
    out = [f"the answer on {sv.gpu}: {sv.headline}",
           _table(rows, [("step", "step"), ("plan", "plan"), ("GPUs", "gpus"), ("$/month", "usd_month"),
                         ("change", "change"), ("band $/month", "band"), ("$/1M out", "out_1m")])]
    out += [f"  {s.step}: {s.cause}" for s in sv.steps]
    out += [f"  {n}" for n in sv.notes]
    return "\n".join(out)


# ------------------------------------------------------------------ entry

def run(args, stored_runs: StoreReader | None = None, stored_gpu_overrides: StoreReader | None = None) -> int:
    """Execute the `plan` subcommand; returns the exit status."""
    a = args
    try:
        return _run(a, stored_runs, stored_gpu_overrides)
    except planner.PlanError as e:
        if getattr(a, "json", False):
            print(json.dumps(e.to_dict(), indent=1))
        else:
            print("error: invalid plan input", file=sys.stderr)
            for f, m in e.problems:
                print(f"  {f}: {m}", file=sys.stderr)
        return 2
    except CatalogError as e:
        print("error: invalid GPU overrides", file=sys.stderr)
        for f, m in e.problems:
            print(f"  {f}: {m}", file=sys.stderr)
        return 2


def _models(a) -> tuple[dict, list[str]]:
    """The catalog, plus the --model-config shape (first, so its name wins), and that file's notes;
    sets a.model to the model to plan."""
    models = shapes.load_models()
    if not a.model_config:
        a.model = a.model or "default"
        return models, []
    if a.model:
        raise planner.PlanError("model-config", f"give either --model ({a.model}) or --model-config, not both")
    notes: list[str] = []
    try:
        shape = hf_config.shape_from_hf_config_file(a.model_config, notes=notes)
    except shapes.ShapeError as e:
        raise planner.PlanError("model-config", str(e)) from None
    a.model = shape.name
    return {shape.name: shape, **{k: m for k, m in models.items() if k != shape.name}}, notes


def _run(a, stored_runs: StoreReader | None, stored_gpu_overrides: StoreReader | None) -> int:
    models, config_notes = _models(a)
    for n in config_notes:
        print(f"note: {n}", file=sys.stderr)
    if a.models_table:
        rows = [{"model": m.name, "params": f"{shapes.param_count(m) / 1e9:.2f}B",
                 "active": f"{shapes.param_count(m, True) / 1e9:.2f}B",
                 "bf16_GB": f"{shapes.weight_bytes(m, 'bf16') / 1e9:.2f}",
                 "int8_GB": f"{shapes.weight_bytes(m, 'int8') / 1e9:.2f}",
                 "int4_GB": f"{shapes.weight_bytes(m, 'int4') / 1e9:.2f}",
                 "kv_KB_tok": f"{shapes.kv_bytes_per_token(m) / 1024:.0f}", "context": m.max_context,
                 "hf_id": m.hf_id} for m in models.values()]
        print(json.dumps(rows, indent=1) if a.json else _table(rows, [(k, k) for k in rows[0]]))
        return 0
    if a.refit:
        table = fit.refit()
        print(f"wrote {fit.write_fit(table)}\n")
        print(fit.fit_table_markdown(table))
        return 0
    if a.check_published:
        rows = fit.check_with_loo()
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            print(planner.published_table_markdown(rows))
            print("\n" + fit.summary_line(rows))
            for r in rows:
                if r.get("excluded"):
                    print(f"excluded {r['id']}: {r['excluded']}")
        return 0
    records = _load_records(a.records, None if a.no_store else stored_runs)
    cal = planner.calibrate(records) if records else None
    probe = {"mem_bw_gbs": cal.machine_bw_gbs} if cal and cal.machine_bw_gbs else None
    gpus = load_gpus(_overrides(a, stored_gpu_overrides), probe)
    if a.check_load:
        rows = selfcheck.check_load(records, probe, held_out=not a.in_sample)
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            print(selfcheck.check_load_markdown(rows))
            ok = sum(r["within"] for r in rows)
            held = sum(r["sample"] == "held out" for r in rows)
            print(f"\n{ok} of {len(rows)} load point(s) within {selfcheck.TOLERANCE:.0%}; {held} of them predicted "
                  "by a model calibrated on the other records (held out), the rest in-sample")
        return 0
    if a.gpus_table:
        rows = price_table(gpus)
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                r["spread"] = f"{r['spread']:.1f}x" if r["spread"] else ""
                r["usd_month"] = f"{r['usd_per_month']:,.0f}"
                r["source"] = r["source"][:90]
            print(_table(rows, [("GPU", "gpu"), ("$/hr", "usd_per_hr"), ("low", "low"), ("high", "high"),
                                ("spread", "spread"), ("$/month", "usd_month"), ("date", "date"),
                                ("origin", "origin"), ("source", "source")]))
        return 0
    if a.calibration:
        if cal is None:
            print("no run records: pass --records FILE or run the lab first")
            return 1
        print(json.dumps(cal.to_dict(), indent=1))
        return 0
    if a.sweep or a.packing:
        try:
            model = shapes.get_model(a.model, models)
        except shapes.ShapeError:
            raise planner.PlanError("model", f"unknown model '{a.model}'; known: {', '.join(models)}") from None
        return _sweep_or_packing(a, model, gpus, models, cal)
    if a.batch_job is not None:
        return _batch_job(a, gpus, models)
    if a.fleet is not None:
        return _fleet(a, gpus, models)
    rates = _traffic(a)
    w = planner.Workload(
        model=a.model, request_rate=max(rates) if rates else a.rate, input_tokens=a.input, output_tokens=a.output,
        ttft_p90_s=a.ttft, tpot_p90_s=a.tpot, gpus=a.gpus, precisions=a.precisions, tp_options=a.tp,
        spec=a.spec, acceptance_rate=a.acceptance, gamma=a.gamma, draft_kind=a.draft_kind,
        draft_model=a.draft_model, family=a.family, kv_dtype=a.kv_dtype, group_size=a.group_size,
        quantize_head=a.quantize_head, price_overrides=dict(a.price) or None,
        price_column={"reference": "price_usd_per_hr", "low": "price_low_usd_per_hr",
                      "high": "price_high_usd_per_hr"}[a.prices])
    res, sv = plan_with_savings(w, gpus, models, cal)  # one search: the savings and the plans below agree
    model = res.model
    day = None
    if rates and sv is not None and sv.best is not None:
        day = traffic.day_for_plan(sv.best, rates, traffic.Autoscale(a.min_replicas, a.max_replicas, a.scale_up_min))
    if a.json:
        d = res.to_dict()
        d["savings"] = sv.to_dict() if sv else None
        d["day"] = day.to_dict() if day else None
        if not a.all:
            d["plans"] = [p for p in d["plans"] if p["feasible"]][: a.top] or d["plans"][: a.top]
        print(json.dumps(d, indent=1, default=str))
        return 0 if res.best else 1
    print(f"{model.name}: {w.request_rate:g} req/s, {w.input_tokens} in / {w.output_tokens} out tokens, "
          f"SLO p90 TTFT {w.ttft_p90_s * 1e3:.0f} ms, TPOT {w.tpot_p90_s * 1e3:.1f} ms "
          f"({a.prices} prices, {w.family} kernels)\n")
    if sv is not None:
        print(_savings_text(sv) + "\n")
    if day is not None:
        print(_day_text(day, a) + "\n")
    feas = res.feasible[: a.top]
    if feas:
        print("every plan that meets the SLOs, cheapest first:")
        print(_table(_plan_rows(feas), _PLAN_COLS))
    else:
        print("no feasible plan.")
    if a.all or not feas:
        infeas = [p for p in res.plans if not p.feasible][: max(a.top, 20)]
        print("\ninfeasible:")
        print(_table(_plan_rows(infeas), [("plan", "plan"), ("why not", "why_not")]))
        sugg = sorted({s for p in infeas for s in p.suggestions})
        for s in sugg:
            print(f"  try: {s}")
    print()
    for n in res.notes:
        print(f"note: {n}")
    assumptions = sorted({x for p in feas for x in p.assumptions})
    for x in assumptions:
        print(f"assumption: {x}")
    if a.why and res.best:
        print(f"\nwhy {res.best.label}:")
        print(_table([{"term": y.term, "value": _f(y.value, 3) if isinstance(y.value, (int, float)) else y.value,
                       "unit": y.unit, "formula": y.formula[:120]} for y in res.best.why],
                     [("term", "term"), ("value", "value"), ("unit", "unit"), ("formula", "formula")]))
    return 0 if res.best else 1


def _sweep_or_packing(a, model, gpus, models, cal) -> int:
    name = a.sweep or a.packing
    g = find_gpu(name, gpus)
    if g is None:
        raise planner.PlanError("gpu", f"unknown GPU '{name}'; known: {', '.join(gpus)}")
    precs = a.precisions or list(shapes.PRECISIONS)
    # The same checks as a plan's (lengths, precisions, TP, speculation), before any arithmetic.
    w = planner.Workload(model=model.name, request_rate=1, input_tokens=a.input, output_tokens=a.output,
                         precisions=a.precisions, tp_options=a.tp, acceptance_rate=a.acceptance, gamma=a.gamma,
                         draft_kind=a.draft_kind, draft_model=a.draft_model, family=a.family)
    w.validate(models, gpus)
    if a.packing:
        rows = planner.packing(model, g, precs, context_tokens=a.input + a.output)
        if a.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                r["weights_gb"], r["per_replica_gb"] = _f(r["weights_gb"]), _f(r["per_replica_gb"])
            print(f"replicas of {model.name} per {g.name} (each with KV for one {a.input + a.output}-token request):")
            print(_table(rows, [("precision", "precision"), ("replicas", "replicas"), ("weights GB", "weights_gb"),
                                ("per replica GB", "per_replica_gb"), ("runnable", "runnable")]))
        return 0
    ctx = a.context or a.input + a.output // 2
    sc, dm = planner.choose_spec(w, model, models, cal) if a.spec != "off" else (None, None)
    rows = planner.batch_sweep(model, g, precs, a.batches, ctx, sc, dm, tp=(a.tp or [1])[0], family=a.family,
                               calibration=cal)
    summary = planner.crossovers(rows)
    if a.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
        return 0
    for r in rows:
        for k in ("step_ms", "tpot_ms", "spec_tpot_ms"):
            if k in r:
                r[k] = _f(r[k], 2)
        r["tok_s"] = _f(r["tok_s"], 0)
        for k in ("spec_speedup", "speedup_vs_first_precision"):
            if k in r:
                r[k] = f"{r[k]:.2f}x"
    cols = [("batch", "batch"), ("precision", "precision"), ("step ms", "step_ms"), ("tok/s", "tok_s"),
            ("bound", "bound"), ("vs " + precs[0], "speedup_vs_first_precision"), ("fits KV", "fits")]
    if sc is not None:
        cols += [("spec TPOT ms", "spec_tpot_ms"), ("spec speedup", "spec_speedup")]
        print(f"speculation: {sc.draft_kind} {sc.draft_model or ''} g={sc.gamma} a={sc.acceptance_rate:.2f} "
              f"({sc.source})")
    print(f"{model.name} decode on {g.name}, context {ctx} tokens:")
    print(_table(rows, cols))
    for line in summary:
        print(f"  {line}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.planner.cli")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
