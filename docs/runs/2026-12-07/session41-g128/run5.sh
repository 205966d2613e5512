#!/bin/bash
# Session 41: run4.sh's first single-stream pass (speed-1) was left to finish when run4.sh was stopped for this; then
# llmc/variants.py (our GPTQ g128 on the 0.5B with llm-compressor's settings one at a time), then run4.sh's passes 2
# and 3, unchanged. The machine to itself. Run from the repository root.
D=docs/runs/2026-12-07/session41-g128
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
for pid in "$@"; do while kill -0 "$pid" 2>/dev/null; do sleep 5; done; done
date; .venv/bin/python $D/llmc/variants.py $D/llmc/variants.json "damp 0.01, no shrink" "min/max groups" \
    "damp 0.01, no shrink, min/max groups" > $D/llmc/variants.log 2>&1
LABELS="serving-cost-lab int4 gptq g128,serving-cost-lab int4 gptq-mixed,serving-cost-lab int4 gptq-mixed g32"
LABELS="$LABELS,llama.cpp Q4_K_M-requant,llama.cpp Q4_K_M-imatrix"
for i in 2 3; do
  date; .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-g128,int4-gptq-mixed-g64,int4-gptq-mixed-g32 \
      --llama Q4_K_M-requant,Q4_K_M-imatrix --labels "$LABELS" --out $D/speed-$i > $D/speed-$i.log 2>&1
done
date; uptime
