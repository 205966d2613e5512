"""Session 41: GPTQ-mixed's quality against its bytes as its int8 budget moves (issue 36, the speed half).

The lab's GPTQ-mixed keeps linears at int8 while their extra bytes fit MIXED_BUDGET (0.25) of the all-int4 linears'
bytes (engine.infer.calibrate.mixed_selection). At the bandwidth floor single-stream speed is bytes per token, so
this asks: at which group size and budget does GPTQ-mixed still reach llama.cpp's requantized Q4_K_M (KLD median and
p99 no higher, same top-1 no lower), and with how many bytes per decode token? One row per (group, budget): the
cached GPTQ codes of that group, the budget set on mixed_selection's default for this process only (no code
changed), scored on the 2,048 eval tokens against the cached reference, as bench/quality_matched.py scores its rows.
Usage (repository root): .venv/bin/python docs/runs/2026-12-07/session41-g128/frontier.py OUT.json G:B,B,... ...
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
KEEP = ("kld_mean", "kld_median", "kld_p99", "top1_agreement")


def main(out: Path, plan: list[str]) -> None:
    folder = Path(MODEL)
    docs = eval_docs(load_tokenizer(folder), 2048)
    ref = quality.load_reference(quality.ensure_reference(MODEL, folder, docs, None, print), docs)
    rows = json.loads(out.read_text()) if out.exists() else []
    for item in plan:
        g, budgets = item.split(":")
        for b in map(float, budgets.split(",")):
            calibrate.mixed_selection.__defaults__ = (b,)
            spec = make_spec("int4-gptq" if b == 0 else "int4-gptq-mixed", int(g))
            t = time.time()
            lm = load(MODEL, spec, "cpu")
            row = quality.results(quality.score_model(lm, docs, ref), docs)
            r = {k: row.get(k) for k in KEEP} | {
                "precision": lm.spec.label, "group_size": int(g), "budget": b, "calibration": lm.calibration,
                "weight_bytes": lm.weight_bytes, "weights": dict(lm.weights),
                # what a decode step reads (engine.measure.summary.decode_bytes_per_step, KV aside)
                "bytes_per_token": sum(v for k, v in lm.weights.items() if k != "embedding"),
                "seconds": round(time.time() - t)}
            del lm
            rows.append(r)
            out.write_text(json.dumps(rows, indent=1, default=str))
            print(f"g{g} budget {b}: median {r['kld_median']:.5f} p99 {r['kld_p99']:.4f} top-1 "
                  f"{r['top1_agreement']:.2%} int8 linears {(r['calibration'] or {}).get('int8_linears')} "
                  f"per token {r['bytes_per_token'] / 1e6:.0f} MB", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
