import sys, time, torch
sys.path.insert(0, "/tmp/llmc-study/scripts")
from common import rand_ds
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.transform.awq import AWQModifier   # new location (0.14)
from llmcompressor.modifiers.quantization import QuantizationModifier

# --- CPU workaround: AWQ's _apply_smoothing calls IntermediatesCache.pin_memory(), which
# raises "Cannot access accelerator device when none is available." on a CPU-only torch.
# Pinning is only a H2D-transfer optimisation, so make it a no-op without an accelerator.
if not torch.accelerator.is_available():
    from llmcompressor.pipelines.cache import IntermediatesCache
    IntermediatesCache.pin_memory = lambda self, *a, **k: None

src = "/tmp/llmc-study/tiny-qwen2"
out = "/tmp/llmc-study/out-awq-w4a16-asym"
# Qwen2ForCausalLM is in AWQ_MAPPING_REGISTRY -> default_mappings are auto-selected
recipe = [
    AWQModifier(duo_scaling="both"),
    QuantizationModifier(targets=["Linear"], scheme="W4A16_ASYM", ignore=["lm_head"]),
]
model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
ds = rand_ds(16, 128, model.config.vocab_size)
t = time.time()
oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=16, max_seq_length=128)
t1 = time.time()
model.save_pretrained(out, save_compressed=True)
print(f"ONESHOT_SECONDS {t1-t:.2f}  SAVE_SECONDS {time.time()-t1:.2f}")
