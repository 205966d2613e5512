#!/usr/bin/env bash
# Session 34: the fused step's attention scores workspace. Before 0b980b9 it was reallocated to exactly 64 x positions
# floats per thread (zero-filled) whenever a step reached a position no step had reached, i.e. on every decode step of
# the first run of a process at a new length. first_run.py in a fresh process per build, the caches in the order
# paged, slots, paged, slots; each build from its own clean worktree (one kernel build each). Run from the repository
# root; the machine otherwise idle.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git -C "$here" rev-parse --show-toplevel)"
for rev in 0b980b9~1 0b980b9; do
  name=${rev/\~/-}
  wt=/tmp/s34-$name
  [ -d $wt ] || git -C "$root" worktree add -q --detach $wt $rev
  ln -sfn "$root/.venv" $wt/.venv
  cp "$here/first_run.py" $wt/first_run.py
  (cd $wt && .venv/bin/python -c "from engine.ops.build import load_cpu_extension as f; f(raise_errors=True)" \
      > /dev/null 2>&1 && PYTHONPATH=. .venv/bin/python first_run.py paged,slots,paged,slots) \
      > "$here/first-run-$name.txt" 2>/dev/null
done
for rev in 0b980b9~1 0b980b9; do git -C "$root" worktree remove --force /tmp/s34-${rev/\~/-}; done
