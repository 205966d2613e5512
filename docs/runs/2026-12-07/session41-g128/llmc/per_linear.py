"""Where our GPTQ g128 and llm-compressor's part on the 0.5B (compare.py's two sets of codes): each linear's output
error tr(dW H dWᵀ) / tr(W H Wᵀ) against the fp32 weights, H the mean x xᵀ of that linear's inputs in the fp32 model
on the 2,048 eval tokens (held out from both calibrations). Prints the median per kind and the layers where the two
differ most. Run with the lab's venv:
  .venv/bin/python docs/runs/2026-12-07/session41-g128/llmc/per_linear.py LLMC_FOLDER OUR_CACHE_ENTRY OUT.json
"""
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from engine.infer.catalog import resolve  # noqa: E402
from engine.infer.loader import load_tokenizer  # noqa: E402
from engine.infer.model import build_model  # noqa: E402
from engine.measure.eval_text import eval_docs  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


def dense(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    q = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1).float()
    g = q.shape[1] // scales.shape[1]
    return q * scales.float().repeat_interleave(g, 1) + mins.float().repeat_interleave(g, 1)


@torch.no_grad()
def main(llmc: str, ours: str, out: Path) -> None:
    folder = resolve("default-draft")
    docs = eval_docs(load_tokenizer(folder), 2048)
    model = build_model(folder)
    theirs = build_model(Path(llmc)).checkpoint_codes
    mine = load_file(str(Path(ours) / "codes.safetensors"))
    names = sorted(n for n in theirs if n != "lm_head")
    mods = dict(model.named_modules())
    grams, rows = {n: 0 for n in names}, {n: 0 for n in names}

    def hook(n):
        def add(_m, args):
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            grams[n] = grams[n] + x.T @ x
            rows[n] += x.shape[0]
        return add
    hs = [mods[n].register_forward_pre_hook(hook(n)) for n in names]
    for d in docs:
        ids = list(d.ids)
        model(torch.tensor([ids]), 0, model.new_cache(1, len(ids) + 1))
    for h in hs:
        h.remove()
    res = {}
    for n in names:
        H, w = grams[n] / rows[n], mods[n].weight.float()
        sig = float(((w @ H) * w).sum())
        err = {}
        for who, c in (("ours", [mine[f"{n}.{p}"] for p in ("packed", "scales", "mins")]), ("llmc", theirs[n])):
            dw = w - dense(*c)
            err[who] = float(((dw @ H) * dw).sum()) / sig
        res[n] = err
    out.write_text(json.dumps(res, indent=1))
    kinds = sorted({n.rsplit(".", 1)[1] for n in names})
    for k in kinds:
        r = [res[n]["ours"] / res[n]["llmc"] for n in names if n.endswith(k)]
        print(f"{k}: ours / llm-compressor error, median {statistics.median(r):.2f} "
              f"(min {min(r):.2f}, max {max(r):.2f})")
    worst = sorted(names, key=lambda n: res[n]["ours"] / res[n]["llmc"], reverse=True)[:8]
    for n in worst:
        print(f"{n}: ours {res[n]['ours']:.5f} llm-compressor {res[n]['llmc']:.5f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
