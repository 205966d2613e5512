#!/usr/bin/env bash
# Session 27 (issue 41, item 2): bf16 linears on the AMX kernel (TDPBF16PS on W's own layout) up to the row count
# measured against torch on this machine, against before (ae5df72: VDPBF16PS up to a fixed 16 rows, torch past it),
# one after the other in one run: the bare batched step (bench/batch_step.py) and the server under vLLM's client at
# concurrency 8, random prompts of 256 tokens, 128 forced output tokens, beside vLLM's CPU build and llama-server
# at BF16; and int4's bare batch-8 step against our int4 server at concurrency 8 (the ">= 80% of the bare batched
# step" target). step1-measured-limit/ is the same run for d4f6379 (the measured limit, no AMX kernel yet).
# Run from clean checkouts (servers build the extension from the working tree):
#   git worktree add /tmp/w/before ae5df72; git worktree add /tmp/w/after <this commit>  (.venv, .venv-vllm linked)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before="${1:-/tmp/w/before}"
after="${2:-/tmp/w/after}"
out="${3:-$here}"
uptime > "$out/load-before.txt"
(cd "$before" && .venv/bin/python bench/batch_step.py --model default-draft --precision bf16 --batch 1,2,4,8,16 \
  > "$out/batch-bf16-before.md" 2> "$out/batch.log")
(cd "$after" && .venv/bin/python bench/batch_step.py --model default-draft --precision bf16 --batch 1,2,4,8,16 \
  > "$out/batch-bf16-after.md" 2>> "$out/batch.log")
(cd "$after" && .venv/bin/python -c 'from engine.ops.info import backend_info; print(backend_info()["dense_kernel"])' \
  > "$out/dense-kernel-after.txt" 2>> "$out/batch.log")
(cd "$after" && cp "$(.venv/bin/python -c 'from engine.ops.info import backend_info; print(backend_info()["cpu_build_dir"])' \
  2>/dev/null)/dense_crossover.json" "$out/dense_crossover.json")
(cd "$after" && .venv/bin/python bench/batch_step.py --model default-draft --precision int4 --batch 1,8 \
  > "$out/batch-int4.md" 2>> "$out/batch.log")
(cd "$before" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16 --llama "" --concurrency 8 \
  --input-len 256 --output-len 128 --out "$out/before" > /dev/null 2> "$out/before.log")
(cd "$after" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16,int4 --llama BF16 --vllm bf16 \
  --concurrency 8 --input-len 256 --output-len 128 --out "$out/after" > /dev/null 2> "$out/after.log")
uptime > "$out/load-after.txt"
