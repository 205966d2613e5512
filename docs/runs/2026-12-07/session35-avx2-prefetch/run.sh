#!/usr/bin/env bash
# Session 35 (issue 41's AVX2 target): does the AVX2 int4 x int8 kernel's software prefetch help or hurt on this
# AVX2-only Zen 3? Four builds of the same commit, differing only in that prefetch (kernels/cpu/qgemm_avx2.cpp,
# uk4q8): A as committed (T0, 4,096 bytes ahead), B none, C T1 (the same distance), D T0 8,192 bytes ahead; each in
# its own worktree (A is the checkout itself), one kernel build each. Alternated over two rounds:
#  - the 1.5B's int4 decode step through the fused path, 2 threads (bench/profile_decode.py) -> decode-<v>-<n>.txt
#  - the kernel alone, 1 thread, gate/up (8960 x 1536) g64 at M = 1, weights from DRAM (--flush-mb 256)
#    -> ks-<v>-<n>.md
# The machine to itself. Writes next to this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
declare -A tree=([A]="$(git -C "$here" rev-parse --show-toplevel)" [B]=/tmp/pfB [C]=/tmp/pfC [D]=/tmp/pfD)
for v in B C D; do git -C "${tree[$v]}" diff > "$here/variant-$v.diff"; done
uptime > "$here/load.txt"
for n in 1 2; do
  for v in A B C D; do
    cd "${tree[$v]}"
    .venv/bin/python bench/profile_decode.py --model default --precision int4 --path fused --tokens 64 \
        > "$here/decode-$v-$n.txt" 2>/dev/null
    .venv/bin/python bench/kernel_speed.py --isa avx2 --m 1 --threads 1 --gs 64 --shapes gate/up \
        --no-baselines --no-dense --flush-mb 256 > "$here/ks-$v-$n.md" 2>/dev/null
  done
done
uptime >> "$here/load.txt"
