"""`python -m engine plan`: the cost & capacity planner on the command line.

    plan [options]             GPUs, precision and speculation for a workload, ranked by cost
    plan fleet M:RATE,...      several models on one GPU kind (--gpus): one model per GPU against shared GPUs
    plan batch-job TOKENS      TOKENS output tokens a day within --deadline hours, no latency SLO
    plan sweep GPU             decode cost against batch per precision, with and without speculation
    plan packing GPU           replicas of the model that fit on one GPU, per precision
    plan check published|load  predictions against published measurements (with the fit's leave-one-out
                               errors), or against this machine's own load records of the lab's server
    plan refit                 rewrite data/efficiency_fit.csv from data/published_measurements.csv (developers)
    plan tables gpus|models|calibration

Parsing and dispatch only: the arithmetic is engine.planner's, the text engine.present.plan_text's. The lab's
store is the caller's: engine/__main__.py passes `stored_runs` (run records as plain dicts) and
`stored_gpu_overrides` to `add_parser`; without them (tests) only --records and --overrides files count.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Callable

from engine import planner
from engine.common.cli_args import csv_list, int_list
from engine.common.errors import UserError
from engine.common.paths import REPO_ROOT
from engine.common.vocab import KLD_STATS
from engine.planner import batchjob, efficiency, fit, fleet, hf_config, selfcheck, shapes, traffic
from engine.planner.day_policy import plan_day
from engine.planner.gpus import CatalogError, find_gpu, load_gpus, price_table
from engine.planner.savings import plan_with_savings
from engine.planner.speculation import SPEC_DRAFT_KINDS
from engine.present import plan_text as text

StoreReader = Callable[[], list]  # () -> list of plain dicts read from the lab's store

# The modes that were flags before they were subcommands: a script still using one is told the new form.
MOVED = {"--fleet": "plan fleet MODEL:RATE,... --gpus GPU", "--batch-job": "plan batch-job TOKENS_PER_DAY",
         "--sweep": "plan sweep GPU", "--packing": "plan packing GPU", "--check-published": "plan check published",
         "--check-load": "plan check load", "--refit": "plan refit", "--gpus-table": "plan tables gpus",
         "--models-table": "plan tables models", "--calibration": "plan tables calibration"}


def _price(s: str) -> tuple[str, float]:
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"expected GPU=USD_PER_HR, got '{s}'")
    k, v = s.rsplit("=", 1)
    try:
        return k.strip(), float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"price in '{s}' is not a number") from None


class _Moved(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is a subcommand now: python -m engine {MOVED[option_string]}")


# ------------------------------------------------------------------ options

def _model_options(p, default) -> None:
    """The model and request shape; `default` is argparse.SUPPRESS on a subcommand, so options given before
    the subcommand's name are kept."""
    def d(v):
        return v if default is None else default

    p.add_argument("--model", default=d(None), help="catalog model (plan tables models); default: the lab's default")
    p.add_argument("--model-config", default=d(None), metavar="CONFIG_JSON",
                   help="plan any model from its Hugging Face config.json instead of a catalog model "
                        f"(model types: {', '.join(hf_config.HF_MODEL_TYPES)})")
    p.add_argument("--input", type=int, default=d(512), help="prompt tokens per request (default 512)")
    p.add_argument("--output", type=int, default=d(256), help="output tokens per request (default 256)")
    p.add_argument("--ttft", type=float, default=d(2.0), help="p90 time-to-first-token SLO, seconds (default 2)")
    p.add_argument("--tpot", type=float, default=d(0.05), help="p90 per-token latency SLO, seconds (default 0.05)")
    p.add_argument("--gpus", type=csv_list, default=d(None), help="comma-separated GPU names (default: all shipped)")
    p.add_argument("--precisions", type=csv_list, default=d(None),
                   help=f"comma-separated: {','.join(shapes.PLAN_PRECISIONS)} (fp4: Blackwell only, never by default)")
    p.add_argument("--tp", type=int_list, default=d(None), help="tensor-parallel sizes to try (default 1,2,4,8)")
    p.add_argument("--spec", choices=["auto", "on", "off"], default=d("auto"), help="speculative decoding plans")
    p.add_argument("--acceptance", type=float, default=d(None), help="draft acceptance rate (default: measured)")
    p.add_argument("--gamma", type=int, default=d(None), help="draft tokens per round (default 4 or measured)")
    p.add_argument("--draft-kind", choices=list(SPEC_DRAFT_KINDS), default=d(None))
    p.add_argument("--draft-model", default=d(None), help="draft model (default: the family's smallest)")
    p.add_argument("--family", default=d("serving"), choices=list(planner.FAMILIES), help="kernel family")
    p.add_argument("--kv-dtype", default=d("bf16"), choices=list(shapes.KV_DTYPES))
    p.add_argument("--group-size", type=int, default=d(64), help="int4 group size")
    p.add_argument("--max-kld", type=float, default=d(None), metavar="NATS",
                   help="quality budget: only configurations whose measured KLD (--kld-stat) against the fp32 "
                        "reference is at most this (nats/token; from the lab's quality records)")
    p.add_argument("--kld-stat", choices=list(KLD_STATS), default=d("mean"),
                   help="which statistic of per-position KLD --max-kld limits: the mean (llama.cpp's; a few outlier "
                        "positions move it), the median (a typical token) or the 99th percentile (the tail)")
    p.add_argument("--max-pass-drop", type=float, default=d(None), metavar="POINTS",
                   help="quality budget: only configurations whose HumanEval pass@1, paired against the fp32 run, "
                        "drops at most this many points (from the lab's accuracy records)")
    p.add_argument("--quantize-head", action="store_true", default=d(False), help="quantize the output head too")
    p.add_argument("--price", type=_price, action="append", default=d([]), metavar="GPU=USD",
                   help="price override for this plan, e.g. --price 'H100 SXM=2.49' (repeatable)")
    p.add_argument("--prices", choices=["reference", "low", "high"], default=d("reference"),
                   help="which price column: reference on-demand, cheapest or dearest provider")
    p.add_argument("--overrides", default=d(None), help="JSON file: list of GPU override dicts (see load_gpus)")
    p.add_argument("--records", action="append", default=d([]),
                   help="JSON/JSONL file of lab run records for calibration and acceptance (repeatable)")
    p.add_argument("--no-store", action="store_true", default=d(False),
                   help="ignore the lab's SQLite store (its overrides and runs)")
    p.add_argument("--top", type=int, default=d(12), help="rows to show (default 12)")
    p.add_argument("--json", action="store_true", default=d(False), help="print JSON instead of tables")


