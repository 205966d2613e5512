"""Which of our GPTQ's choices costs it against llm-compressor's on the 0.5B at g128 (compare.py): our GPTQ with
llm-compressor's settings one at a time, the rest ours. Ours: H shrunk 25% toward its diagonal (SHRINK), damped by 0.1
of its mean diagonal (DAMP), each group's clip ratio searched (GRID); llm-compressor: no shrink, damping 0.01, min/max
groups. Each variant calibrates into a temporary cache (the lab's cache untouched), on the same documents, scored
as compare.py scores. Run with the lab's venv:
  .venv/bin/python docs/runs/2026-12-07/session41-g128/llmc/variants.py OUT.json VARIANT ...
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
from engine.quant import gptq  # noqa: E402
from engine.quant.convert import make_spec  # noqa: E402

NAME = "qwen2.5-coder-0.5b"
VARIANTS = {  # name: (shrink, damp, clip ratios)
    "lab": (gptq.SHRINK, gptq.DAMP, gptq.GRID),
    "damp 0.01, no shrink": (0.0, 0.01, gptq.GRID),
    "min/max groups": (gptq.SHRINK, gptq.DAMP, [1.0]),
    "damp 0.01, no shrink, min/max groups": (0.0, 0.01, [1.0]),
}


def main(out: Path, names: list[str]) -> None:
    folder = resolve("default-draft")
    docs = eval_docs(load_tokenizer(folder), 2048)
    ref = quality.load_reference(quality.ensure_reference(NAME, folder, docs, None, print), docs)
    rows = json.loads(out.read_text()) if out.exists() else {}
    grid_defaults, gptq_defaults = gptq.group_grid.__defaults__, gptq.gptq_quantize.__wrapped__.__defaults__
    for name in names:
        shrink, damp, ratios = VARIANTS[name]
        gptq.group_grid.__defaults__ = grid_defaults[:-1] + (ratios,)  # (importance, symmetric, ratios)
        gptq.gptq_quantize.__wrapped__.__defaults__ = (gptq_defaults[0], damp, shrink) + gptq_defaults[3:]
        with tempfile.TemporaryDirectory() as tmp:
            calibrate.cache_dir = lambda tmp=tmp: Path(tmp)
            t = time.time()
            lm = load("default-draft", make_spec("int4-gptq", 128, quantize_head=False), "cpu", print)
            r = quality.results(quality.score_model(lm, docs, ref), docs)
        rows[name] = {k: r.get(k) for k in ("kld_mean", "kld_median", "kld_p99", "top1_agreement")} | {
            "shrink": shrink, "damp": damp, "ratios": list(ratios), "seconds": round(time.time() - t)}
        del lm
        out.write_text(json.dumps(rows, indent=1))
        print(f"{name}: mean {r['kld_mean']:.4f} median {r['kld_median']:.5f} p99 {r['kld_p99']:.4f} "
              f"top-1 {r['top1_agreement']:.2%}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
