"""Quantization x speculation in one table: what quantizing the target does to each draft's acceptance and speedup.

    .venv/bin/python bench/quant_spec.py --model default --precisions int8,int4 --drafts model,self,ngram,suffix

One grid of `python -m engine bench` (engine.measure.grid.sweep_configs through runner.run_many, the records
stored as every run's are): target precision x draft kind x batch size, each speculative configuration timed
beside the same target without a draft on the same prompts in the same run (spec.speedup, paired), greedy, on
a workload of code and edit prompts (the shipped HumanEval and ShareGPT selections), with KL divergence and
same top-1 against the fp32 reference on --quality-tokens tokens. A self-draft at a precision no cheaper than
its target saves nothing and is left out (named in the output). pass@1 is not measured here (engine accuracy).
Writes <out>/quant_spec.{md,json}; the md says, per draft, how acceptance moves from the widest target to each
quantized one, and the best speedup on code and edit prompts at batch 1 (issue 39's target: >= 1.5x).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_SPEEDUP = 1.5


def _spec(rec, category: str | None = None) -> dict:
    m = rec["metrics"] if category is None else (rec["metrics"].get("by_category") or {}).get(category) or {}
    return m.get("spec") or {}


def rows_of(recs: list[dict]) -> list[dict]:
    """One row per target precision and draft: acceptance and speedup at each batch size, the target's KLD."""
    from engine.common.record_setup import setup_from_record

    out: dict[tuple, dict] = {}
    for r in recs:
        cfg = r["config"]
        draft = (cfg.get("draft") or {}).get("kind") or "none"
        cfg["precision"]  # noqa: B018  a record without one is not a bench record: KeyError, loudly
        key = (setup_from_record(cfg).precision_token, draft)  # 'int4-gptq-g32': the method and group once
        row = out.setdefault(key, {"precision": key[0], "draft": draft, "label": r.get("label")})
        b = cfg.get("batch_size", 1)
        sp = _spec(r)
        row[f"acceptance_b{b}"] = sp.get("acceptance_rate")
        row[f"length_b{b}"] = sp.get("mean_acceptance_length")
        row[f"speedup_b{b}"] = sp.get("speedup")
        for cat in ("code", "edit"):
            row[f"speedup_{cat}_b{b}"] = _spec(r, cat).get("speedup")
        q = r["metrics"].get("quality") or {}
        if q.get("kld_median") is not None:
            row["kld_median"], row["same_top1"] = q["kld_median"], q.get("top1_agreement")
    return list(out.values())


def _f(v, f):
    return "n/a" if v is None else format(v, f)


def markdown(rep: dict) -> str:
    rows, sizes = rep["rows"], rep["batch_sizes"]
    md = ["# Quantization x speculation", "", f"Command: `{rep['command']}`", "",
          f"{rep['model']}, workload {rep['workload']}, {rep['max_new_tokens']} new tokens, greedy, "
          f"{rep['reps']} repetition(s) (each figure measured once), {rep['wall_s'] / 60:.0f} min. Speedup: the "
          "speculative configuration's decode tok/s over the same target's without a draft, same prompts, same run. "
          "KLD and same top-1: the target against the fp32 reference (the shipped Q4_K_M dequantized, so it lies "
          "on Q4_K_M's grid). pass@1: not measured here.", "",
          "| target | draft | " + " | ".join(f"acceptance b={b} | speedup b={b}" for b in sizes)
          + " | code b=1 | edit b=1 | KLD median | same top-1 |",
          "| --- | --- | " + " | ".join("---: | ---:" for _ in sizes) + " | ---: | ---: | ---: | ---: |"]
    for r in rows:
        md.append(f"| {r['precision']} | {r['draft']} | "
                  + " | ".join(f"{_f(r.get(f'acceptance_b{b}'), '.3f')} | {_f(r.get(f'speedup_b{b}'), '.2f')}"
                               for b in sizes)
                  + f" | {_f(r.get('speedup_code_b1'), '.2f')} | {_f(r.get('speedup_edit_b1'), '.2f')} | "
                  f"{_f(r.get('kld_median'), '.5f')} | {_f(r.get('same_top1'), '.3f')} |")
    md += ["", "**What quantizing the target does to acceptance** (batch 1, against the first precision's):", ""]
    first = rep["precisions"][0]
    for d in sorted({r["draft"] for r in rows}):
        base = next((r.get("acceptance_b1") for r in rows if r["draft"] == d and r["precision"] == first), None)
        for r in rows:
            a = r.get("acceptance_b1")
            if r["draft"] == d and r["precision"] != first and a is not None and base is not None:
                md.append(f"- {d}: {first} {base:.3f} -> {r['precision']} {a:.3f} ({a - base:+.3f})")
    for c in ("code", "edit"):
        top = max(((r.get(f"speedup_{c}_b1") or 0), r["precision"], r["draft"]) for r in rows)
        md.append(f"- best on {c} at batch 1: {top[0]:.2f}x ({top[1]} + {top[2]}; target >= {TARGET_SPEEDUP}x: "
                  f"{'met' if top[0] >= TARGET_SPEEDUP else 'missed'})")
    for lo in rep.get("left_out") or []:
        md.append(f"- left out: {lo}")
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--precisions", default="int8,int4")
    ap.add_argument("--drafts", default="model,self,ngram,suffix")
    ap.add_argument("--draft-precision", default="int4")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--workload", default="code:2,edit:2")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--quality-tokens", type=int, default=256)
    ap.add_argument("--out", default=str(ROOT / "docs" / "runs" / time.strftime("%Y-%m-%d")))
    ap.add_argument("--render", metavar="JSON", help="only rewrite the .md of a saved quant_spec.json")
    a = ap.parse_args(argv)
    if a.render:
        print(markdown(json.loads(Path(a.render).read_text())))
        return 0
    from engine.measure.grid import sweep_configs
    from engine.measure.pool import ModelPool
    from engine.measure.runner import run_many
    from engine.measure.runs import RunConfig
    from engine.measure.store import Store

    t0 = time.time()
    precisions, drafts = a.precisions.split(","), a.drafts.split(",")
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    base = RunConfig.of(model=a.model, draft_model="default-draft", workload=a.workload, reps=a.reps,
                        max_new_tokens=a.max_new_tokens, warmup=True, baseline=True, quality=True,
                        quality_tokens=a.quality_tokens)
    left_out: list[str] = []
    cfgs = [c.validate() for c in sweep_configs(base, precisions, drafts, [a.draft_precision], [4], sizes, left_out)]
    say = lambda s: print(f"[{time.time() - t0:5.0f}s] {s}", file=sys.stderr, flush=True)  # noqa: E731
    recs = run_many(cfgs, ModelPool(keep=3), Store(), say=say)
    rep = {"command": "python bench/quant_spec.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": a.model, "precisions": precisions, "batch_sizes": sizes, "workload": a.workload,
           "max_new_tokens": a.max_new_tokens, "reps": a.reps, "left_out": left_out,
           "rows": rows_of([json.loads(r.to_json()) for r in recs]), "run_ids": [r.run_id for r in recs],
           "wall_s": time.time() - t0}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_spec.json").write_text(json.dumps(rep, indent=1))
    md = markdown(rep)
    (out / "quant_spec.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
