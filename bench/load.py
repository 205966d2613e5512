"""Every peer server under load, side by side, in one run on this machine.

    .venv/bin/python bench/load.py                                  # the 0.5B, ShareGPT chat, concurrency 1, 4, 8
    .venv/bin/python bench/load.py --model default --precisions int4   # the 1.5B (its draft: the 0.5B)
    .venv/bin/python bench/load.py --only llama,vllm                 # systems whose label contains any of these
    .venv/bin/python bench/load.py --concurrency 1,8 --llama-precisions Q4_K_M,Q8_0,BF16 --vllm-precisions bf16,int8
                                                                     # the headline: each at its best,
                                                                     # and at one precision

Each server is started by the lab on 127.0.0.1 (engine/peers/servers.py), warmed with one request,
then sent the same ShareGPT chat requests (the paired answers' lengths, capped, forced with
ignore_eos where the server takes it) at each concurrency (engine/peers/load_sweep.py, the same sweep
the Load test page runs); every load point is a `load` record in the store. Our engine runs at each of
--precisions without a draft and at int4 with each of --drafts. Servers that are not installed are
listed with the reason. Writes <out>/<name>.{md,csv,json,html} and <name>-crossover.html, with PNGs
when Debian's chromium is there; the .md ends with $/1M at the SLO, the crossovers and the issue's
targets checked, and the load average before and after.

The headline table has two kinds of column: each system at its best (its fastest
configuration at that concurrency, draft or not, named), and every system at one precision without a
draft: bf16 (llama.cpp's BF16 GGUF) and 8-bit weights (our int8, vLLM's int8 weight-only, llama.cpp's
Q8_0). llama-server's Q8_0 and BF16 are the catalog weights requantized by llama.cpp's own tools, the
weights our engine quantizes (engine.peers.servers.LLAMA_PRECISIONS).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine.common.errors import UserError  # noqa: E402
from engine.peers.load_sweep import SweepPlan, sweep_servers  # noqa: E402
from engine.peers.servers import ServerSpec  # noqa: E402
from engine.present import load_cost  # noqa: E402
from engine.present.load_view import (crossover_figure, load_columns, load_definitions, load_rows,  # noqa: E402
                                      throughput_figure)
from engine.present.printers import format_rows  # noqa: E402

COLUMNS = ["system", "profile", "requests", "failed", "out_tok_s", "req_s", "goodput", "ttft_p50_ms", "ttft_p90_ms",
           "itl_p50_ms", "itl_p90_ms", "gap_p50_ms", "gap_p99_ms", "e2e_p90_s", "accept_rate", "accept_len", "forced"]
# The precision columns of the headline: each system's name for it.
SAME_PRECISION = {"bf16": {"serving-cost-lab": "bf16", "llama-server": "BF16", "vllm": "bf16"},
                  "8-bit weights": {"serving-cost-lab": "int8", "llama-server": "Q8_0", "vllm": "int8"}}


def specs(model: str, drafts: list[str], precisions: list[str], slots: int, max_model_len: int,
          llama_threads: int | None = None, vllm_precisions: tuple[str, ...] = ("bf16",),
          llama_precisions: tuple[str, ...] = ("Q4_K_M",)) -> list:
    """Our engine at each precision without a draft and at int4 with each draft (int8 under a self-draft,
    which must read fewer bytes than its target), llama-server with `slots` slots, plain and with its own
    speculative decoding for the model and n-gram drafts asked for, and vLLM's CPU build."""
    common = {"model": model, "slots": slots, "max_model_len": max_model_len}
    out = [ServerSpec.of("serving-cost-lab", precision=p, **common) for p in precisions]
    out += [ServerSpec.of("serving-cost-lab", precision="int8" if d == "self" else "int4", draft=d,
                          draft_model="default-draft", draft_precision="int4", gamma=4, **common)
            for d in drafts if d != "none"]
    out += [ServerSpec.of("llama-server", threads=llama_threads, precision=p, **common) for p in llama_precisions]
    # llama-server with its own speculative decoding, for each draft kind it has (the same draft and gamma)
    out += [ServerSpec.of("llama-server", threads=llama_threads, draft=d, draft_model="default-draft", gamma=4,
                          **common) for d in drafts if d in ("model", "ngram")]
    return out + [ServerSpec.of("vllm", precision=p, **common) for p in vllm_precisions]


def _at(recs, streams: int) -> dict[str, float]:
    """label -> output tok/s at concurrency `streams`."""
    return {r.config["label"]: r.metrics["load"]["output_tok_s"] for r in recs
            if (r.config.get("profile") or {}).get("streams") == streams and r.metrics["load"].get("output_tok_s")}


