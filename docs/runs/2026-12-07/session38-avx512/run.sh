#!/bin/bash
# Session 38: issue 36's speed half on an AVX-512 + VNNI host (AMD EPYC, 2 cores), and a cross-host check of
# session 37's GPTQ-mixed quality row. Run from the repository root; each step writes its own folder beside this.
# Part 1 (no llama.cpp): the permuted 1.5B (the off-grid reference), GPTQ v3 calibrated on it and GPTQ-mixed g32's
# KLD on the same 2,048 eval tokens as session 37 (calibration is deterministic: the row should repeat).
set -x
D=docs/runs/2026-12-07/session38-avx512
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
QM=".venv/bin/python bench/quality_matched.py --model $P --tokens 2048 --no-probe --no-shipped --no-weight-check"
(lscpu; uptime) > $D/machine.txt
date; .venv/bin/python bench/permuted_model.py --model default --seed 0 --out $D/1p5b || exit 1
date; $QM --parts ours --group-sizes 32 --no-int8 --methods gptq-mixed --out $D/qm-ours-mixed
date
# Part 1b (after the speed, profile and accuracy scripts): llama.cpp's Q4_K_M of the same folder on this host's
# eval (its quantizer is deterministic; the row checks that the eval repeats across hosts), and round-to-nearest g32.
date; $QM --parts llama --out $D/qm-llama
date; $QM --parts ours --group-sizes 32 --no-int8 --methods rtn --out $D/qm-ours-rtn
date
date; $QM --parts ours --group-sizes 32 --no-int8 --methods gptq --out $D/qm-ours-gptq
date
# Part 1c, after the fix of 41963f9 (the load that calibrated a mixed model quantized its int8 linears from the int4
# values calibration leaves in the blocks; qm-ours-mixed-first-load-bug/ is that load's row): the same row again.
date; $QM --parts ours --group-sizes 32 --no-int8 --methods gptq-mixed --out $D/qm-ours-mixed
date
