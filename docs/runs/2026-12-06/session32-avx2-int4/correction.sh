#!/usr/bin/env bash
# Session 31's hot/cold commands for the AVX2 int4 kernel (its run.sh, 1 thread, group 64), rerun at 8dd3217 (the
# build it measured) -> s31-avx2-1-{cold,hot}.md; and the VNNI kernel in L2 as run.sh measures AVX2 there ->
# ks-vnni-l2.md (at 86d2132; the VNNI kernel is the same in both).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git -C "$here" rev-parse --show-toplevel)"
wt=/tmp/s32c-8dd3217
[ -d $wt ] || git -C "$root" worktree add -q --detach $wt 8dd3217
ln -sfn "$root/.venv" $wt/.venv
cd $wt
.venv/bin/python bench/kernel_speed.py --isa avx2 --m 1 --threads 1 --shapes gate/up --no-baselines --no-dense \
    > "$here/s31-avx2-1-cold.md" 2>/dev/null
.venv/bin/python bench/kernel_speed.py --isa avx2 --m 1 --threads 1 --shapes gate/up --no-baselines --no-dense \
    --flush-mb 24 > "$here/s31-avx2-1-hot.md" 2>/dev/null
cd "$root"
.venv/bin/python bench/kernel_speed.py --isa avx512 --m 1,2,3,4,5,8 --threads 1 --gs 32 --shapes q_proj \
    --no-baselines --no-dense --flush-mb 1 > "$here/ks-vnni-l2.md" 2>/dev/null
git -C "$root" worktree remove --force $wt
