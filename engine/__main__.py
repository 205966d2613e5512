"""`python -m engine`: a thin CLI over the same API the dashboard calls."""
from __future__ import annotations

import argparse
import json
import sys
import warnings

warnings.filterwarnings("ignore", message="The pynvml package is deprecated")

from engine.common.errors import UserError  # noqa: E402
from engine.common.cli_args import csv_list, int_list  # noqa: E402


def add_run_args(p: argparse.ArgumentParser, many: bool = False):
    p.add_argument("--model", default="default", help="catalog name (default, default-draft), folder or hub id")
    if many:
        p.add_argument("--precisions", type=csv_list, default=["fp32", "bf16", "int8", "int4"],
                       help="comma-separated: fp32,bf16,fp16,int8,int4,llm.int8,nf4,fp8; int4 may name its method "
                            "and group: int4-gptq, int4-awq-g32, int4-gptq-mixed (int4 alone is round-to-nearest)")
        p.add_argument("--drafts", type=csv_list, default=["none"],
                       help="comma-separated draft kinds: none,model,self,ngram,suffix")
        p.add_argument("--draft-precisions", type=csv_list, default=["int4"])
        p.add_argument("--gammas", type=int_list, default=[4])
        p.add_argument("--batch-sizes", type=int_list, default=[1])
    else:
        p.add_argument("--precision", default="fp32")
        p.add_argument("--draft", default="none", help="none, model, self, ngram or suffix")
        p.add_argument("--draft-precision", default="int4")
        p.add_argument("--gamma", type=int, default=4)
        p.add_argument("--batch", type=int, default=1)
    p.add_argument("--group-size", type=int, default=64, help="int4 group size: 32, 64 or 128")
    p.add_argument("--quantize-embeddings", action="store_true")
    p.add_argument("--no-quantize-head", action="store_true", help="keep the output head in float")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--draft-model", default="default-draft")
    p.add_argument("--adaptive-gamma", action="store_true", help="+2 after a fully accepted round, -1 otherwise")
    p.add_argument("--prompt", default=None, help="default: the prompts in data/prompts.json")
    p.add_argument("--workload", default=None, metavar="NAME[:N][,NAME[:N]]",
                   help="prompts from the lab's workloads instead of --prompt: chat, code, edit, summarize, translate, "
                        "each with a count (e.g. code:8,edit:8; a bare name takes 8)")
    p.add_argument("--reps", type=int, default=3 if many else 1,
                   help="repetitions of every prompt after the warm-up (intervals need 2 or more)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-chat", action="store_true", help="send the prompt raw, without the chat template")
    p.add_argument("--json", action="store_true", help="print run records as JSON")


def config_from(a, **over):
    from engine.measure.runs import RunConfig

    kw = dict(model=a.model, group_size=a.group_size, quantize_embeddings=a.quantize_embeddings,
              quantize_head=not a.no_quantize_head, device=a.device, draft_model=a.draft_model,
              adaptive_gamma=a.adaptive_gamma, prompt=a.prompt, workload=a.workload, reps=a.reps,
              max_new_tokens=a.max_new_tokens,
              temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed, chat=not a.no_chat)
    kw.update(over)
    return RunConfig.of(**kw)


def cmd_models(a) -> int:
    from engine.infer import catalog
    if a.fetch:
        for name in ("default-draft", "default"):
            path = catalog.resolve(name, progress=lambda s: print("  " + s, file=sys.stderr))
            print(f"{name}: {path}")
    from engine.present import format_rows

    print(format_rows(catalog.list_models(), "json" if a.json else "md"))
    return 0


