#!/bin/bash
# Session 41, after run.sh's first step (run.sh was stopped there, by PID, so that the quality questions are answered
# before the long pass@1 and speed steps): run.sh's remaining steps in this order, plus GPTQ g64 and the frontier.
# 1. KLD on 8,192 tokens: GPTQ g128 and GPTQ-mixed g128 (run.sh's step 2).
# 2. GPTQ g64 (calibrated here) and GPTQ-mixed g64 on the 2,048 tokens.
# 3. frontier.py: GPTQ-mixed at int8 budgets 0-0.60 at groups 32, 64 and 128 (frontier.json, frontier.log).
# 4. HumanEval pass@1 and three single-stream passes (run.sh's steps 3 and 4, unchanged).
# Stopped (by PID) once step 3 had started, which was left to finish; step 4 ran in run3.sh (pass@1), run4.sh and
# run5.sh (single stream).
D=docs/runs/2026-12-07/session41-g128
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
QM=".venv/bin/python bench/quality_matched.py --model $P --no-probe --no-shipped --no-weight-check"
while kill -0 "$1" 2>/dev/null; do sleep 5; done  # run.sh's first step, still running when run.sh was stopped
date; $QM --tokens 8192 --parts ours --group-sizes 128 --no-int8 --methods gptq,gptq-mixed --out $D/qm8k-g128 > $D/qm8k-g128.log 2>&1
date; { time $QM --tokens 2048 --parts ours --group-sizes 64 --no-int8 --methods gptq,gptq-mixed --out $D/qm-g64; } > $D/qm-g64.log 2>&1
date; .venv/bin/python $D/frontier.py $D/frontier.json 32:0,0.05,0.1,0.15,0.25 64:0.1,0.25,0.4 128:0.1,0.25,0.4,0.6 > $D/frontier.log 2>&1
store=$(mktemp -d)
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model $P --precisions int4-gptq-g128,int4-gptq-mixed-g128 \
    --subset full --batch 8 --llama Q4_K_M-imatrix,IQ4_XS,IQ4_XS-imatrix > $D/accuracy-full.md 2> $D/accuracy-full.progress.txt
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine runs --json > $D/accuracy-records.json 2>/dev/null
rm -rf "$store"
LABELS="serving-cost-lab int4 gptq g128,serving-cost-lab int4 gptq-mixed g128,serving-cost-lab int4 gptq-mixed g32"
LABELS="$LABELS,llama.cpp Q4_K_M-requant,llama.cpp Q4_K_M-imatrix"
for i in 1 2 3; do
  date; .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-g128,int4-gptq-mixed-g128,int4-gptq-mixed-g32 \
      --llama Q4_K_M-requant,Q4_K_M-imatrix --labels "$LABELS" --out $D/speed-$i > $D/speed-$i.log 2>&1
done
date; uptime
