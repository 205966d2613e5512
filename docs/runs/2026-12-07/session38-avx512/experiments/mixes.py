"""Cheaper mixes than GPTQ-mixed's 25% byte budget, on this host's GPTQ v3 g32 calibration of the permuted 1.5B
(one calibration: a draw, docs/BENCHMARKS.md session 38). Each variant loads int4-gptq-mixed-g32 with the set of
linears kept at int8 chosen here instead of by calibrate.mixed_selection, and is scored on the same 2,048 eval
tokens against the same cached fp32 reference (engine.measure.quality.evaluate).

    .venv/bin/python docs/runs/2026-12-07/session38-avx512/experiments/mixes.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))

from engine.infer import calibrate  # noqa: E402
from engine.infer.loader import load  # noqa: E402
from engine.measure.quality import evaluate  # noqa: E402

P = str(Path.home() / ".cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0")
LAYERS = 28
chosen = calibrate.mixed_selection


def q4km_rule(errors, params):
    """llama.cpp Q4_K_M's rule at our int8: v_proj everywhere, down_proj in the first and last eighth and every
    third layer between (use_more_bits), and the head."""
    more = {i for i in range(LAYERS) if i < LAYERS // 8 or i >= 7 * LAYERS // 8 or (i - LAYERS // 8) % 3 == 2}
    return {n for n in params if n.endswith("v_proj") or n == "lm_head"
            or (n.endswith("down_proj") and int(n.split(".")[2]) in more)}


VARIANTS = {
    "mixed, 25% budget (the lab's)": lambda e, p: chosen(e, p),
    "mixed, 10% budget": lambda e, p: chosen(e, p, budget=0.10),
    "mixed, 5% budget": lambda e, p: chosen(e, p, budget=0.05),
    "head at int8 only": lambda e, p: {"lm_head"},
    "Q4_K_M's rule at int8 (v, some down, head)": q4km_rule,
    "none (plain GPTQ g32)": lambda e, p: set(),
}
print("| variant | int8 linears | weight MB | KLD median | p99 | same top-1 | KL mean |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for label, pick in VARIANTS.items():
    calibrate.mixed_selection = pick
    lm = load(P, "int4-gptq-mixed-g32", "cpu")
    q = evaluate(lm, 2048)
    print(f"| {label} | {lm.calibration['int8_linears']} | {lm.weight_bytes / 1e6:.0f} | {q['kld_median']:.5f} | "
          f"{q['kld_p99']:.4f} | {100 * q['top1_agreement']:.2f}% | {q['kld_mean']:.4f} |", flush=True)
    del lm
