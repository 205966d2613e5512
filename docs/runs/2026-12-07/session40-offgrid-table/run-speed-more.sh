#!/bin/bash
# Session 40, after run-8192.sh: three more single-stream passes of run.sh's configurations (passes 3-5), because
# one pass on this host read two configurations of the same format and bytes (int4 g32 round-to-nearest and AWQ g32)
# 22.3 and 32.7 tok/s. The table takes each configuration's median over the five passes, and its ratio to llama.cpp
# Q4_K_M per pass. Run from the repository root; the machine to itself.
D=docs/runs/2026-12-07/session40-offgrid-table
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
OURS=int4-g32,int4-gptq-g32,int4-awq-g32,int4-gptq-mixed-g32
LLAMA=Q4_K_M-requant,Q4_K_M-imatrix,IQ4_XS,IQ4_XS-imatrix
LABELS="serving-cost-lab int8,serving-cost-lab int4,serving-cost-lab int4 g32,serving-cost-lab int4 gptq g32"
LABELS="$LABELS,serving-cost-lab int4 awq g32,serving-cost-lab int4 gptq-mixed g32,llama.cpp Q4_K_M-requant"
LABELS="$LABELS,llama.cpp Q4_K_M-imatrix,llama.cpp IQ4_XS,llama.cpp IQ4_XS-imatrix"
for pass in 3 4 5; do
  date; .venv/bin/python bench/peers.py --model $P --no-ab --ours $OURS --llama $LLAMA --labels "$LABELS" \
      --out $D/speed-$pass > $D/speed-$pass.log 2>&1
done
date; uptime
