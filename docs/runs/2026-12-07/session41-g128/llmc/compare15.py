"""compare.py on the 1.5B's off-grid reference (the permuted folder of session 37): our GPTQ g128 against
llm-compressor's, the same calibration documents (dump_docs.py with that folder), the head dense on both sides,
scored on the 2,048 eval tokens against the folder's cached fp32 reference (bench/quality_matched.py's rows).
  .venv/bin/python docs/runs/2026-12-07/session41-g128/llmc/compare15.py LLMC_FOLDER OUT.json
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from engine.infer.loader import load, load_tokenizer  # noqa: E402
from engine.measure import quality  # noqa: E402
from engine.measure.eval_text import eval_docs  # noqa: E402
from engine.quant.convert import make_spec  # noqa: E402

MODEL = str(Path.home() / ".cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0")


def main(llmc: str, out: Path) -> None:
    docs = eval_docs(load_tokenizer(Path(MODEL)), 2048)
    ref = quality.load_reference(quality.ensure_reference(MODEL, Path(MODEL), docs, None, print), docs)
    rows = json.loads(out.read_text()) if out.exists() else {}
    for label, model, spec in [
        ("llm-compressor GPTQ g128 (asymmetric, act-order weight), read as int4-checkpoint-g128", llmc,
         make_spec("int4-checkpoint", 128)),
        ("ours int4 g128, GPTQ, head dense", MODEL, make_spec("int4-gptq", 128, quantize_head=False)),
    ]:
        t = time.time()
        lm = load(model, spec, "cpu", print)
        r = quality.results(quality.score_model(lm, docs, ref), docs)
        rows[label] = {k: r.get(k) for k in ("kld_mean", "kld_median", "kld_p99", "top1_agreement")} | {
            "precision": lm.spec.label, "calibration": lm.calibration, "weights": dict(lm.weights),
            "seconds": round(time.time() - t)}
        del lm
        out.write_text(json.dumps(rows, indent=1, default=str))
        print(f"{label}: mean {r['kld_mean']:.4f} median {r['kld_median']:.5f} p99 {r['kld_p99']:.4f} "
              f"top-1 {r['top1_agreement']:.2%}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
