#!/usr/bin/env bash
# Session 31 (issue 41, "on the AVX2-only host, single-stream int4 decode of the 1.5B >= 70% of the bandwidth
# floor"): not that host. On this AMD EPYC Zen 4 VM, the int4 kernels capped at AVX2 (no VNNI) and at AVX-512 VNNI,
# M = 1, the 1.5B's gate/up shape (8960 x 1536, group 64): cold (weights from DRAM, the default 768 MB working set)
# at 1 and 2 threads, and hot (a 24 MB working set, in L3) at 1 thread, so a kernel that reads the same speed hot
# and cold is bound by its own instructions, not by memory. Writes ks-<isa>-<threads>-<cold|hot>.md here.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
for isa in avx2 avx512; do
  for th in 1 2; do
    .venv/bin/python bench/kernel_speed.py --isa $isa --m 1 --threads $th --shapes gate/up --no-baselines \
      --no-dense > "$here/ks-$isa-$th-cold.md" 2>/dev/null
  done
  .venv/bin/python bench/kernel_speed.py --isa $isa --m 1 --threads 1 --shapes gate/up --no-baselines --no-dense \
    --flush-mb 24 > "$here/ks-$isa-1-hot.md" 2>/dev/null
done
