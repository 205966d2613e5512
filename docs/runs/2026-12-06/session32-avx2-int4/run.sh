#!/usr/bin/env bash
# Session 32 (issue 41, "on the AVX2-only host, single-stream int4 decode of the 1.5B >= 70% of the bandwidth
# floor"): not that host. On the AMD EPYC Zen 4 VM with the kernels capped at AVX2 (SCL_KERNEL_ISA=avx2, no VNNI),
# the AVX2 int4 x int8 kernel before (8dd3217) and after (86d2132) it took several 8-row slices per activation
# broadcast, alternated twice, each from its own clean worktree (one kernel build each):
#  - the 1.5B's int4 decode step through the fused path (bench/profile_decode.py, 2 threads) -> decode-<rev>-<n>.txt,
#    and once uncapped (VNNI) for reference -> decode-vnni-<n>.txt;
#  - the kernel alone, 1 thread: q_proj (1536 x 1536) with its weights in L2 (--flush-mb 1) at M = 1..5, 8, and
#    gate/up (8960 x 1536) from L3 (--flush-mb 24) at M = 1, 2, 4 -> ks-<rev>-<n>-{l2,l3}.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git -C "$here" rev-parse --show-toplevel)"
uptime > "$here/load-before.txt"
for rev in 8dd3217 86d2132; do
  wt=/tmp/s32-$rev
  [ -d $wt ] || git -C "$root" worktree add -q --detach $wt $rev
  ln -sfn "$root/.venv" $wt/.venv
done
for n in 1 2; do
  for rev in 8dd3217 86d2132; do
    cd /tmp/s32-$rev
    SCL_KERNEL_ISA=avx2 .venv/bin/python bench/profile_decode.py --model default --precision int4 --path fused \
        --tokens 64 > "$here/decode-$rev-$n.txt" 2>/dev/null
    .venv/bin/python bench/kernel_speed.py --isa avx2 --m 1,2,3,4,5,8 --threads 1 --gs 32 --shapes q_proj \
        --no-baselines --no-dense --flush-mb 1 > "$here/ks-$rev-$n-l2.md" 2>/dev/null
    .venv/bin/python bench/kernel_speed.py --isa avx2 --m 1,2,4 --threads 1 --gs 32 --shapes gate/up \
        --no-baselines --no-dense --flush-mb 24 > "$here/ks-$rev-$n-l3.md" 2>/dev/null
  done
  cd /tmp/s32-86d2132
  .venv/bin/python bench/profile_decode.py --model default --precision int4 --path fused --tokens 64 \
      > "$here/decode-vnni-$n.txt" 2>/dev/null
done
uptime > "$here/load-after.txt"
for rev in 8dd3217 86d2132; do git -C "$root" worktree remove --force /tmp/s32-$rev; done
