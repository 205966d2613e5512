#!/usr/bin/env bash
# int4-gguf's load of the 1.5B profiled (cProfile, fresh process) before (5644071) and after (the commit that made
# _check_codes work group by group), each from its own worktree with its own kernel cache built first:
# check-<rev>.txt (load_s and the read/check lines of the profile).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git -C "$here" rev-parse --show-toplevel)"
after=$(git -C "$root" log -1 --format=%h -- engine/quant/gguf_codes.py)
for rev in 5644071 $after; do
  wt=/tmp/s32c-$rev
  [ -d $wt ] || git -C "$root" worktree add -q --detach $wt $rev
  ln -sfn "$root/.venv" $wt/.venv
  cd $wt
  export SCL_KERNEL_CACHE=/tmp/s32c-kernels-$rev
  .venv/bin/python -c "from engine.ops.build import load_cpu_extension as f; f(raise_errors=True)" 2>/dev/null
  .venv/bin/python -c "
import cProfile, pstats, sys
sys.path.insert(0, '.')
from engine.infer.loader import load
pr = cProfile.Profile(); pr.enable()
lm = load('default', 'int4-gguf', 'cpu')
pr.disable(); print('$rev int4-gguf load_s', round(lm.load_s, 2))
pstats.Stats(pr).sort_stats('cumulative').print_stats('gguf_codes')" 2>/dev/null > "$here/check-$rev.txt"
  cd "$root"
  git worktree remove --force $wt
  rm -rf /tmp/s32c-kernels-$rev
done