def add_parser(subparsers, stored_runs: StoreReader | None = None,
               stored_gpu_overrides: StoreReader | None = None) -> argparse.ArgumentParser:
    """Register `plan` and its subcommands. `stored_runs` and `stored_gpu_overrides` read the lab's store (called
    only without --no-store)."""
    p = subparsers.add_parser(
        "plan", help="GPUs, precision and speculation for a workload, ranked by cost",
        description="Project the lab's measurements onto production GPUs: GPUs needed, $/1M tokens, $/month. "
                    "Without a subcommand: the plan for one workload.")
    _model_options(p, None)
    p.add_argument("--rate", type=float, default=1.0, help="requests per second (default 1)")
    p.add_argument("--traffic", default=None, choices=list(traffic.SHAPES),
                   help="a day of traffic peaking at --rate: a fleet sized for the peak and an autoscaled one")
    p.add_argument("--peak-to-trough", type=float, default=4.0, help="diurnal traffic: peak / trough (default 4)")
    p.add_argument("--traffic-csv", default=None, metavar="CSV",
                   help="the day as a CSV of hour,rate (24 rows, requests/s); its busiest hour is the rate planned")
    p.add_argument("--min-replicas", type=int, default=1, help="autoscaler floor (default 1)")
    p.add_argument("--max-replicas", type=int, default=None, help="autoscaler ceiling (default none)")
    p.add_argument("--scale-up-min", type=float, default=5.0, help="minutes a new replica takes to serve (default 5)")
    p.add_argument("--all", action="store_true", help="show infeasible plans too")
    p.add_argument("--why", action="store_true", help="print the formula breakdown of the best plan")
    for flag in MOVED:
        p.add_argument(flag, nargs="?", action=_Moved, help=argparse.SUPPRESS)
    p.set_defaults(fn=functools.partial(run, stored_runs=stored_runs, stored_gpu_overrides=stored_gpu_overrides),
                   mode=None)
    modes = p.add_subparsers(dest="mode", metavar="{fleet,batch-job,sweep,packing,check,refit,tables}")

    def mode(name: str, help: str) -> argparse.ArgumentParser:
        m = modes.add_parser(name, help=help, description=help)
        _model_options(m, argparse.SUPPRESS)
        return m

    m = mode("fleet", "several models on one GPU kind (--gpus): one model per GPU against sharing GPUs")
    m.add_argument("fleet", metavar="MODEL:RATE,...",
                   help="each model at RATE req/s with --input/--output/--ttft/--tpot")
    m = mode("batch-job", "a batch job: this many output tokens a day, no latency SLO, within --deadline")
    m.add_argument("batch_job", type=float, metavar="TOKENS_PER_DAY")
    m.add_argument("--deadline", type=float, default=8.0, help="hours each day's tokens must finish in (default 8)")
    m = mode("sweep", "decode cost against batch on one GPU, per precision, with and without speculation")
    m.add_argument("gpu", metavar="GPU")
    m.add_argument("--batches", type=int_list, default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    m.add_argument("--context", type=int, default=None, help="context tokens (default input + output/2)")
    m = mode("packing", "replicas of the model that fit on one GPU, per precision")
    m.add_argument("gpu", metavar="GPU")
    m = mode("check", "predictions against published measurements, or this machine's load records")
    m.add_argument("check", choices=["published", "load"])
    m.add_argument("--in-sample", action="store_true",
                   help="load: calibrate on every record, the predicted point included (the default holds each point "
                        "out of its own fit)")
    mode("refit", "rewrite data/efficiency_fit.csv from the published measurements and docs/PLANNER.md's "
                  "generated tables (developers)")
    m = mode("tables", "the GPU catalog and prices, the catalog models' shapes, or the calibration fit")
    m.add_argument("table", choices=["gpus", "models", "calibration"])
    return p


# ------------------------------------------------------------------ what the modes read

def _from_store(read: StoreReader | None) -> list[dict]:
    """What a store reader returns; nothing when there is none, or when the store is broken (a broken store must
    not stop planning)."""
    if read is None:
        return []
    try:
        return list(read() or [])
    except Exception:
        return []


def _read_records(paths: list[str]) -> list[dict]:
    recs: list[dict] = []
    for path in paths:
        body = Path(path).read_text()
        try:
            data = json.loads(body)
            recs += data if isinstance(data, list) else [data]
        except ValueError:
            for i, line in enumerate(body.splitlines(), 1):
                if line.strip():
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        raise UserError(f"{path} line {i} is not JSON", "pass a JSON list or JSONL of run records")
    return recs


class Inputs:
    """What a mode reads, each read once when first asked for: the models (catalog, plus --model-config), the run
    records (files, then the store), their calibration, and the GPU catalog with its overrides."""

    def __init__(self, a, stored_runs: StoreReader | None, stored_gpu_overrides: StoreReader | None):
        self.a, self._runs, self._overrides = a, stored_runs, stored_gpu_overrides

    @functools.cached_property
    def models(self) -> dict:
        """The catalog, with the --model-config shape first (so its name wins); sets a.model to the one planned."""
        a, models = self.a, shapes.load_models()
        if not a.model_config:
            a.model = a.model or "default"
            return models
        if a.model:
            raise planner.PlanError("model-config", f"give either --model ({a.model}) or --model-config, not both")
        notes: list[str] = []
        try:
            shape = hf_config.shape_from_hf_config_file(a.model_config, notes=notes)
        except shapes.ShapeError as e:
            raise planner.PlanError("model-config", str(e)) from None
        for n in notes:
            print(f"note: {n}", file=sys.stderr)
        a.model = shape.name
        return {shape.name: shape, **{k: m for k, m in models.items() if k != shape.name}}

    @functools.cached_property
    def records(self) -> list[dict]:
        return _read_records(self.a.records) + _from_store(None if self.a.no_store else self._runs)

    @functools.cached_property
    def calibration(self):
        return planner.calibrate(self.records) if self.records else None

    @functools.cached_property
    def probe(self) -> dict | None:
        cal = self.calibration
        return {"mem_bw_gbs": cal.machine_bw_gbs} if cal and cal.machine_bw_gbs else None

    @functools.cached_property
    def gpus(self) -> dict:
        a, probe = self.a, self.probe  # the records first: their machine bandwidth is the CPU entry's
        ov: list[dict] = _from_store(None if a.no_store else self._overrides)
        if a.overrides:
            data = json.loads(Path(a.overrides).read_text())
            if not isinstance(data, list):
                raise UserError(f"{a.overrides} must hold a JSON list of override dicts", "see load_gpus' docstring")
            ov += data
        return load_gpus(ov, probe)

    @property
    def model_name(self) -> str:
        """The model planned: --model, the --model-config's name, or the lab's default."""
        self.models.keys()  # reading the models settles a.model
        return self.a.model

    def model(self):
        models = self.models
        try:
            return shapes.get_model(self.a.model, models)
        except shapes.ShapeError:
            raise planner.PlanError("model", f"unknown model '{self.a.model}'; known: {', '.join(models)}") from None

    def workload(self, rate: float) -> planner.Workload:
        """The workload the options describe (its checks run in the planner)."""
        a = self.a
        return planner.Workload(
            model=self.model_name, request_rate=rate, input_tokens=a.input, output_tokens=a.output, ttft_p90_s=a.ttft,
            tpot_p90_s=a.tpot, gpus=a.gpus, precisions=a.precisions, tp_options=a.tp, spec=a.spec,
            acceptance_rate=a.acceptance, gamma=a.gamma, draft_kind=a.draft_kind, draft_model=a.draft_model,
            family=a.family, kv_dtype=a.kv_dtype, group_size=a.group_size, quantize_head=a.quantize_head,
            max_kld=a.max_kld, max_pass_drop=a.max_pass_drop, kld_stat=a.kld_stat,
            price_overrides=dict(a.price) or None,
            price_column={"reference": "price_usd_per_hr", "low": "price_low_usd_per_hr",
                          "high": "price_high_usd_per_hr"}[a.prices])


def _print_json(d) -> None:
    print(json.dumps(d, indent=1, default=str))


# ------------------------------------------------------------------ the modes

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


def plan_mode(a, x: Inputs) -> int:
    """One workload: the savings against bf16 and every plan, from one search (so they agree)."""
    rates = _traffic(a)
    w = x.workload(max(rates) if rates else a.rate)
    res, sv = plan_with_savings(w, x.gpus, x.models, x.calibration)
    autoscale = traffic.Autoscale(a.min_replicas, a.max_replicas, a.scale_up_min)
    day, policy = plan_day(res, sv.best, rates, autoscale) if rates and sv is not None and sv.best else (None, None)
    if a.json:
        d = res.to_dict()
        d["savings"] = sv.to_dict() if sv else None
        d["day"] = day.to_dict() if day else None
        d["day_policy"] = policy.to_dict() if policy else None
        if not a.all:
            d["plans"] = [p for p in d["plans"] if p["feasible"]][: a.top] or d["plans"][: a.top]
        _print_json(d)
    else:
        what = f"{a.traffic} traffic" if a.traffic else f"the day in {a.traffic_csv}"
        day_lines = text.day_text(day, what, autoscale) + "\n" + text.policy_text(policy) if day else None
        print(text.plan_text(w, res, sv, day_lines, a.prices, a.top, a.all, a.why))
    return 0 if res.best else 1


def fleet_mode(a, x: Inputs) -> int:
    items = fleet.parse_fleet(a.fleet, a.input, a.output, a.ttft, a.tpot)
    if not a.gpus or len(a.gpus) != 1:
        raise planner.PlanError("gpus", "a fleet plans on one GPU kind: give --gpus with one GPU")
    fp = fleet.plan_fleet(items, a.gpus[0], x.gpus, x.models, a.precisions or ("bf16", "fp8", "int8", "int4"))
    if a.json:
        _print_json(fp.to_dict())
    else:
        print(text.fleet_text(fp, items))
    return 0


def batch_job_mode(a, x: Inputs) -> int:
    models = x.models
    job = batchjob.BatchJob(x.model_name, a.batch_job, a.input, a.output, a.deadline, a.gpus, a.precisions,
                            tuple(a.tp or (1, 2, 4, 8)))
    bp = batchjob.plan_batch(job, x.gpus, models)
    if a.json:
        d = bp.to_dict()
        d["options"] = d["options"][: a.top]
        _print_json(d)
    else:
        print(text.batch_text(bp, job, a.top))
    return 0 if bp.best else 1


def _gpu_and_checked(a, x: Inputs):
    """The model and GPU of a sweep or packing, with a plan's checks (lengths, precisions, TP, speculation) run
    before any arithmetic."""
    model, g = x.model(), find_gpu(a.gpu, x.gpus)
    if g is None:
        raise planner.PlanError("gpu", f"unknown GPU '{a.gpu}'; known: {', '.join(x.gpus)}")
    w = planner.Workload(model=model.name, request_rate=1, input_tokens=a.input, output_tokens=a.output,
                         precisions=a.precisions, tp_options=a.tp, acceptance_rate=a.acceptance, gamma=a.gamma,
                         draft_kind=a.draft_kind, draft_model=a.draft_model, family=a.family)
    w.validate(x.models, x.gpus)
    return model, g, w


def packing_mode(a, x: Inputs) -> int:
    model, g, _ = _gpu_and_checked(a, x)
    rows = planner.packing(model, g, a.precisions or list(shapes.PRECISIONS), context_tokens=a.input + a.output)
    print(json.dumps(rows, indent=1) if a.json else text.packing_text(rows, model, g, a.input + a.output))
    return 0


def sweep_mode(a, x: Inputs) -> int:
    model, g, w = _gpu_and_checked(a, x)
    precs = a.precisions or list(shapes.PRECISIONS)
    ctx = a.context or a.input + a.output // 2
    cal = x.calibration
    sc, dm = planner.choose_spec(w, model, x.models, cal) if a.spec != "off" else (None, None)
    rows = planner.batch_sweep(model, g, precs, a.batches, ctx, sc, dm, tp=(a.tp or [1])[0], family=a.family,
                               calibration=cal)
    summary = planner.crossovers(rows)
    if a.json:
        _print_json({"rows": rows, "summary": summary})
    else:
        print(text.sweep_text(rows, summary, model, g, ctx, precs, sc))
    return 0


def check_mode(a, x: Inputs) -> int:
    if a.check == "published":
        rows = fit.check_with_loo()
        if a.json:
            _print_json(rows)
            return 0
        print(planner.published_table_markdown(rows))
        print("\n" + fit.summary_line(rows))
        for r in rows:
            if r.get("excluded"):
                print(f"excluded {r['id']}: {r['excluded']}")
        return 0
    rows = selfcheck.check_load(x.records, x.probe, held_out=not a.in_sample)
    if a.json:
        _print_json(rows)
        return 0
    print(selfcheck.check_load_markdown(rows))
    ok = sum(r["within"] for r in rows)
    held = sum(r["sample"] == "held out" for r in rows)
    print(f"\n{ok} of {len(rows)} load point(s) within {selfcheck.TOLERANCE:.0%}; {held} of them predicted by a "
          "model calibrated on the other records (held out), the rest in-sample")
    return 0


def refit_mode(a, x: Inputs) -> int:
    table = fit.refit()
    print(f"wrote {fit.write_fit(table)}")
    efficiency.shipped_fit.cache_clear()
    print(f"wrote {fit.write_docs(table, fit.check_with_loo(), REPO_ROOT / 'docs' / 'PLANNER.md')}\n")
    print(fit.fit_table_markdown(table))
    return 0


def tables_mode(a, x: Inputs) -> int:
    if a.table == "models":
        rows = text.models_rows(x.models)
        print(json.dumps(rows, indent=1) if a.json else text.table(rows, [(k, k) for k in rows[0]]))
        return 0
    if a.table == "gpus":
        rows = price_table(x.gpus)
        print(json.dumps(rows, indent=1) if a.json else text.gpus_text(rows))
        return 0
    if x.calibration is None:
        print("no run records: pass --records FILE or run the lab first")
        return 1
    _print_json(x.calibration.to_dict())
    return 0


MODES = {None: plan_mode, "fleet": fleet_mode, "batch-job": batch_job_mode, "sweep": sweep_mode,
         "packing": packing_mode, "check": check_mode, "refit": refit_mode, "tables": tables_mode}


def run(args, stored_runs: StoreReader | None = None, stored_gpu_overrides: StoreReader | None = None) -> int:
    """Run `plan` or one of its subcommands; returns the exit status (2 for bad input, named field by field)."""
    try:
        return MODES[args.mode](args, Inputs(args, stored_runs, stored_gpu_overrides))
    except planner.PlanError as e:
        if getattr(args, "json", False):
            _print_json(e.to_dict())
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


def main(argv=None) -> int:
    """`plan` alone, as `python -m engine plan` runs it without the lab's store."""
    ap = argparse.ArgumentParser(prog="python -m engine")
    add_parser(ap.add_subparsers(dest="cmd", required=True))
    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