def targets(recs, slots: int) -> list[str]:
    """The issues' targets, measured in this run: our int4 at concurrency 8 against its own concurrency 1,
    vLLM's CPU build and llama-server (issues 13 and 23); our bf16 against vLLM's bf16 (23.7); our ITL
    tail (23.8); speculation at concurrency 1."""
    c1, c8 = _at(recs, 1), _at(recs, 8)
    ours, ours_bf16 = f"serving-cost-lab int4 ({slots} seqs)", f"serving-cost-lab bf16 ({slots} seqs)"
    llama = next((k for k in c8 if k.startswith("llama-server Q4_K_M (")), None)
    vllm = next((k for k in c8 if k.startswith("vLLM CPU bf16")), None)
    out = []

    def check(what, num, den, goal, lower=False):
        if num is None or den is None:
            out.append(f"- {what}: not measured")
            return
        r = num / den
        met = r <= goal if lower else r >= goal
        out.append(f"- {what}: {num:.1f} / {den:.1f} = **{r:.2f}x** (target {'<=' if lower else '>='} {goal}x): "
                   + ("met" if met else "MISSED"))

    check("our int4 at concurrency 8 / its single stream", c8.get(ours), c1.get(ours), 5.0)
    check("our int4 / vLLM CPU bf16 at concurrency 8", c8.get(ours), c8.get(vllm) if vllm else None, 1.5)
    check("our int4 / llama-server Q4_K_M at concurrency 8", c8.get(ours),
          c8.get(llama) if llama else None, 2.5)
    for c, at in ((1, c1), (8, c8)):
        v = next((k for k in at if k.startswith("vLLM CPU bf16")), None)
        check(f"our bf16 / vLLM CPU bf16 at concurrency {c}", at.get(ours_bf16),
              at.get(v) if v else None, 0.9)
    gaps = next(((r.metrics["load"].get("gap_s_p99"), r.metrics["load"].get("gap_s_p50")) for r in recs
                 if r.config["label"] == ours and (r.config.get("profile") or {}).get("streams") == 8), (None, None))
    check("our int4 ITL (every gap) p99 / p50 at concurrency 8, ms",
          gaps[0] * 1000 if gaps[0] else None, gaps[1] * 1000 if gaps[1] else None, 3.0, lower=True)
    for lab in c1:
        if lab.startswith("serving-cost-lab int4 +") and ours in c1:
            out.append(f"- {lab} at concurrency 1: {c1[lab]:.1f} against {c1[ours]:.1f} tok/s without a draft "
                       f"= {c1[lab] / c1[ours]:.2f}x")
    return out


def _system(rec) -> str:
    return rec.config.get("system") or rec.config["label"]


def _plain(rec) -> bool:
    return (rec.config.get("draft") or {}).get("kind", "none") in (None, "none")


def headline(recs) -> str:
    """Each system at its best (its fastest configuration at each concurrency, named), and every system at
    one precision without a draft (SAME_PRECISION): output tok/s, as a markdown table."""
    by = {}
    for r in recs:
        n = (r.config.get("profile") or {}).get("streams")
        v = r.metrics["load"].get("output_tok_s")
        if n and v:
            by.setdefault((n, _system(r)), []).append((v, r))
    rows = []
    for n, sysname in sorted(by, key=lambda k: (k[0], list(by).index(k))):
        best_v, best = max(by[(n, sysname)], key=lambda x: x[0])
        row = {"concurrency": n, "system": sysname, "at its best: configuration": best.config["label"],
               "tok/s": f"{best_v:.1f}"}
        for what, names in SAME_PRECISION.items():
            hit = [v for v, r in by[(n, sysname)] if _plain(r) and r.config.get("precision") == names.get(sysname)]
            row[f"at {what}: tok/s"] = f"{hit[0]:.1f} ({names[sysname]})" if hit else "not run"
        rows.append(row)
    return format_rows(rows, "md") + "\n"


