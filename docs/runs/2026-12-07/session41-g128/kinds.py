"""Session 41: which kind of linear pays for int8 (issue 36, GPTQ-mixed's selection).

GPTQ-mixed ranks linears by their relative output error on the calibration text per extra byte
(engine.infer.calibrate.mixed_selection); those errors are alike across kinds (0.1-0.3%), so the ranking says little
of what each costs at the model's output. This measures it end to end: the cached GPTQ codes of one group size,
every linear int4 but one kind (all 28 of it, or the head) kept at int8, scored on the 2,048 eval tokens against the
cached reference as bench/quality_matched.py scores its rows. The selection is set for this process only (no code
changed). Usage (repository root): .venv/bin/python docs/runs/2026-12-07/session41-g128/kinds.py OUT.json GROUP
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
KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def main(out: Path, group: int) -> None:
    folder = Path(MODEL)
    docs = eval_docs(load_tokenizer(folder), 2048)
    ref = quality.load_reference(quality.ensure_reference(MODEL, folder, docs, None, print), docs)
    rows = json.loads(out.read_text()) if out.exists() else []
    for kind in KINDS:
        calibrate.mixed_selection = lambda errors, params, kind=kind: {n for n in errors if n.endswith(kind)}
        t = time.time()
        lm = load(MODEL, make_spec("int4-gptq-mixed", group), "cpu")
        row = quality.results(quality.score_model(lm, docs, ref), docs)
        r = {k: row.get(k) for k in ("kld_mean", "kld_median", "kld_p99", "top1_agreement")} | {
            "int8_kind": kind, "group_size": group, "calibration": lm.calibration, "weights": dict(lm.weights),
            "bytes_per_token": sum(v for k, v in lm.weights.items() if k != "embedding"),
            "seconds": round(time.time() - t)}
        del lm
        rows.append(r)
        out.write_text(json.dumps(rows, indent=1, default=str))
        print(f"g{group} {kind} at int8: median {r['kld_median']:.5f} p99 {r['kld_p99']:.4f} top-1 "
              f"{r['top1_agreement']:.2%} per token {r['bytes_per_token'] / 1e6:.0f} MB", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
