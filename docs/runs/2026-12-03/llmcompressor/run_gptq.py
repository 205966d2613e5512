import sys, time, torch
sys.path.insert(0, "/tmp/llmc-study/scripts")
from common import rand_ds
from transformers import AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
from compressed_tensors.quantization import QuantizationScheme, QuantizationArgs

variant = sys.argv[1]
src = "/tmp/llmc-study/tiny-qwen2"
out = f"/tmp/llmc-study/out-gptq-{variant}"
if variant == "w4a16":          # preset: symmetric int4, group 128, actorder static (default)
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
elif variant in ("g32-group", "g32-weight"):
    act = variant.split("-")[1]
    recipe = GPTQModifier(ignore=["lm_head"], actorder=act, config_groups={
        "group_0": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=True, strategy="group", group_size=32))})
elif variant == "g32-asym":
    recipe = GPTQModifier(ignore=["lm_head"], actorder="weight", config_groups={
        "group_0": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=False, strategy="group", group_size=32))})
model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
ds = rand_ds(16, 128, model.config.vocab_size)
t = time.time()
oneshot(model=model, dataset=ds, recipe=recipe, num_calibration_samples=16, max_seq_length=128)
t1 = time.time()
model.save_pretrained(out, save_compressed=True)
print(f"ONESHOT_SECONDS {t1-t:.2f}  SAVE_SECONDS {time.time()-t1:.2f}")
