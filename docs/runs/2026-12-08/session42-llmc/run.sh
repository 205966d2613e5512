#!/bin/bash
# Session 42 (issue 36, items 2 and 6): GPTQ by llm-compressor through the lab (`int4-gptq-llmc`, engine/quant/llmc.py,
# `make llmc`) on the off-grid reference (the permuted 1.5B of session 37, seed 0), the Zen 4 host of sessions 38-41.
# The lab's defaults on both sides: the head quantized too (session 41 compared the two with the head dense).
# 1. g128: calibrated here (first), KLD on the table's 2,048 tokens, then on the 8,192.
# 2. g32: the same.
# 3. HumanEval pass@1, all 164, greedy, batch 8: both.
# Run from the repository root; the machine to itself.
D=docs/runs/2026-12-08/session42-llmc
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
QM=".venv/bin/python bench/quality_matched.py --model $P --no-probe --no-shipped --no-weight-check"
(lscpu; uptime; git rev-parse HEAD) > $D/machine.txt
for g in 128 32; do
  date; { time $QM --tokens 2048 --parts ours --group-sizes $g --no-int8 --methods gptq-llmc --out $D/qm-g$g; } > $D/qm-g$g.log 2>&1
  date; $QM --tokens 8192 --parts ours --group-sizes $g --no-int8 --methods gptq-llmc --out $D/qm8k-g$g > $D/qm8k-g$g.log 2>&1
done
store=$(mktemp -d)
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model $P --precisions int4-gptq-llmc-g128,int4-gptq-llmc-g32 \
    --subset full --batch 8 > $D/accuracy-full.md 2> $D/accuracy-full.progress.txt
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine runs --json > $D/accuracy-records.json 2>/dev/null
rm -rf "$store"
date; uptime
