#!/bin/bash
# Session 41, after run.sh's first step, run2.sh's first three and kinds.py / policy.py (run2.sh was stopped, by PID,
# once its frontier had started, so that kinds.py and policy.py, KLD only, could run beside it; a first start of this
# script was stopped after a minute for policy.py). The machine to itself from here:
# 1. HumanEval pass@1, all 164, greedy, batch 8: ours GPTQ g128; llama-server at Q4_K_M with its importance matrix,
#    IQ4_XS and IQ4_XS with its importance matrix (the table's cells session 40 left "not run").
# 2. (Refused before measuring: a label GPTQ-mixed g64 does not carry; run4.sh runs it.) Single stream, three passes (bench/peers.py, fresh processes, 64 new tokens, median of 3): GPTQ g128 (the
#    table's row), GPTQ-mixed g64 (1,087 MB per token) and g32 (1,153 MB), llama.cpp Q4_K_M with and without its
#    matrix (980 MB), each pass's ratios within the pass.
D=docs/runs/2026-12-07/session41-g128
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
store=$(mktemp -d)
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model $P --precisions int4-gptq-g128 \
    --subset full --batch 8 --llama Q4_K_M-imatrix,IQ4_XS,IQ4_XS-imatrix > $D/accuracy-full.md 2> $D/accuracy-full.progress.txt
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine runs --json > $D/accuracy-records.json 2>/dev/null
rm -rf "$store"
LABELS="serving-cost-lab int4 gptq g128,serving-cost-lab int4 gptq-mixed g64,serving-cost-lab int4 gptq-mixed g32"
LABELS="$LABELS,llama.cpp Q4_K_M-requant,llama.cpp Q4_K_M-imatrix"
for i in 1 2 3; do
  date; .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-g128,int4-gptq-mixed-g64,int4-gptq-mixed-g32 \
      --llama Q4_K_M-requant,Q4_K_M-imatrix --labels "$LABELS" --out $D/speed-$i > $D/speed-$i.log 2>&1
done
date; uptime
