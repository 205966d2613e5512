"""The lab's calibration documents for the 0.5B (engine.infer.calibrate.calibration_docs, 8,192 tokens) as token
ids, so llm-compressor calibrates on exactly the text our GPTQ reads (MODEL: a catalog name or a folder; default the
0.5B). Run with the lab's venv:
  .venv/bin/python docs/runs/2026-12-07/session41-g128/llmc/dump_docs.py OUT.json [MODEL]
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from engine.infer.calibrate import calibration_docs  # noqa: E402
from engine.infer.catalog import resolve  # noqa: E402
from engine.infer.loader import load_tokenizer  # noqa: E402

folder = resolve(sys.argv[2] if len(sys.argv) > 2 else "default-draft")
docs = calibration_docs(load_tokenizer(folder))
Path(sys.argv[1]).write_text(json.dumps({"folder": str(folder), "docs": docs}))
print(f"{len(docs)} documents, {sum(map(len, docs))} tokens, from {folder}")
