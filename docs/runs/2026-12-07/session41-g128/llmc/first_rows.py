"""Our GPTQ g128 (head dense, as compare.py and compare15.py) with each document's first rows weighted otherwise in the
Hessian: left out (x0) or counted W times (xW), the rest of the lab's GPTQ unchanged; each variant calibrates into a
temporary cache (the lab's untouched) and is scored as compare.py scores, with KL at positions 0-3 and 4+.
  .venv/bin/python docs/runs/2026-12-07/session41-g128/llmc/first_rows.py OUT.json MODEL FIRST WEIGHT [WEIGHT ...]
MODEL: default-draft (the 0.5B; first_rows.json: `... first_rows.json default-draft 4 0 16`) or the permuted 1.5B's
folder (first_rows15.json: `... first_rows15.json <folder> 4 16`).
"""
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from engine.infer import calibrate  # noqa: E402
from engine.infer.catalog import resolve  # noqa: E402
from engine.infer.loader import load, load_tokenizer  # noqa: E402
from engine.measure import quality  # noqa: E402
from engine.measure.eval_text import eval_docs  # noqa: E402
from engine.quant.convert import make_spec  # noqa: E402

gram = calibrate._add_gram


def main(out: Path, model: str, first: int, weights: list[float]) -> None:
    folder = resolve(model)
    name = "qwen2.5-coder-0.5b" if model == "default-draft" else model
    docs = eval_docs(load_tokenizer(folder), 2048)
    ref = quality.load_reference(quality.ensure_reference(name, folder, docs, None, print), docs)
    rows = json.loads(out.read_text()) if out.exists() else {}
    for w in weights:
        def weighted(acc, x, block=calibrate.GRAM_BLOCK, w=w):  # x: one document's rows, its first rows first
            x = x.clone()
            x[:first] *= w ** 0.5
            gram(acc, x, block)
        calibrate._add_gram = weighted
        with tempfile.TemporaryDirectory() as tmp:
            calibrate.cache_dir = lambda tmp=tmp: Path(tmp)
            t = time.time()
            lm = load(model, make_spec("int4-gptq", 128, quantize_head=False), "cpu")
            sc = quality.score_model(lm, docs, ref)
        r, prof = quality.results(sc, docs), quality.position_profile(sc, docs)
        key = f"first {first} rows x{w:g}"
        rows[key] = {k: r.get(k) for k in ("kld_mean", "kld_median", "kld_p99", "top1_agreement")} | {
            "positions_0_3": [prof[str(p)]["kld_mean"] for p in range(4)], "rest": prof["rest"],
            "seconds": round(time.time() - t)}
        del lm
        out.write_text(json.dumps(rows, indent=1))
        print(f"{key}: median {r['kld_median']:.5f} p99 {r['kld_p99']:.4f} top-1 {r['top1_agreement']:.2%} "
              f"pos 0-3 {[round(v, 3) for v in rows[key]['positions_0_3']]} 4+ {prof['rest']['kld_mean']:.4f}",
              flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), [float(x) for x in sys.argv[4:]])
