"""compare.py's two GPTQ g128 rows on the 0.5B (and round-to-nearest), KL by position: our GPTQ's codes had put most
of their KL at position 0 on the 1.5B (session 40). Run with the lab's venv:
  .venv/bin/python docs/runs/2026-12-07/session41-g128/llmc/position0.py LLMC_FOLDER OUT.json
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from engine.infer.catalog import resolve  # noqa: E402
from engine.infer.loader import load, load_tokenizer  # noqa: E402
from engine.measure import quality  # noqa: E402
from engine.measure.eval_text import eval_docs  # noqa: E402
from engine.quant.convert import make_spec  # noqa: E402

folder = resolve("default-draft")
docs = eval_docs(load_tokenizer(folder), 2048)
ref = quality.load_reference(quality.ensure_reference("qwen2.5-coder-0.5b", folder, docs, None, print), docs)
out = {}
for label, model, spec in [("ours round-to-nearest", "default-draft", make_spec("int4", 128, quantize_head=False)),
                           ("ours GPTQ", "default-draft", make_spec("int4-gptq", 128, quantize_head=False)),
                           ("llm-compressor GPTQ", sys.argv[1], make_spec("int4-checkpoint", 128))]:
    prof = quality.position_profile(quality.score_model(load(model, spec, "cpu"), docs, ref), docs)
    out[label] = prof
    print(label, json.dumps(prof)[:600], flush=True)
Path(sys.argv[2]).write_text(json.dumps(out, indent=1, default=str))
