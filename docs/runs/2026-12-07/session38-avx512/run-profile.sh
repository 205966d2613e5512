#!/bin/bash
# Session 38, part 3: bench/profile_decode.py (fused path) on the two int4 models of run-speed.sh, alternated twice
# in one run (the host's bandwidth moves between processes), after the profiler counted the bytes of q/k/v and
# gate/up kept apart (a mixed model's int8 linears) in their phase.
D=docs/runs/2026-12-07/session38-avx512
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
for pass in 1 2; do
  for prec in int4-gptq-mixed-g32 int4-g32; do
    .venv/bin/python bench/profile_decode.py --model $P --precision $prec --path fused > $D/profile-$prec-$pass.txt 2>&1
  done
done
