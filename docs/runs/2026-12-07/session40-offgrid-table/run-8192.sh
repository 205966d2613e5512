#!/bin/bash
# Session 40, after run.sh: the 8,192 eval tokens (every row above, and every 1.5B quality row since session
# 11, used 2,048 for time) for the rows that decide "quality-matched": llama.cpp Q4_K_M with and without its
# importance matrix, ours GPTQ g32, GPTQ-mixed g32, AWQ g32 and round-to-nearest g32 (the cached codes of run.sh).
# Run from the repository root; the machine to itself.
D=docs/runs/2026-12-07/session40-offgrid-table
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
QM=".venv/bin/python bench/quality_matched.py --model $P --tokens 8192 --no-probe --no-shipped --no-weight-check"
date; $QM --parts ours --group-sizes 32 --no-int8 --methods rtn,gptq,awq,gptq-mixed --out $D/qm8k-ours > $D/qm8k-ours.log 2>&1
date; $QM --parts llama --llama-types Q4_K_M-imatrix --out $D/qm8k-llama > $D/qm8k-llama.log 2>&1
date; .venv/bin/python bench/quality_matched.py --out $D/merged-8192 --merge $D/qm8k-ours/quality_matched.json \
    $D/qm8k-llama/quality_matched.json \
    --note "Merged from two runs of one commit on this host on 8,192 tokens (session 40, $D/run-8192.sh)." \
    > $D/merged-8192.log 2>&1
date; uptime
