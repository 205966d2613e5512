#!/usr/bin/env bash
# Session 32: GGUF headers read by the lab (engine/quant/gguf_file.py) against gguf's GGUFReader.
#  compare.txt: every GGUF in the lab's cache (the shipped Q4_K_M files and the quality pipeline's conversions,
#    F32 left out for size), every tensor compared, each read timed.
#  load-<rev>-<n>.txt: int4-gguf loads of the 0.5B and the 1.5B in fresh processes (engine.infer.loader.load,
#    its load_s), before (aad2faa, GGUFReader) and after (6be075b), alternated twice from clean worktrees, each
#    with its own kernel cache built before timing (a shared one was rebuilt at every switch, 75 s, before the
#    fix in engine/ops/build.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git -C "$here" rev-parse --show-toplevel)"
uptime > "$here/load-before.txt"
cd "$root" && .venv/bin/python "$here/compare.py" > "$here/compare.txt" 2>/dev/null
for rev in aad2faa 6be075b; do
  [ -d /tmp/s32g-$rev ] || git -C "$root" worktree add -q --detach /tmp/s32g-$rev $rev
  ln -sfn "$root/.venv" /tmp/s32g-$rev/.venv
  (cd /tmp/s32g-$rev && SCL_KERNEL_CACHE=/tmp/s32g-kernels-$rev .venv/bin/python -c \
      "from engine.ops.build import load_cpu_extension as f; f(raise_errors=True)" 2>/dev/null)
done
for n in 1 2; do
  for rev in aad2faa 6be075b; do
    cd /tmp/s32g-$rev
    for m in default-draft default; do
      SCL_KERNEL_CACHE=/tmp/s32g-kernels-$rev .venv/bin/python -c "
import sys, time; sys.path.insert(0, '.')
from engine.infer.loader import load
lm = load('$m', 'int4-gguf', 'cpu')
print('$rev', '$m', 'int4-gguf load_s', round(lm.load_s, 2))" 2>/dev/null
    done > "$here/load-$rev-$n.txt"
  done
done
uptime > "$here/load-after.txt"
for rev in aad2faa 6be075b; do git -C "$root" worktree remove --force /tmp/s32g-$rev; rm -rf /tmp/s32g-kernels-$rev; done
