#!/usr/bin/env bash
# Session 28 (issue 41, item 2 and the "server >= 80% of the bare step" target) on an AMD EPYC Zen 4 VM (AVX-512
# with VNNI and BF16, no AMX): what the dense kernel's measured row limit and its 4x4 VDPBF16PS blocking do for
# bf16 here, against before (ae5df72: VDPBF16PS up to a fixed 16 rows, torch past it), one after the other in one
# run: the bare batched bf16 step (bench/batch_step.py); the int4 step with the workload ceiling that counts
# prefill (--prompt-len 256 --output-len 128); the servers under vLLM's client at concurrency 8, random prompts of
# 256 tokens, 128 forced output tokens: ours bf16 before, ours bf16 and int4 after, llama-server BF16, vLLM CPU bf16.
# Run from clean checkouts (servers build the extension from the working tree):
#   git worktree add /tmp/w/before ae5df72; git worktree add /tmp/w/after <this commit>  (.venv, .venv-vllm linked)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before="${1:-/tmp/w/before}"
after="${2:-/tmp/w/after}"
out="${3:-$here}"
mkdir -p "$out"
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
  --prompt-len 256 --output-len 128 > "$out/batch-int4.md" 2>> "$out/batch.log")
(cd "$before" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16 --llama "" --concurrency 8 \
  --input-len 256 --output-len 128 --out "$out/before" > /dev/null 2> "$out/before.log")
(cd "$after" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16,int4 --llama BF16 --vllm bf16 \
  --concurrency 8 --input-len 256 --output-len 128 --out "$out/after" > /dev/null 2> "$out/after.log")
uptime > "$out/load-after.txt"
