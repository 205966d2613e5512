#!/usr/bin/env bash
# Session 27 (issue 41, item 2): bf16 linears take the dense kernel up to the row count measured against torch on
# this machine (before: a fixed 16, pinned here with SCL_KERNEL_DENSE_M=16), one after the other in one run:
# the bare batched step (bench/batch_step.py) and the server under vLLM's client at concurrency 8, random prompts
# of 256 tokens, 128 forced output tokens, beside vLLM's CPU build and llama-server at BF16; and int4's bare
# batch-8 step against our int4 server at concurrency 8 (the ">= 80% of the bare batched step" target).
# Run from a clean checkout of the commit (servers build the extension from the working tree).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${1:-$(git -C "$here" rev-parse --show-toplevel)}"
py="$root/.venv/bin/python"
cd "$root"
bdir="$($py -c 'from engine.ops.info import backend_info; print(backend_info()["cpu_build_dir"])' 2>/dev/null)"
rm -f "$bdir/dense_crossover.json"   # measured again below, on a quiet machine
uptime > "$here/load-before.txt"
SCL_KERNEL_DENSE_M=16 $py bench/batch_step.py --model default-draft --precision bf16 --batch 1,2,4,8,16 \
  > "$here/batch-bf16-dense16.md" 2> "$here/batch.log"
$py bench/batch_step.py --model default-draft --precision bf16 --batch 1,2,4,8,16 > "$here/batch-bf16-measured.md" 2>> "$here/batch.log"
cp "$bdir/dense_crossover.json" "$here/dense_crossover.json"
$py bench/batch_step.py --model default-draft --precision int4 --batch 1,8 > "$here/batch-int4.md" 2>> "$here/batch.log"
SCL_KERNEL_DENSE_M=16 $py bench/under_load.py --model default-draft --ours bf16 --llama "" --concurrency 8 \
  --input-len 256 --output-len 128 --out "$here/before" > /dev/null 2> "$here/before.log"
$py bench/under_load.py --model default-draft --ours bf16,int4 --llama BF16 --vllm bf16 --concurrency 8 \
  --input-len 256 --output-len 128 --out "$here/after" > /dev/null 2> "$here/after.log"
uptime > "$here/load-after.txt"
