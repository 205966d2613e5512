import sys, time, torch
sys.path.insert(0, "/tmp/llmc-study/scripts")
from common import rand_ds
from transformers import AutoConfig, AutoModelForCausalLM
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
t0 = time.time()
cfg = AutoConfig.for_model("qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
    tie_word_embeddings=True)
DT = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[1] if len(sys.argv) > 1 else "bf16"]
torch.set_default_dtype(DT)
model = AutoModelForCausalLM.from_config(cfg)
torch.set_default_dtype(torch.float32)
print(f"BUILD_SECONDS {time.time()-t0:.1f} params {sum(p.numel() for p in model.parameters())/1e9:.3f}B dtype {model.dtype}", flush=True)
# oneshot needs a processor whenever a dataset is passed; with a from_config model
# config._name_or_path is "" and it raises. Point it at a folder holding the config
# (transformers 5 then builds a placeholder Qwen2Tokenizer, unused for pre-tokenized data).
cfg.save_pretrained("/tmp/llmc-study/big-cfg"); model.config._name_or_path = "/tmp/llmc-study/big-cfg"
ds = rand_ds(32, 512, cfg.vocab_size)
t = time.time()
oneshot(model=model, dataset=ds, num_calibration_samples=32, max_seq_length=512,
        recipe=GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]))
print(f"ONESHOT_SECONDS {time.time()-t:.1f}", flush=True)
