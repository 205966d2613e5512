#!/bin/bash
# Session 39: int8 weights with int8 activations (15a8113) on the permuted 1.5B, this Zen 4 host (the one
# session 38 ran on). Run from the repository root with a git worktree of 9c1689a (the int8 kernel on fp32
# activations, the rest the same) at $OLD: `git worktree add /tmp/oldtree 9c1689a; ln -s $PWD/.venv /tmp/oldtree/`.
# 0. The int8 kernels alone (micro_int8_*.py). 1. GPTQ-mixed g32's KLD (its int8 linears now on int8 activations), session 38's 2,048 eval tokens and codes.
# 2. Single stream: this commit's GPTQ-mixed g32 and int4 g32 with llama.cpp Q4_K_M (one peers.py run), then
#    9c1689a's GPTQ-mixed g32 right after; two passes.  3. Under load (vLLM's client, c = 8) the same way.
D=docs/runs/2026-12-07/session39-w8a8
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
OLD=${OLD:-/tmp/oldtree}
QM=".venv/bin/python bench/quality_matched.py --model $P --tokens 2048 --no-probe --no-shipped --no-weight-check"
(lscpu; uptime; git rev-parse HEAD; git -C $OLD rev-parse HEAD) > $D/machine.txt
# 0. the int8 kernels alone (L3-hot, 2 threads): 9c1689a's layout (fp32 activations), then this commit's
date; (cd $OLD && PYTHONPATH=$OLD .venv/bin/python /work/main/$D/micro_int8_old_layout.py) > $D/micro_int8_old_layout.out 2>&1
date; .venv/bin/python $D/micro_int8_q8.py > $D/micro_int8_q8.out 2>&1
date; $QM --parts ours --group-sizes 32 --no-int8 --methods gptq-mixed --out $D/qm-ours-mixed > $D/qm-ours-mixed.log 2>&1
for pass in 1 2; do
  date; .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-mixed-g32,int4-g32 --llama Q4_K_M-requant \
      --labels "llama.cpp Q4_K_M-requant,serving-cost-lab int4 gptq-mixed g32,serving-cost-lab int4 g32" \
      --out $D/speed-$pass > $D/speed-$pass.log 2>&1
  date; (cd $OLD && PYTHONPATH=$OLD .venv/bin/python bench/peers.py --model $P --no-ab --ours int4-gptq-mixed-g32 \
      --labels "serving-cost-lab int4 gptq-mixed g32" --out /work/main/$D/speed-old-$pass) > $D/speed-old-$pass.log 2>&1
done
for pass in 1 2; do
  date; .venv/bin/python bench/under_load.py --model $P --ours int4-gptq-mixed-g32,int4-g32 --llama Q4_K_M-requant \
      --out $D/under-load-$pass > $D/under-load-$pass.log 2>&1
  date; (cd $OLD && PYTHONPATH=$OLD .venv/bin/python bench/under_load.py --model $P --ours int4-gptq-mixed-g32 \
      --out /work/main/$D/under-load-old-$pass) > $D/under-load-old-$pass.log 2>&1
done
date; uptime
