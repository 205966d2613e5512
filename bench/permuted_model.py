"""An off-grid reference: a catalog model with its hidden dimensions permuted (engine.quant.permute).

    .venv/bin/python bench/permuted_model.py --model default --seed 0 --out docs/runs/<date>/permuted
    .venv/bin/python bench/quality_matched.py --model <the folder it prints> ...

The shipped Q4_K_M dequantized lies on Q4_K's grid, so llama.cpp's requantization copies it; the permuted
folder computes the same function with every weight sub-block off that grid. This writes the folder into
the lab's cache (once per seed) and checks the function: the fp32 references of the source and of the
permuted folder on the same eval tokens (engine.measure.quality, cached) must agree on every top-1 and on
log p(next token) to fp32 rounding. Writes <out>/permuted_model.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.common.errors import UserError  # noqa: E402

MAX_TARGET_LP_DIFF = 1e-3  # |log p(next)| between source and permuted, fp32 reductions in another order


def permuted_folder(model: str, seed: int, progress=None) -> Path:
    """The cached permuted copy of `model` (a catalog name or a folder), written first if needed."""
    from engine.common.paths import cache_dir
    from engine.infer.catalog import resolve
    from engine.quant.permute import write_permuted

    src = resolve(model, progress)
    return write_permuted(src, cache_dir() / "permuted" / f"{src.name}-seed{seed}", seed, progress)


def same_function(model: str, folder: Path, tokens: int, progress=None) -> dict:
    """The fp32 references of `model` and of its permuted `folder` on the same `tokens` eval tokens, compared."""
    from engine.infer.catalog import canonical_name, resolve
    from engine.infer.loader import load_tokenizer
    from engine.measure import quality
    from engine.measure.eval_text import eval_docs

    src = resolve(model, progress)
    docs = eval_docs(load_tokenizer(src), tokens)
    if [d.ids for d in docs] != [d.ids for d in eval_docs(load_tokenizer(folder), tokens)]:
        raise UserError("the permuted folder tokenizes the eval text differently", "rebuild it from the source")
    a = quality.load_reference(quality.ensure_reference(canonical_name(model), src, docs, progress=progress), docs)
    b = quality.load_reference(quality.ensure_reference(str(folder), folder, docs, progress=progress), docs)
    diff = (a.target_lp - b.target_lp).abs()
    out = {"positions": a.positions, "top1_agreement": float((a.top1 == b.top1).float().mean()),
           "target_lp_max_abs_diff": float(diff.max()), "target_lp_mean_abs_diff": float(diff.mean())}
    out["same"] = out["top1_agreement"] == 1.0 and out["target_lp_max_abs_diff"] < MAX_TARGET_LP_DIFF
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=2048, help="eval tokens the function check scores")
    ap.add_argument("--out", default=None, help="folder for permuted_model.json")
    a = ap.parse_args(argv)
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.time()
    folder = permuted_folder(a.model, a.seed, say)
    say(f"[{time.time() - t0:5.0f}s] permuted folder: {folder}")
    rep = {"command": "bench/permuted_model.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": a.model, "seed": a.seed, "folder": str(folder),
           "check": same_function(a.model, folder, a.tokens, say), "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(rep, indent=1))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "permuted_model.json").write_text(json.dumps(rep, indent=1))
    return 0 if rep["check"]["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
