#!/bin/bash
# Session 41 (issue 36, item 6): the one table's missing cells on the off-grid reference (the permuted 1.5B of session
# 37, seed 0), on the Zen 4 host of sessions 38-40. Run from the repository root; the machine to itself.
# 1. GPTQ g128 (calibrated here, first) and GPTQ-mixed g128 (the same codes, the same int8 budget as g32): KLD on the
#    2,048 tokens of the table and on the 8,192.
# 2. HumanEval pass@1, all 164, greedy, batch 8: ours GPTQ g128 and GPTQ-mixed g128; llama-server at Q4_K_M with its
#    importance matrix, IQ4_XS, IQ4_XS with its importance matrix (the cells session 40 left "not run").
# 3. Single stream, three passes (bench/peers.py, fresh processes, 64 new tokens, median of 3): the g128 rows beside
#    GPTQ-mixed g32 and llama.cpp's Q4_K_M with and without its matrix, each pass's ratios within the pass.
# Stopped (by PID) during step 1, which was left to finish; the rest ran in run2.sh, run3.sh, run4.sh and run5.sh.
D=docs/runs/2026-12-07/session41-g128
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
QM=".venv/bin/python bench/quality_matched.py --model $P --no-probe --no-shipped --no-weight-check"
(lscpu; uptime; git rev-parse HEAD) > $D/machine.txt
date; { time $QM --tokens 2048 --parts ours --group-sizes 128 --no-int8 --methods gptq,gptq-mixed --out $D/qm-g128; } > $D/qm-g128.log 2>&1
date; $QM --tokens 8192 --parts ours --group-sizes 128 --no-int8 --methods gptq,gptq-mixed --out $D/qm8k-g128 > $D/qm8k-g128.log 2>&1
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
