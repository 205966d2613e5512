#!/bin/bash
# Session 39, part 2: where GPTQ-mixed g32's decode step goes, this commit against 9c1689a (worktree at $OLD,
# as run.sh), alternated, two passes (bench/profile_decode.py, the fused step's phase timers).
D=docs/runs/2026-12-07/session39-w8a8
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
OLD=${OLD:-/tmp/oldtree}
for pass in 1 2; do
  .venv/bin/python bench/profile_decode.py --model $P --precision int4-gptq-mixed-g32 --path fused \
      > $D/profile-mixed-$pass.txt 2>&1
  (cd $OLD && PYTHONPATH=$OLD .venv/bin/python bench/profile_decode.py --model $P --precision int4-gptq-mixed-g32 \
      --path fused) > $D/profile-mixed-old-$pass.txt 2>&1
done
