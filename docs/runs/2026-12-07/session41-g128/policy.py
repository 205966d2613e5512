"""Session 41: GPTQ-mixed with the kinds kinds.py found to pay first (issue 36).

kinds.py (one kind of linear at int8, the rest int4 g32) read the head as the largest median gain per byte and v_proj,
then o_proj and k_proj, as the largest p99 gains per byte, while mixed_selection ranks the head last (its relative
output error is the smallest). Here: the head and every v, k and o at int8 first, then, while the budget lasts, the
others by mixed_selection's own ranking. Scored as frontier.py scores (2,048 tokens, the cached reference), set for
this process only (no code changed). Usage (repository root):
  .venv/bin/python docs/runs/2026-12-07/session41-g128/policy.py OUT.json G:B,B,... ...
"""
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from engine.infer import calibrate  # noqa: E402
from engine.infer.loader import load, load_tokenizer  # noqa: E402
from engine.measure import quality  # noqa: E402
from engine.measure.eval_text import eval_docs  # noqa: E402
from engine.quant.convert import make_spec  # noqa: E402

MODEL = str(Path.home() / ".cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0")
FIRST = ("lm_head", "v_proj", "k_proj", "o_proj")
ranked = calibrate.mixed_selection


def kinds_first(errors: dict, params: dict, budget: float) -> set:
    """FIRST's linears at int8 (whatever the budget), then mixed_selection's ranking for what the budget has left."""
    first = {n for n in errors if n.endswith(FIRST)}
    int4 = sum(params.values()) * 4.5 / 8
    spent = sum(params[n] * (8 - 4.5) / 8 for n in first)
    rest = {n: e for n, e in errors.items() if n not in first}
    left = max(0.0, budget * int4 - spent) / (sum(params[n] for n in rest) * 4.5 / 8)
    return first | ranked(rest, {n: params[n] for n in rest}, left)


def main(out: Path, plan: list[str]) -> None:
    folder = Path(MODEL)
    docs = eval_docs(load_tokenizer(folder), 2048)
    ref = quality.load_reference(quality.ensure_reference(MODEL, folder, docs, None, print), docs)
    rows = json.loads(out.read_text()) if out.exists() else []
    for item in plan:
        g, budgets = item.split(":")
        for b in map(float, budgets.split(",")):
            calibrate.mixed_selection = lambda errors, params, b=b: kinds_first(errors, params, b)
            t = time.time()
            lm = load(MODEL, make_spec("int4-gptq-mixed", int(g)), "cpu")
            row = quality.results(quality.score_model(lm, docs, ref), docs)
            r = {k: row.get(k) for k in ("kld_mean", "kld_median", "kld_p99", "top1_agreement")} | {
                "precision": lm.spec.label + " (kinds first)", "group_size": int(g), "budget": b,
                "calibration": lm.calibration, "weight_bytes": lm.weight_bytes, "weights": dict(lm.weights),
                "bytes_per_token": sum(v for k, v in lm.weights.items() if k != "embedding"),
                "seconds": round(time.time() - t)}
            del lm
            rows.append(r)
            out.write_text(json.dumps(rows, indent=1, default=str))
            print(f"g{g} kinds first, budget {b}: median {r['kld_median']:.5f} p99 {r['kld_p99']:.4f} top-1 "
                  f"{r['top1_agreement']:.2%} int8 linears {(r['calibration'] or {}).get('int8_linears')} "
                  f"per token {r['bytes_per_token'] / 1e6:.0f} MB", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