def _load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default-draft", help="catalog model every server runs")
    ap.add_argument("--drafts", default=None, help="our engine's drafts at int4, comma-separated (default: "
                    "ngram,model for the 1.5B; ngram for the 0.5B, whose draft model would be itself)")
    ap.add_argument("--precisions", default="int4,int8,bf16", help="our engine without a draft at these precisions")
    ap.add_argument("--vllm-precisions", default="bf16", help="vLLM's CPU build at these (bf16, fp32, int8: its "
                    "online int8 weight-only; see bench/vllm_precisions.py for what it accepts)")
    ap.add_argument("--llama-precisions", default="Q4_K_M", help="llama-server at these (Q4_K_M: the catalog GGUF; "
                    "Q8_0, BF16, F16: the same weights requantized by llama.cpp's tools, built once)")
    ap.add_argument("--workload", default="chat:16")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--slots", type=int, default=8, help="server slots / max sequences (llama-server -np)")
    ap.add_argument("--llama-threads", type=int, default=None, help="llama-server -t (default: its own, every core)")
    ap.add_argument("--max-output-len", type=int, default=128, help="cap on each answer (tokens)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--slo", default="ttft=2,itl=0.2", help="the SLO for goodput (seconds)")
    ap.add_argument("--usd-per-hour", type=float, default=0.10, help="this machine's price, for $/1M at the SLO")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="per load point")
    ap.add_argument("--only", default=None, help="comma-separated substrings of the systems to run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--name", default="load", help="output file stem (<out>/<name>.md, ...)")
    ap.add_argument("--no-store", action="store_true")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still stops its server
    from engine.infer.catalog import canonical_name

    small = canonical_name(a.model) == canonical_name("default-draft")
    drafts = [d.strip() for d in (a.drafts or ("ngram" if small else "ngram,model")).split(",") if d.strip()]
    precisions = [p.strip() for p in a.precisions.split(",") if p.strip()]
    todo = specs(a.model, drafts, precisions, a.slots, a.max_model_len, a.llama_threads,
                 tuple(p.strip() for p in a.vllm_precisions.split(",") if p.strip()),
                 tuple(p.strip() for p in a.llama_precisions.split(",") if p.strip()))
    if a.only:
        keys = [k.strip().lower() for k in a.only.split(",") if k.strip()]
        todo = [s for s in todo if any(k in s.label.lower() for k in keys)]
    from engine.measure.store import Store

    store = None if a.no_store else Store()
    say = lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", file=sys.stderr, flush=True)  # noqa: E731
    plan = SweepPlan(loads=a.concurrency, workload=a.workload, max_output_len=a.max_output_len, slo=a.slo,
                     max_model_len=a.max_model_len, warmup=1, max_seconds=a.max_seconds,
                     request_timeout_s=a.max_seconds)
    load_before = _load_average()
    t0 = time.time()
    res = sweep_servers(todo, plan, store, progress=say)
    recs = res.records
    load_after = _load_average()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = load_rows(recs)
    cols = [c for c in COLUMNS if c in load_columns(rows)]
    command = "python bench/load.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"# Peers under load: {a.model}, {a.workload} (answers capped at {a.max_output_len} tokens), "
            f"concurrency {a.concurrency}\n\n`{command.strip()}`, {time.time() - t0:.0f} s. SLO for goodput: "
            f"{a.slo}. Load average (1, 5, 15 min) before: {load_before}; after: {load_after}.\n\n")
    md = head + "## Each system at its best, and all at one precision (output tok/s)\n\n" + headline(recs)
    md += "\n## Every configuration\n\n" + format_rows(rows, "md", cols) + "\n"
    if res.skipped:
        md += "\nNot measured:\n" + "".join(f"- {label}: {why}\n" for label, why in res.skipped)
    costs = load_cost.costs_at_slo(recs, a.usd_per_hour)
    md += f"\n## $ per 1M output tokens at the SLO (${a.usd_per_hour:g}/hour)\n\n"
    md += format_rows(load_cost.cost_rows(costs), "md", ["configuration", "usd_per_1m_out_at_slo", "at",
                                                           "goodput_tok_s", "usd_per_1m_out_single_stream", "why"])
    pairs = load_cost.crossover_pairs(recs)
    md += "\n\n## Crossovers (output tok/s, candidate / baseline)\n\n" + "".join(
        f"- {x.verdict}; ratios {', '.join(f'{_l:g}: {r:.2f}' for _l, r in zip(x.loads, x.ratios) if r)}\n"
        for x in pairs)
    md += "\n## Targets\n\n" + "\n".join(targets(recs, a.slots)) + "\n"
    md += "\n" + "".join(f"- **{lab}**: {d}\n" for lab, d in load_definitions(cols))
    (out / f"{a.name}.md").write_text(md)
    (out / f"{a.name}.csv").write_text(format_rows(rows, "csv", cols))
    (out / f"{a.name}.json").write_text(json.dumps({
        "command": command, "rows": rows, "run_ids": [r.run_id for r in recs], "not_measured": res.skipped,
        "costs_at_slo": [c.to_dict() for c in costs], "crossovers": [x.to_dict() for x in pairs],
        "load_average": {"before": load_before, "after": load_after}}, indent=1, default=str))
    if recs:
        from peers import _png

        fig = throughput_figure(recs)
        fig.update_layout(title=f"Peers under load: {a.model}, {a.workload}")
        fig.write_html(str(out / f"{a.name}.html"), include_plotlyjs=True, full_html=True)
        _png(out / f"{a.name}.html", out / f"{a.name}.png")
        if pairs:
            xf = crossover_figure(pairs)
            xf.update_layout(width=1000, title=f"Crossover on {a.model}, {a.workload}: candidate / baseline output "
                             "tok/s (above 1 the candidate leads; x: where it stops paying)")
            xf.write_html(str(out / f"{a.name}-crossover.html"), include_plotlyjs=True, full_html=True)
            _png(out / f"{a.name}-crossover.html", out / f"{a.name}-crossover.png")
    print(md)
    print(f"wrote {out}/{a.name}.{{md,csv,json,html}}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
