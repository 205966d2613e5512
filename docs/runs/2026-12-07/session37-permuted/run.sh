#!/bin/bash
# Session 37: the 1.5B's off-grid reference (its hidden dimensions permuted, seed 0) and every quality row on it.
# Run from the repository root; each step writes its own folder beside this file.
set -x
D=docs/runs/2026-12-07/session37-permuted
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
QM=".venv/bin/python bench/quality_matched.py --model $P --tokens 2048 --no-probe --no-shipped --no-weight-check"
date; .venv/bin/python bench/permuted_model.py --model default --seed 0 --out $D/1p5b || exit 1
date; $QM --parts ours --group-sizes 32,64 --methods rtn --out $D/qm-ours-rtn
date; $QM --parts llama --llama-types Q4_K_M-imatrix,IQ4_XS-imatrix --out $D/qm-llama
date; $QM --parts ours --group-sizes 32 --no-int8 --methods gptq,awq --out $D/qm-ours-calibrated
date; $QM --parts ours --group-sizes 32 --no-int8 --methods gptq-mixed --out $D/qm-ours-mixed
date
