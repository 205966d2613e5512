#!/usr/bin/env bash
# Session 30 (issue 41, "our bf16 >= 0.9x vLLM's CPU bf16 at concurrency 8 on the 0.5B"): a bf16 model in the fused
# C++ step (kernels/cpu/fused_bf16.h) against before (d381289: bf16 on the PyTorch path, its linears on the dense
# kernel), one after the other in one run on this AMD EPYC Zen 4 VM (AVX-512 with VNNI and BF16, no AMX):
# the bare batched bf16 step (bench/batch_step.py), then the servers under vLLM's client at concurrency 8, random
# prompts of 256 tokens, 128 forced output tokens: ours bf16 before; ours bf16 after, llama-server BF16 and vLLM CPU
# bf16 in one bench/under_load.py call (session 28's workload).
# Run from clean checkouts (servers build the extension from the working tree):
#   git worktree add /tmp/w/before d381289; git worktree add /tmp/w/after <this commit>  (.venv, .venv-vllm linked)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before="${1:-/tmp/w/before}"
after="${2:-/tmp/w/after}"
out="${3:-$here}"
mkdir -p "$out"
uptime > "$out/load-before.txt"
(cd "$before" && .venv/bin/python bench/batch_step.py --model default-draft --precision bf16 --batch 1,8 \
  --prompt-len 256 --output-len 128 > "$out/batch-bf16-before.md" 2> "$out/batch.log")
(cd "$after" && .venv/bin/python bench/batch_step.py --model default-draft --precision bf16 --batch 1,8 \
  --prompt-len 256 --output-len 128 > "$out/batch-bf16-after.md" 2>> "$out/batch.log")
(cd "$before" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16 --llama "" --concurrency 8 \
  --input-len 256 --output-len 128 --out "$out/before" > /dev/null 2> "$out/before.log")
(cd "$after" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16 --llama BF16 --vllm bf16 \
  --concurrency 8 --input-len 256 --output-len 128 --out "$out/after" > /dev/null 2> "$out/after.log")
uptime > "$out/load-after.txt"
