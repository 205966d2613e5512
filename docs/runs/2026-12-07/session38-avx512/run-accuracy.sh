#!/bin/bash
# Session 38, part 4: HumanEval pass@1 (all 164, greedy, batch 8) of GPTQ v3 g32 and GPTQ-mixed g32 on the permuted
# 1.5B, this host's calibration (run.sh), paired problem by problem against session 17's fp32 run of the unpermuted
# 1.5B (the same function: permuted_model.json's fp32 references agree on every top-1 of the eval text; the fp32
# run was not repeated on the permuted folder: 37 minutes).
D=docs/runs/2026-12-07/session38-avx512
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
store=$(mktemp -d)
SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model $P \
    --precisions int4-gptq-g32,int4-gptq-mixed-g32 --subset full --batch 8 --no-peers \
    > $D/accuracy-full.md 2> $D/accuracy-full.progress.txt
.venv/bin/python docs/runs/2026-12-04/session18-gptq-code-calibration/paired.py \
    docs/runs/2026-12-04/session17-gptq-1p5b/accuracy-full.progress.txt $D/accuracy-full.progress.txt > $D/paired.txt
SCL_DATA_DIR="$store" .venv/bin/python -m engine runs --json > $D/accuracy-records.json 2>/dev/null || true
rm -rf "$store"
