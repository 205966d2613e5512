#!/bin/bash
# Session 39, part 5: HumanEval pass@1, all 164, of GPTQ-mixed g32 with its int8 linears on int8 activations (the
# same codes as session 38's run-accuracy.sh), paired problem by problem against session 17's fp32 log of the
# unpermuted 1.5B (the same function) and against session 38's mixed run (int8 linears on fp32 activations).
D=docs/runs/2026-12-07/session39-w8a8
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
store=$(mktemp -d)
date
SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model $P \
    --precisions int4-gptq-mixed-g32 --subset full --batch 8 --no-peers \
    > $D/accuracy-full.md 2> $D/accuracy-full.progress.txt
date
.venv/bin/python docs/runs/2026-12-04/session18-gptq-code-calibration/paired.py \
    docs/runs/2026-12-04/session17-gptq-1p5b/accuracy-full.progress.txt $D/accuracy-full.progress.txt > $D/paired.txt
SCL_DATA_DIR="$store" .venv/bin/python -m engine runs --json > $D/accuracy-records.json 2>/dev/null || true
rm -rf "$store"
date
