#!/bin/bash
# Session 39, part 4 (after run-under-load-old.sh): single stream, this commit's GPTQ-mixed g32 (with llama.cpp
# Q4_K_M of the same folder) and 9c1689a's GPTQ-mixed g32 alternated, three rounds (run.sh's two passes read
# 0.93x / 0.84x and 9c1689a 24.5 / 24.1 tok/s: within the host's noise?); then the int8 kernels alone with the weights
# in L3 (micro_int8_*.py), 9c1689a's layout and this commit's alternated, two rounds.
D=docs/runs/2026-12-07/session39-w8a8
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
OLD=${OLD:-/tmp/oldtree}
for r in 1 2 3; do
  date; .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-mixed-g32 --llama Q4_K_M-requant \
      --labels "llama.cpp Q4_K_M-requant,serving-cost-lab int4 gptq-mixed g32" --out $D/ab-new-$r > $D/ab-new-$r.log 2>&1
  date; (cd $OLD && PYTHONPATH=$OLD .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-mixed-g32 \
      --labels "serving-cost-lab int4 gptq-mixed g32" --out /work/main/$D/ab-old-$r) > $D/ab-old-$r.log 2>&1
done
for r in 1 2; do
  date; (cd $OLD && PYTHONPATH=$OLD .venv/bin/python /work/main/$D/micro_int8_old_layout.py) > $D/micro-old-$r.out 2>&1
  date; .venv/bin/python $D/micro_int8_q8.py > $D/micro-new-$r.out 2>&1
done
date; uptime
