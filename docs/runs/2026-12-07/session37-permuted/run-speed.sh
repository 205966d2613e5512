#!/bin/bash
# Session 37: single-stream speed on the permuted 1.5B: the quality-matched int4 (GPTQ-mixed g32, version 3),
# int4 g32 and llama.cpp's Q4_K_M quantized from the same folder; each in a fresh process, 64 new tokens, median of 3.
D=docs/runs/2026-12-07/session37-permuted
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
uptime > $D/speed-machine.txt
for pass in 1 2; do
  .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-mixed-g32,int4-g32 --llama Q4_K_M-requant \
      --labels "llama.cpp Q4_K_M-requant,serving-cost-lab int4 gptq-mixed g32,serving-cost-lab int4 g32" \
      --out $D/speed-$pass > $D/speed-$pass.log 2>&1
done
uptime >> $D/speed-machine.txt