def cmd_generate(a) -> int:
    from engine.measure.pool import ModelPool
    from engine.measure.runs import execute
    from engine.measure.store import Store

    cfg = config_from(a, precision=a.precision, draft=a.draft, draft_precision=a.draft_precision, gamma=a.gamma,
                      batch_size=a.batch, warmup=False, baseline=False)
    colors = {"accepted": "\033[32m", "bonus": "\033[34m", "resample": "\033[33m"}
    tty = sys.stdout.isatty() and not a.json

    def on_token(i, t, piece, origin):
        if i == 0 and not a.json:
            sys.stdout.write((colors.get(origin, "") + piece + "\033[0m") if tty else piece)
            sys.stdout.flush()

    cfg.validate()  # a bad workload is refused before a model loads
    rec = execute(cfg, ModelPool(keep=2), Store(), progress=lambda s: print(f"[{s}]", file=sys.stderr),
                  on_token=on_token, kind="generate")
    if a.json:
        print(rec.to_json(indent=1))
    else:
        print()
        _print_summary([rec])
    return 0


def _table(table, view: str, fmt: str) -> str:
    from engine.present import display_rows, format_rows, view_columns, with_bounds

    names = view_columns(table, view)
    if fmt == "md":  # median ± the interval's larger half; csv/json carry both ends as <name>_lo, <name>_hi
        return format_rows(display_rows(table, names), "md", names)
    return format_rows(table, fmt, with_bounds(names, table))


def _print_summary(recs, fmt="md", categories: bool = True):
    """The comparison table, the per-category table when a run had categories, and the noise verdicts."""
    from engine.present import category_rows, rows

    table = rows(recs)
    print(_table(table, "cli", fmt))
    if fmt != "md" or not categories:
        return
    cats = category_rows(recs)
    if any(r.get("category") not in ("all", "default", "prompt") for r in cats):
        print("\nBy workload category (speed: median ± 95% interval over repetitions; acceptance: ± over prompts):")
        print(_table(cats, "category", fmt))
    for rec in recs:
        n = (rec.metrics or {}).get("noise") or {}
        if n.get("noisy"):
            print(f"noisy: {rec.label}: " + "; ".join(n.get("reasons") or []))


def cmd_bench(a) -> int:
    from tqdm import tqdm

    from engine.infer.loader import resolve_device
    from engine.measure.bandwidth import bandwidth_gbs
    from engine.measure.pool import ModelPool
    from engine.measure.store import Store
    from engine.measure.grid import sweep_configs
    from engine.measure.runner import run_many

    base = config_from(a, warmup=True, baseline=True, quality=a.quality, quality_tokens=a.quality_tokens)
    left_out: list[str] = []
    cfgs = [c.validate() for c in sweep_configs(base, a.precisions, a.drafts, a.draft_precisions, a.gammas,
                                                a.batch_sizes, left_out)]  # every config checked before anything runs
    for lo in left_out:
        print(f"left out: {lo} (a self-draft must read fewer bytes than its target to save anything)", file=sys.stderr)
    if a.ray:  # each configuration a Ray task (engine/cluster, docs/CLUSTER.md); records stored here as they land
        from engine.cluster import run_on_ray

        out = run_on_ray(cfgs, a.ray, Store(), progress=lambda s: print(f"  [{s}]", file=sys.stderr), cpus=a.ray_cpus)
        for f in out.failures:
            print(f"failed: {f.line()}", file=sys.stderr)
        return _bench_output(out.records, a) or (1 if out.failures else 0)
    # Re-probe before measuring: the cached reading keeps the best seen, and a busy moment reads low.
    print(f"memory read bandwidth: {bandwidth_gbs(resolve_device(a.device), refresh=True):.1f} GB/s", file=sys.stderr)
    bar = tqdm(total=len(cfgs), desc="bench", unit="config", file=sys.stderr, dynamic_ncols=True)

    def say(s: str):  # "run i/n (label)", then "run i/n (label): what it does now"
        head, _, what = s.partition(": ")
        if not what or what.startswith("repetition"):
            bar.set_postfix_str(what or head)
        else:
            bar.write(f"  [{what}]", file=sys.stderr)

    recs = run_many(cfgs, ModelPool(keep=2), Store(), say=say, on_record=lambda rec: bar.update())
    bar.close()
    return _bench_output(recs, a)


def _bench_output(recs, a) -> int:
    if a.json:
        print("[" + ",\n".join(r.to_json(indent=1) for r in recs) + "]")
    else:
        _print_summary(recs, a.format)
    return 0


