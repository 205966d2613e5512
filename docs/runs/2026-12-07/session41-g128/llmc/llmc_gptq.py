"""llm-compressor's GPTQ (oneshot, CPU) on the 0.5B, asymmetric int4 per group of 128 (our int4-gptq-g128's
format), act-order "weight" (its static groups, as ours), the head left dense (tied to the embedding), its other
settings at their defaults (dampening 0.01), on the lab's calibration documents (dump_docs.py). The model runs in
fp32 as ours calibrates; its scales are kept in fp16 (scale_dtype), which our kernels hold (fp32 scales are refused
by our loader: they do not fit fp16 exactly). Saved compressed
(pack-quantized), with the source folder's tokenizer files, for `int4-checkpoint-g128`. Run in a venv holding
llmcompressor 0.14 (torch 2.13.0 CPU):
  /tmp/llmc/bin/python llmc_gptq.py DOCS.json OUT_FOLDER
"""
import json
import shutil
import sys
import time
from pathlib import Path

import torch
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
from transformers import AutoModelForCausalLM

src = json.loads(Path(sys.argv[1]).read_text())
out = Path(sys.argv[2])
folder, docs = Path(src["folder"]), src["docs"]
t0 = time.time()
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
ds = Dataset.from_dict({"input_ids": docs, "attention_mask": [[1] * len(d) for d in docs]})
recipe = GPTQModifier(ignore=["lm_head"], actorder="weight", config_groups={"group_0": QuantizationScheme(
    targets=["Linear"], weights=QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group",
                                                 group_size=128, scale_dtype=torch.float16))})
t = time.time()
oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=len(docs), max_seq_length=512)
print(f"ONESHOT_SECONDS {time.time() - t:.1f} documents {len(docs)} tokens {sum(map(len, docs))}", flush=True)
model.save_pretrained(out, save_compressed=True)
for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
    if (folder / f).exists():
        shutil.copy(folder / f, out / f)
print(f"TOTAL_SECONDS {time.time() - t0:.1f} saved {out}", flush=True)
