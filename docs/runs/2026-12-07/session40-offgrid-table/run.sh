#!/bin/bash
# Session 40 (issue 36, item 6): the one table for the 1.5B on the off-grid reference (the permuted folder of session
# 37, seed 0), every cell measured on this host (the Zen 4 of sessions 38-39) with one commit. Run from the repository
# root; the machine to itself. Each step writes its own folder or file beside this script; then table.py.
# 1. KLD on session 37's 2,048 eval tokens: round-to-nearest g32/g64 and int8; GPTQ g32 and GPTQ-mixed g32 (the
#    cached codes of session 38); llama.cpp Q4_K_M, Q4_K_M + importance matrix, IQ4_XS, IQ4_XS + importance matrix,
#    each quantized by llama.cpp's own tools from the folder's F32 GGUF; AWQ g32 (calibrated here, first).
# 2. Single stream (bench/peers.py, fresh processes, 64 new tokens, median of 3), pass 1.
# 3. HumanEval pass@1, all 164, greedy, batch 8: ours round-to-nearest g32, g64, int8, AWQ g32; llama-server at the
#    requantized Q4_K_M. (GPTQ g32 and GPTQ-mixed g32: session 38's and 39's runs of the same codes on this host.)
# 4. Single stream, pass 2.
D=docs/runs/2026-12-07/session40-offgrid-table
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
QM=".venv/bin/python bench/quality_matched.py --model $P --tokens 2048 --no-probe --no-shipped --no-weight-check"
OURS=int4-g32,int4-gptq-g32,int4-awq-g32,int4-gptq-mixed-g32
LLAMA=Q4_K_M-requant,Q4_K_M-imatrix,IQ4_XS,IQ4_XS-imatrix
LABELS="serving-cost-lab int8,serving-cost-lab int4,serving-cost-lab int4 g32,serving-cost-lab int4 gptq g32"
LABELS="$LABELS,serving-cost-lab int4 awq g32,serving-cost-lab int4 gptq-mixed g32,llama.cpp Q4_K_M-requant"
LABELS="$LABELS,llama.cpp Q4_K_M-imatrix,llama.cpp IQ4_XS,llama.cpp IQ4_XS-imatrix"
(lscpu; uptime; git rev-parse HEAD) > $D/machine.txt
date; $QM --parts ours --group-sizes 32,64 --methods rtn --out $D/qm-ours-rtn > $D/qm-ours-rtn.log 2>&1
date; $QM --parts ours --group-sizes 32 --no-int8 --methods gptq,gptq-mixed --out $D/qm-ours-gptq > $D/qm-ours-gptq.log 2>&1
date; $QM --parts llama --llama-types Q4_K_M-imatrix,IQ4_XS,IQ4_XS-imatrix --out $D/qm-llama > $D/qm-llama.log 2>&1
date; { time $QM --parts ours --group-sizes 32 --no-int8 --methods awq --out $D/qm-ours-awq; } > $D/qm-ours-awq.log 2>&1
date; .venv/bin/python bench/quality_matched.py --out $D/merged --merge $D/qm-ours-rtn/quality_matched.json \
    $D/qm-ours-gptq/quality_matched.json $D/qm-ours-awq/quality_matched.json $D/qm-llama/quality_matched.json \
    --note "Merged from four runs of one commit on this host (session 40, $D/run.sh)." > $D/merged.log 2>&1
run_speed() {
  .venv/bin/python bench/peers.py --model $P --no-ab --ours $OURS --llama $LLAMA --labels "$LABELS" \
      --out $D/speed-$1 > $D/speed-$1.log 2>&1
}
date; run_speed 1
store=$(mktemp -d)
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model $P --precisions int4-g32,int4,int8,int4-awq-g32 \
    --subset full --batch 8 --llama Q4_K_M-requant > $D/accuracy-full.md 2> $D/accuracy-full.progress.txt
date; SCL_DATA_DIR="$store" .venv/bin/python -m engine runs --json > $D/accuracy-records.json 2>/dev/null
rm -rf "$store"
date; run_speed 2
date; uptime