def cmd_quality(a) -> int:
    """llama.cpp-style statistics against fp32 for each precision, and llama.cpp's own Q4_K_M beside them: work
    items (QualityItem, LlamaQualityItem) through run_many, each stored as a `quality` record, then printed."""
    from tqdm import tqdm

    from engine.infer.catalog import CATALOG, canonical_name, resolve
    from engine.infer.loader import load_tokenizer, make_spec, resolve_device
    from engine.measure import quality
    from engine.measure.eval_text import DEFAULT_TOKENS, eval_docs
    from engine.measure.runner import run_many
    from engine.measure.store import Store
    from engine.present import format_rows
    from engine.present.quality_view import llama_style, table_rows
    from engine.quant import check_supported

    device = resolve_device(a.device)
    specs = [make_spec(p, a.group_size, a.quantize_embeddings, not a.no_quantize_head) for p in a.precisions]
    for s in specs:  # refuse every unsupported precision before loading anything
        check_supported(s, device)
    if not specs and not a.peers:
        raise UserError("nothing to measure: no precisions and --no-peers", "name --precisions int8,int4")
    tokens = DEFAULT_TOKENS if a.tokens is None else a.tokens
    say = lambda s: tqdm.write(f"  [{s}]", file=sys.stderr)  # noqa: E731
    folder = resolve(a.model, say)
    name = canonical_name(a.model) if canonical_name(a.model) in CATALOG else str(a.model)
    docs = eval_docs(load_tokenizer(folder), tokens)
    n = sum(d.positions for d in docs)

    def bar(desc, total):
        return tqdm(total=total, desc=desc, unit="tok", file=sys.stderr, dynamic_ncols=True, leave=False)

    with bar("fp32 reference", n) as b:
        quality.ensure_reference(name, folder, docs, None, say, on_tokens=b.update, device=device)
    items: list = []
    with bar("scoring", n * len(specs)) as b:
        items += [quality.QualityItem(a.model, s, tokens, device, docs, on_tokens=b.update) for s in specs]
        if a.peers:
            from engine.peers.quality_worker import LlamaQualityItem

            items.append(LlamaQualityItem(a.model, tokens))
        run_many(items, None, Store(), say=say, noun="configuration",
                 on_skip=lambda rec: print(f"{rec.label}: {rec.notes}", file=sys.stderr))
    results = [(f"{it.result['model']} {it.result['precision']}" if isinstance(it, quality.QualityItem)
                else f"{name} {it.result['label']}", it.result) for it in items if it.result is not None]
    if a.json:
        print(json.dumps([q for _, q in results], indent=1, default=str))
        return 0
    for label, q in results:
        print(llama_style(label, q), end="\n\n")
    if results:
        print(format_rows(table_rows(results), "md"))
    return 0


def _accuracy_setups(a) -> list:
    """One EngineSetup per --precisions entry: 'int4-g32' is int4 at group size 32, 'int4-gptq-g32' GPTQ's;
    all validated up front."""
    from engine.common.setup import EngineSetup

    out = []
    for tok in a.precisions:
        out.append(EngineSetup(model=a.model, precision=tok, group_size=a.group_size,
                               device=a.device, draft=a.draft, draft_model=a.draft_model,
                               draft_precision=a.draft_precision, gamma=a.gamma).validate())
    return out


