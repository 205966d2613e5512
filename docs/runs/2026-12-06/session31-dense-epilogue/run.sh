#!/usr/bin/env bash
# Session 31 (issue 41, "a faster large-M bf16 kernel"): the VDPBF16PS kernel's vectorized 4x4 epilogue and next-rows
# prefetch (2229820) against before (2bcdc32), one after the other in one run on this AMD EPYC Zen 4 VM (AVX-512
# with VNNI and BF16, no AMX), nothing else running: the kernel against torch's oneDNN at 8-64 rows (twice,
# alternating trees), the bare bf16 step and a 256-token prefill (bench/batch_step.py; after also with
# SCL_FUSED_BF16=0, the PyTorch path session 30 replaced), the prefill's phase profile, and the servers under vLLM's
# client at concurrency 8 (session 30's workload), ours bf16 before, then after with vLLM's CPU bf16.
# Clean checkouts (the servers build the extension from the working tree):
#   git worktree add /tmp/w31/before 2bcdc32; git worktree add /tmp/w31/after cf36448 (2229820 plus this script)  (.venv, .venv-vllm linked)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before="${1:-/tmp/w31/before}"
after="${2:-/tmp/w31/after}"
uptime > "$here/load-before.txt"
for pass in 1 2; do
  for side in before after; do
    tree=$before; [ $side = after ] && tree=$after
    (cd "$tree" && .venv/bin/python "$here/dense_rows.py" > "$here/dense-rows-$side-$pass.md" 2>> "$here/err.log")
  done
done
for side in before after; do
  tree=$before; [ $side = after ] && tree=$after
  (cd "$tree" && .venv/bin/python bench/batch_step.py --model default-draft --precision bf16 --batch 1,8 \
    --prompt-len 256 --output-len 128 > "$here/batch-bf16-$side.md" 2>> "$here/err.log")
done
(cd "$after" && SCL_FUSED_BF16=0 .venv/bin/python bench/batch_step.py --model default-draft --precision bf16 \
  --batch 1,8 --prompt-len 256 --output-len 128 > "$here/batch-bf16-pytorch-path.md" 2>> "$here/err.log")
(cd "$after" && .venv/bin/python "$here/prefill_profile.py" > "$here/prefill-profile-after.md" 2>> "$here/err.log")
(cd "$before" && .venv/bin/python "$here/prefill_profile.py" > "$here/prefill-profile-before.md" 2>> "$here/err.log")
(cd "$before" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16 --llama "" --concurrency 8 \
  --input-len 256 --output-len 128 --out "$here/load-before" > /dev/null 2> "$here/load-before.log")
(cd "$after" && .venv/bin/python bench/under_load.py --model default-draft --ours bf16 --llama "" --vllm bf16 \
  --concurrency 8 --input-len 256 --output-len 128 --out "$here/load-after" > /dev/null 2> "$here/load-after.log")
uptime > "$here/load-after.txt"
