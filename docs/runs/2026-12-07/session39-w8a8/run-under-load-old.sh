#!/bin/bash
# Session 39, part 3: run.sh's 9c1689a arm under load failed (under_load.py needs a peer for a folder model, and the
# worktree lacked .venv-vllm); here 9c1689a's GPTQ-mixed g32 beside llama-server Q4_K_M of the same folder, two
# passes, right after run.sh's (this commit's) under-load passes. Worktree at $OLD with .venv and .venv-vllm linked.
D=docs/runs/2026-12-07/session39-w8a8
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
OLD=${OLD:-/tmp/oldtree}
for pass in 1 2; do
  date; (cd $OLD && PYTHONPATH=$OLD .venv/bin/python bench/under_load.py --model $P --ours int4-gptq-mixed-g32 \
      --llama Q4_K_M-requant --out /work/main/$D/under-load-old-$pass) > $D/under-load-old-$pass.log 2>&1
done
date; uptime