def cmd_accuracy(a) -> int:
    """HumanEval pass@1 per precision (and llama-server at --llama's weights), paired against the first one."""
    from engine.measure import accuracy, sandbox
    from engine.measure.pool import ModelPool
    from engine.measure.runner import run_many
    from engine.measure.store import Store
    from engine.present import format_rows
    from engine.present.accuracy_view import NOTE, accuracy_rows

    store = Store()
    if a.stored:  # the table of what is stored, oldest first, paired against the --reference-th; nothing runs
        recs = store.list_runs(1000)
        acc = [r for r in recs if r.kind == "accuracy"][::-1]
        if acc and not 1 <= a.reference <= len(acc):
            raise UserError(f"--reference {a.reference} is not one of the {len(acc)} stored accuracy runs",
                            f"pass a position from 1 (the oldest) to {len(acc)}")
        print(format_rows(accuracy_rows(acc, recs, a.reference - 1), "md"))
        return 0
    if a.reference != 1:
        raise UserError("--reference only picks the reference of the stored table (--stored)",
                        "a run pairs against its first --precisions entry: put the reference first")
    setups = _accuracy_setups(a)
    accuracy.select(a.subset, a.ids)  # an unknown subset or id is refused before anything loads
    sandbox.check_available()
    limits = sandbox.Limits(timeout_s=a.timeout)
    say = lambda s: print(f"  [{s}]", file=sys.stderr)  # noqa: E731
    common = dict(subset=a.subset, ids=a.ids, max_new_tokens=a.max_new_tokens, usd_per_hour=a.price, limits=limits)
    items: list = [accuracy.AccuracyItem(setup, {**common, "batch": a.batch}) for setup in setups]
    if a.peers:  # llama-server at each of llama.cpp's weights asked for (checked before anything runs)
        from engine.peers import servers
        from engine.peers.server_accuracy import ServerAccuracyItem

        items += [ServerAccuracyItem(servers.ServerSpec.of("llama-server", model=a.model, precision=t, slots=a.batch,
                                                           max_model_len=2048).validate(), common) for t in a.llama]
    recs = run_many(items, ModelPool(keep=1), store, say=say, noun="configuration",
                    on_skip=lambda rec: print(f"{rec.label}: {rec.notes}", file=sys.stderr))
    if a.json:
        print("[" + ",\n".join(r.to_json(indent=1) for r in recs) + "]")
        return 0
    print(format_rows(accuracy_rows(recs, store.list_runs(1000)), "md"))
    print("\n" + NOTE)
    return 0


def cmd_runs(a) -> int:
    from engine.measure.store import Store

    st = Store()
    if a.show:
        print(st.get_run(a.show).to_json(indent=1))
        return 0
    recs = st.list_runs(a.limit)
    loads, others = [r for r in recs if r.kind == "load"], [r for r in recs if r.kind != "load"]
    # load records keep their own columns: throughput and latencies under load
    from engine.present import rows
    from engine.present.load_view import load_rows
    from engine.present.printers import format_rows

    cols = ["run", "system", "profile", "requests", "failed", "out_tok_s", "goodput", "ttft_p50_ms", "ttft_p90_ms",
            "itl_p50_ms", "gap_p50_ms", "gap_p99_ms", "e2e_p90_s"]
    if a.json:  # one list: the runs' rows, then each load record's, tagged kind "load"
        out = json.loads(_table(rows(others), "cli", "json")) if others else []
        out += [{"kind": "load", **{c: r.get(c) for c in cols}} for r in load_rows(loads)]
        print(json.dumps(out, indent=1, default=str))
        return 0
    if others or not loads:
        _print_summary(others, "md", categories=False)
    if loads:
        print(("\n" if others else "") + "Under load (python -m engine load):")
        print(format_rows(load_rows(loads), "md", cols))
    return 0


def _lab_store():
    """The lab's store when it exists (the planner must not create one just by looking)."""
    from engine.measure.store import Store, default_path

    path = default_path()
    return Store(path) if path.exists() else None


def _stored_runs() -> list[dict]:
    """The store's runs as plain dicts, for the planner's calibration and measured acceptance."""
    st = _lab_store()
    return [r.to_dict() for r in st.list_runs(1000)] if st else []


def _stored_gpu_overrides() -> list[dict]:
    st = _lab_store()
    return st.gpu_overrides() if st else []


