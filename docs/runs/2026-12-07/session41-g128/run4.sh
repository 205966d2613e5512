#!/bin/bash
# Session 41: run3.sh's single-stream passes named GPTQ-mixed g64 by a label it does not carry (g64 is the default
# group, so its label is "int4 gptq-mixed") and were refused before measuring; here again with the right label,
# after llmc/run.sh, the machine to itself. Three passes (bench/peers.py, fresh processes, 64 new tokens, median of
# 3): GPTQ g128 (the table's row), GPTQ-mixed g64 (1,087 MB per token) and g32 (1,153 MB), llama.cpp Q4_K_M with and
# without its importance matrix (980 MB), each pass's ratios within the pass.
# Stopped (by PID) during its first pass, which was left to finish; passes 2 and 3 ran in run5.sh.
D=docs/runs/2026-12-07/session41-g128
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
for pid in "$@"; do while kill -0 "$pid" 2>/dev/null; do sleep 5; done; done
LABELS="serving-cost-lab int4 gptq g128,serving-cost-lab int4 gptq-mixed,serving-cost-lab int4 gptq-mixed g32"
LABELS="$LABELS,llama.cpp Q4_K_M-requant,llama.cpp Q4_K_M-imatrix"
for i in 1 2 3; do
  date; .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-g128,int4-gptq-mixed-g64,int4-gptq-mixed-g32 \
      --llama Q4_K_M-requant,Q4_K_M-imatrix --labels "$LABELS" --out $D/speed-$i > $D/speed-$i.log 2>&1
done
date; uptime
