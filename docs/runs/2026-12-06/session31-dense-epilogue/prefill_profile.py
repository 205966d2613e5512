"""The fused step's phase timers over a 256-token bf16 prefill of the 0.5B (mean over threads, per prefill)."""
import sys

sys.path.insert(0, ".")
import bench.batch_step as bs  # noqa: E402
from engine.ops import fused  # noqa: E402

lm = bs.load("default-draft", bs.make_spec("bf16"), "cpu")
bs.prefill_ms(lm, 256, 2)
fused.fused_profile(lm.model, True, True)
print(f"prefill of 256 tokens: {bs.prefill_ms(lm, 256, 5):.1f} ms (min of 5)\n")
prof = fused.fused_profile(lm.model, False, False)
tot: dict = {}
for t in prof["threads"]:
    for k, v in t.items():
        tot[k] = tot.get(k, 0) + v
n = len(prof["threads"])
print("| phase | ms per prefill |\n| --- | ---: |")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f"| {k} | {v / n / 5 * 1e3:.1f} |")
