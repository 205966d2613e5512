#!/bin/bash
# Session 38, part 5: under load (bench/under_load.py: vLLM's client, concurrency 8, 32 requests of 128 random
# tokens, 128 out), the permuted 1.5B: ours GPTQ-mixed g32 (this host's calibration) and int4 g32 against
# llama-server Q4_K_M quantized from the same folder; each server alone, two passes.
D=docs/runs/2026-12-07/session38-avx512
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
for pass in 1 2; do
  .venv/bin/python bench/under_load.py --model $P --ours int4-gptq-mixed-g32,int4-g32 --llama Q4_K_M-requant \
      --out $D/under-load-$pass > $D/under-load-$pass.log 2>&1
done
