"""llm-compressor's GPTQ `oneshot`, run by the Python of .venv-llmc (`make llmc`), never imported by the lab.

Its pins clash with the lab's (transformers <= 5.17), so engine/quant/llmc.py runs this file in that venv:
  .venv-llmc/bin/python engine/quant/llmc_driver.py JOB.json
JOB.json: {"folder": the model's safetensors folder, "docs": [[token ids]...] (the lab's calibration documents),
"group_size": 32|64|128, "quantize_head": bool, "out": folder to save into}. The scheme is the one our kernels run:
asymmetric int4 per group, fp16 scales (our loader refuses scales fp16 cannot hold), act-order with static groups
(`actorder="weight"`); every other setting at llm-compressor's defaults, as a user who runs it gets them. A tied
head is untied first, so quantizing it leaves the embedding dense (as the lab's own GPTQ does).
Prints `SCL_PROGRESS i/N` as calibration reaches decoder layer i, and `SCL_DONE {json}` when saved.
"""
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import torch
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
from transformers import AutoModelForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    folder, out, docs = Path(job["folder"]), Path(job["out"]), job["docs"]
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if job["quantize_head"] and getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    layers = model.model.layers
    seen: set[int] = set()

    def reached(i):
        def hook(*_):
            if i not in seen:
                seen.add(i)
                print(f"SCL_PROGRESS {i + 1}/{len(layers)}", flush=True)
        return hook

    handles = [blk.register_forward_pre_hook(reached(i)) for i, blk in enumerate(layers)]
    ds = Dataset.from_dict({"input_ids": docs, "attention_mask": [[1] * len(d) for d in docs]})
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=False, strategy="group", group_size=int(job["group_size"]),
        scale_dtype=torch.float16))
    recipe = GPTQModifier(ignore=[] if job["quantize_head"] else ["lm_head"], actorder="weight",
                          config_groups={"group_0": scheme})
    oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=len(docs),
            max_seq_length=max(map(len, docs)))
    for h in handles:
        h.remove()
    model.save_pretrained(out, save_compressed=True)
    for f in TOKENIZER_FILES:
        if (folder / f).exists():
            (out / f).write_bytes((folder / f).read_bytes())
    tools = {p: version(p) for p in ("llmcompressor", "compressed-tensors", "transformers", "torch")}
    print("SCL_DONE " + json.dumps({"seconds": round(time.time() - t0, 1), "tools": tools}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
