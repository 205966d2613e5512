#!/usr/bin/env bash
# Session 19 (issue 36), after run-speed.sh: under load through vLLM's client (bench/under_load.py: concurrency 8, 32
# requests of 128 random tokens, 128 output tokens forced, each server alone on the machine), two passes: our AWQ g32
# (pass@1 88/164, the reference's 87) and int4-gguf g32 (86/164) against llama-server at Q4_K_M (the shipped file)
# and IQ4_XS with an importance matrix (llama.cpp's fastest here in session 16). Needs `make peers peers-vllm`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
for pass in 1 2; do
  .venv/bin/python bench/under_load.py --model default --ours int4-awq-g32,int4-gguf --llama Q4_K_M,IQ4_XS-imatrix \
      --out "$here/under-load-pass$pass" > "$here/under-load-pass$pass.log" 2>&1
done