def _ray_load_sender(address: str, clients: int):
    from engine.cluster import load_sender  # Ray's load clients (engine.load may not import engine.cluster)

    return load_sender(address, clients)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine", description="Serving Cost Lab engine")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("models", help="list catalog models; --fetch converts the default pair")
    p.add_argument("--fetch", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_models)

    p = sub.add_parser("generate", help="generate from a prompt, streaming, and store the run")
    add_run_args(p)
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("bench", help="measure configurations (grid over precisions, drafts, gammas)")
    add_run_args(p, many=True)
    p.add_argument("--quality", action="store_true", help="also measure KL/top-1 against fp32")
    p.add_argument("--quality-tokens", type=int, default=256)
    p.add_argument("--format", default="md", choices=["md", "csv", "json"])
    p.add_argument("--ray", default=None, metavar="ADDRESS|auto|local",
                   help="run each configuration as a task on this Ray cluster (docs/CLUSTER.md)")
    p.add_argument("--ray-cpus", type=int, default=None,
                   help="with --ray: CPU cores per CPU configuration (default: all of the smallest node's)")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("quality", help="llama.cpp-style KL divergence, same top-1, Δp and perplexity against fp32, "
                       "per category (chat, code), with llama.cpp's Q4_K_M beside them")
    p.add_argument("--model", default="default")
    p.add_argument("--precisions", type=csv_list, default=["int8", "int4"],
                   help="comma-separated, e.g. int8,int4,nf4,int4-gptq-g32 (int4 alone is round-to-nearest)")
    p.add_argument("--group-size", type=int, default=64, help="int4 group size: 32, 64 or 128")
    p.add_argument("--quantize-embeddings", action="store_true")
    p.add_argument("--no-quantize-head", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--tokens", type=int, default=None, help="scored tokens, half chat and half code (default 8192)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="also score llama.cpp's Q4_K_M GGUF on the same tokens (--no-peers skips it)")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(fn=cmd_quality)

    p = sub.add_parser("accuracy", help="HumanEval pass@1 (greedy) per precision, and llama-server's Q4_K_M, with "
                       "flips and McNemar's exact test against the first; generated code runs in a sandbox")
    p.add_argument("--model", default="default")
    p.add_argument("--precisions", type=csv_list, default=["bf16", "int8", "int4-g32", "int4-g64"],
                   help="comma-separated; int4-g32 is int4 at group size 32. The first is the reference")
    p.add_argument("--group-size", type=int, default=64, help="int4 group size where a precision names none")
    p.add_argument("--subset", default="quick20", help="full (all 164) or quick20 (every 8th task id, 0..152)")
    p.add_argument("--ids", type=csv_list, default=None, help="task ids instead of a subset: HumanEval/0,HumanEval/8")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--batch", type=int, default=4,
                   help="problems in flight at once, batched continuously (ours; llama-server's slots)")
    p.add_argument("--draft", default="none", help="none, model, self or ngram: speculative, lossless")
    p.add_argument("--draft-model", default="default-draft")
    p.add_argument("--draft-precision", default="int4")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--device", default="auto")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds one problem's tests may run in the sandbox")
    p.add_argument("--price", type=float, default=0.10, help="$/hour of this machine, for $/1,000 solved")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="also llama.cpp through llama-server on the same prompts (--no-peers skips it)")
    p.add_argument("--llama", type=csv_list, default=["Q4_K_M"],
                   help="llama.cpp's weights for the llama-server rows (engine.peers.gguf_tools.LLAMA_PRECISIONS), "
                        "e.g. Q4_K_M,Q4_K_M-imatrix,IQ4_XS-imatrix (built once)")
    p.add_argument("--json", action="store_true", help="print the accuracy records as JSON")
    p.add_argument("--stored", action="store_true", help="only print the table of the stored accuracy runs")
    p.add_argument("--reference", type=int, default=1,
                   help="with --stored: pair every run against the K-th stored one (1, the oldest, by default)")
    p.set_defaults(fn=cmd_accuracy)

    p = sub.add_parser("runs", help="list stored runs, or --show ID")
    p.add_argument("--show", default=None)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_runs)

    from engine.present import plan_cli
    plan_cli.add_parser(sub, stored_runs=_stored_runs, stored_gpu_overrides=_stored_gpu_overrides)
    from engine.load import cli as load_cli
    load_cli.add_parser(sub, ray_sender=_ray_load_sender)
    from engine.serve import cli as serve_cli
    serve_cli.add_parser(sub)
    from engine.backend import cli as backend_cli
    backend_cli.add_parser(sub)
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a) or 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
