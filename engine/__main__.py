"""`python -m engine`: a thin CLI over the same API the dashboard calls."""
from __future__ import annotations

import argparse
import sys
import warnings

warnings.filterwarnings("ignore", message="The pynvml package is deprecated")

from engine.common.errors import UserError  # noqa: E402
from engine.planner.cli import _csv, _ints  # noqa: E402  (one parser for comma lists)


def add_run_args(p: argparse.ArgumentParser, many: bool = False):
    p.add_argument("--model", default="default", help="catalog name (default, default-draft), folder or hub id")
    if many:
        p.add_argument("--precisions", type=_csv, default=["fp32", "bf16", "int8", "int4"],
                       help="comma-separated: fp32,bf16,fp16,int8,int4,llm.int8,nf4,fp8")
        p.add_argument("--drafts", type=_csv, default=["none"], help="comma-separated draft kinds: none,model,self,ngram")
        p.add_argument("--draft-precisions", type=_csv, default=["int4"])
        p.add_argument("--gammas", type=_ints, default=[4])
        p.add_argument("--batch-sizes", type=_ints, default=[1])
    else:
        p.add_argument("--precision", default="fp32")
        p.add_argument("--draft", default="none", help="none, model, self or ngram")
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
              adaptive_gamma=a.adaptive_gamma, prompt=a.prompt, max_new_tokens=a.max_new_tokens,
              temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed, chat=not a.no_chat)
    kw.update(over)
    return RunConfig(**kw)


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
    from engine.measure.runs import ModelPool, execute
    from engine.measure.store import Store

    cfg = config_from(a, precision=a.precision, draft=a.draft, draft_precision=a.draft_precision, gamma=a.gamma,
                      batch_size=a.batch, warmup=False, baseline=False)
    colors = {"accepted": "\033[32m", "bonus": "\033[34m", "resample": "\033[33m"}
    tty = sys.stdout.isatty() and not a.json

    def on_token(i, t, piece, origin):
        if i == 0 and not a.json:
            sys.stdout.write((colors.get(origin, "") + piece + "\033[0m") if tty else piece)
            sys.stdout.flush()

    rec = execute(cfg, ModelPool(keep=2), Store(), progress=lambda s: print(f"[{s}]", file=sys.stderr),
                  on_token=on_token)
    if a.json:
        print(rec.to_json(indent=1))
    else:
        print()
        _print_summary([rec])
    return 0


def _print_summary(recs, fmt="md"):
    from engine.present import format_rows, rows, view_columns

    table = rows(recs)
    print(format_rows(table, fmt, view_columns(table, "cli")))


def cmd_bench(a) -> int:
    from tqdm import tqdm

    from engine.measure.runs import ModelPool, execute, sweep_configs
    from engine.measure.store import Store

    from engine.infer.loader import resolve_device
    from engine.measure.bandwidth import bandwidth_gbs

    # Re-probe before measuring: the cached reading keeps the best seen, and a busy moment reads low.
    print(f"memory read bandwidth: {bandwidth_gbs(resolve_device(a.device), refresh=True):.1f} GB/s", file=sys.stderr)
    base = config_from(a, warmup=True, baseline=True, quality=a.quality, quality_tokens=a.quality_tokens)
    cfgs = sweep_configs(base, a.precisions, a.drafts, a.draft_precisions, a.gammas, a.batch_sizes)
    pool, store, recs = ModelPool(keep=2), Store(), []
    bar = tqdm(cfgs, desc="bench", unit="config", file=sys.stderr, dynamic_ncols=True)
    for c in bar:
        bar.set_postfix_str(f"{c.model} {c.precision} draft={c.draft}")
        recs.append(execute(c, pool, store, progress=lambda s: bar.write(f"  [{s}]", file=sys.stderr)))
    bar.close()
    if a.json:
        print("[" + ",\n".join(r.to_json(indent=1) for r in recs) + "]")
    else:
        _print_summary(recs, a.format)
    return 0


def cmd_quality(a) -> int:
    from engine.infer.loader import load, make_spec
    from engine.measure.quality import evaluate
    from engine.present import format_rows

    rows = []
    for p in a.precisions:
        lm = load(a.model, make_spec(p, a.group_size, a.quantize_embeddings, not a.no_quantize_head), a.device,
                  progress=lambda s: print(f"  [{s}]", file=sys.stderr))
        q = evaluate(lm, a.tokens, progress=lambda s: print(f"  [{s}]", file=sys.stderr))
        rows.append({"model": lm.name, "precision": lm.spec.label, "weights_MB": round(lm.weight_bytes / 1e6, 1),
                     **{k: (round(v, 5) if isinstance(v, float) else v) for k, v in q.items()}})
        del lm
    print(format_rows(rows, "json" if a.json else "md"))
    return 0


def cmd_runs(a) -> int:
    from engine.measure.store import Store

    st = Store()
    if a.show:
        print(st.get_run(a.show).to_json(indent=1))
        return 0
    _print_summary(st.list_runs(a.limit), "json" if a.json else "md")
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
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("quality", help="perplexity, KL and top-1 agreement against fp32")
    p.add_argument("--model", default="default")
    p.add_argument("--precisions", type=_csv, default=["bf16", "int8", "int4"])
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--quantize-embeddings", action="store_true")
    p.add_argument("--no-quantize-head", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_quality)

    p = sub.add_parser("runs", help="list stored runs, or --show ID")
    p.add_argument("--show", default=None)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_runs)

    from engine.planner import cli as planner_cli
    planner_cli.add_parser(sub, stored_runs=_stored_runs, stored_gpu_overrides=_stored_gpu_overrides)
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
