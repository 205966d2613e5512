"""`python -m engine load --url URL`: a load test of any OpenAI-compatible endpoint, stored as `load` records."""
from __future__ import annotations

import argparse
import json
import sys

from engine.load.profiles import PROFILE_HELP, SLO_HELP


def add_parser(subparsers, ray_sender=None) -> argparse.ArgumentParser:
    """Register the `load` subcommand; `ray_sender(address, clients)` (engine.cluster.load_sender, passed in by
    engine/__main__.py: load may not import the cluster package) gives the Ray clients of `--ray`."""
    p = subparsers.add_parser(
        "load", help="load-test an OpenAI-compatible endpoint (TTFT, ITL, throughput, goodput under SLOs)",
        description="Send a workload to an OpenAI-compatible server under a load profile, timed on the client; "
                    "each load point becomes a `load` run record in the lab's store.")
    p.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--profile", default="concurrent:1", help=PROFILE_HELP + " (default concurrent:1)")
    p.add_argument("--slo", default=None, help=SLO_HELP)
    p.add_argument("--slo-attainment", type=float, default=0.9,
                   help="share of requests that must meet the SLO for a load point to meet it (default 0.9)")
    p.add_argument("--workload", default=None,
                   help="workload spec (default chat:16): chat, code, edit, ... with counts; or multiturn:N[:TURNS], "
                        "N ShareGPT conversations replayed turn by turn (default 8 of 4 turns)")
    p.add_argument("--input-len", type=int, default=None, help="fixed prompt length in tokens (instead of a workload)")
    p.add_argument("--output-len", type=int, default=None, help="fixed output length in tokens")
    p.add_argument("--prompt-kind", default="random", choices=["random", "text"],
                   help="fixed lengths: random token ids (completions) or repeated text")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per load point (default: the workload's size)")
    p.add_argument("--max-output-len", type=int, default=256, help="cap on a workload answer's length (tokens)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context per request (default: what the server says)")
    p.add_argument("--tokenizer", default="default-draft", help="catalog name or tokenizer folder (client-side counts)")
    p.add_argument("--served-model", default=None, help="the model name to send (default: the first of /v1/models)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0, help="requests sent before the measured window and dropped")
    p.add_argument("--max-seconds", type=float, default=600.0, help="no request is sent after this (per point)")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds before one request is cut")
    p.add_argument("--generator", default="lab", choices=["lab", "guidellm"],
                   help="who sends the load: the lab's client, or GuideLLM from .venv-guidellm (`make guidellm`)")
    p.add_argument("--label", default=None, help="what is being measured, for the table (default: the URL)")
    p.add_argument("--ray", default=None, metavar="ADDRESS|auto|local",
                   help="send the load from Ray actors on this cluster (docs/CLUSTER.md)")
    p.add_argument("--clients", type=int, default=1, help="with --ray: load clients, each sending its share")
    p.add_argument("--no-store", action="store_true", help="do not save the records")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.set_defaults(fn=cmd_load, ray_sender=ray_sender)
    return p


def cmd_load(a) -> int:
    from engine.load.run import LoadConfig, run, sweep_result
    from engine.measure.store import Store
    from engine.present.load_view import load_columns, load_rows
    from engine.present.printers import format_rows

    fixed = a.input_len is not None or a.output_len is not None
    cfg = LoadConfig(url=a.url, profile=a.profile, slo=a.slo, slo_attainment=a.slo_attainment,
                     workload=None if fixed and a.workload is None else (a.workload or "chat:16"),
                     input_len=a.input_len, output_len=a.output_len, prompt_kind=a.prompt_kind, requests=a.requests,
                     max_output_len=a.max_output_len, max_model_len=a.max_model_len, tokenizer=a.tokenizer,
                     served_model=a.served_model, temperature=a.temperature, seed=a.seed, warmup=a.warmup,
                     max_seconds=a.max_seconds, request_timeout_s=a.request_timeout,
                     server={"label": a.label} if a.label else {}, generator=a.generator)
    cfg.validate()  # bad profiles and SLOs fail before anything is sent
    send = _ray_sender(a)
    try:
        recs = run(cfg, None if a.no_store else Store(), progress=lambda s: print(f"[{s}]", file=sys.stderr),
                   send=send)
    finally:
        if send is not None:
            send.close()
    if a.json:
        print(json.dumps([r.to_dict() for r in recs], indent=1))
        return 0
    table = load_rows(recs)
    print(format_rows(table, "md", load_columns(table)))
    if cfg.parsed_profile().kind == "sweep":
        res = sweep_result(recs)
        print(f"\nhighest rate meeting the SLO ({cfg.parsed_slo().label}): "
              f"{res['max_rate_meeting_slo'] if res['max_rate_meeting_slo'] is not None else 'none'} requests/s")
    return 0 if all(r.metrics["load"]["completed"] for r in recs) else 1


def _ray_sender(a):
    """The Ray clients --ray/--clients ask for, or None (this process is the one client)."""
    from engine.common.errors import UserError
    from engine.measure.conversations import is_multiturn

    if a.ray is None:
        if a.clients != 1:
            raise UserError(f"--clients {a.clients} needs a Ray cluster to run the clients on",
                            "add --ray local (this machine), --ray auto or --ray HOST:6379")
        return None
    if a.generator != "lab":
        raise UserError("--ray runs the lab's own client on the cluster, not GuideLLM", "drop --generator guidellm")
    if is_multiturn(a.workload):
        raise UserError("Ray's clients split the requests, not the conversations", "drop --ray for a multi-turn load")
    if getattr(a, "ray_sender", None) is None:
        raise UserError("--ray is not available from this entry point", "run it as `python -m engine load --ray ...`")
    return a.ray_sender(a.ray, a.clients)
