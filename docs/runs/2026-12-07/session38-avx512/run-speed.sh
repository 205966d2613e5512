#!/bin/bash
# Session 38, part 2: single-stream speed on the permuted 1.5B on this AVX-512 + VNNI host, as session 37's
# run-speed.sh on the AVX2 host: the quality-matched int4 (GPTQ-mixed g32, v3), int4 g32 and llama.cpp's Q4_K_M
# quantized from the same folder; each in a fresh process, 64 new tokens, median of 3; two passes. Then where the
# mixed model's decode step goes against int4 g32's (bench/profile_decode.py, the fused step's phase timers).
D=docs/runs/2026-12-07/session38-avx512
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
uptime > $D/speed-machine.txt
for pass in 1 2; do
  .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-mixed-g32,int4-g32 --llama Q4_K_M-requant \
      --labels "llama.cpp Q4_K_M-requant,serving-cost-lab int4 gptq-mixed g32,serving-cost-lab int4 g32" \
      --out $D/speed-$pass > $D/speed-$pass.log 2>&1
done
for prec in int4-gptq-mixed-g32 int4-g32; do  # superseded by run-profile.sh (these two were deleted)
  .venv/bin/python bench/profile_decode.py --model $P --precision $prec --path fused > $D/profile-$prec.txt 2>&1
done
uptime >> $D/speed-machine.txt
