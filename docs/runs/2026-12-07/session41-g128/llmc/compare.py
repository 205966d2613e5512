"""Our GPTQ g128 against llm-compressor's on the 0.5B, on equal terms: the same calibration documents
(dump_docs.py), the same format (asymmetric int4 per group of 128, act-order with static groups), the head dense on
both sides; scored on the same 2,048 eval tokens against the same fp32 reference as bench/quality_matched.py scores
its rows. Round-to-nearest g128 (head dense) is the floor both should beat. Run with the lab's venv:
  .venv/bin/python docs/runs/2026-12-07/session41-g128/llmc/compare.py LLMC_FOLDER OUT.json
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from engine.infer.catalog import resolve  # noqa: E402
from engine.infer.loader import load, load_tokenizer  # noqa: E402
from engine.measure import quality  # noqa: E402
from engine.measure.eval_text import eval_docs  # noqa: E402
from engine.quant.convert import make_spec  # noqa: E402

NAME = "qwen2.5-coder-0.5b"


def main(llmc: str, out: Path) -> None:
    folder = resolve("default-draft")
    docs = eval_docs(load_tokenizer(folder), 2048)
    ref = quality.load_reference(quality.ensure_reference(NAME, folder, docs, None, print), docs)
    rows = {}
    for label, model, spec in [
        ("ours int4 g128, round-to-nearest, head dense", "default-draft", make_spec("int4", 128, quantize_head=False)),
        ("ours int4 g128, GPTQ, head dense", "default-draft", make_spec("int4-gptq", 128, quantize_head=False)),
        ("llm-compressor GPTQ g128 (asymmetric, act-order weight), read as int4-checkpoint-g128", llmc,
         make_spec("int4-checkpoint", 128)),
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
