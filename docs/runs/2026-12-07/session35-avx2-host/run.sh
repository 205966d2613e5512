#!/usr/bin/env bash
# Session 35 (issue 41, "on the AVX2-only host, single-stream int4 decode of the 1.5B >= 70% of the bandwidth floor
# the lab's probe measures"): the first session on an AVX2-only host since the target was set. The machine to itself.
#  1. what the machine is (lscpu, the SIMD flags the kernels select on) -> machine.txt
#  2. the lab's record: `engine bench` of the 1.5B at int4 (g64, the default) and int4 g32, 3 repetitions, 64 new
#     tokens; bw_eff = the floor (projection bytes / the higher of the run's two in-process probes) / the step
#     -> bench-<pass>.md
#  3. where the step goes: bench/profile_decode.py, the fused path, int4 g64 -> profile-<pass>.txt
#  4. llama.cpp Q4_K_M (the shipped file) on the same prompt, each system in a fresh process (bench/peers.py)
#     -> peers-<pass>/
# Two passes of 2-4 back to back. Needs `make peers`. Writes next to this script. Before it, the same commands by
# hand, right after `make setup kernels models` (before `make peers`): bench-0.md (2 without peers) and profile-0-{1,2,3}.txt.
# records.py reads the bench records (their probes floor and bw_efficiency) from the store -> records.json.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
{ uptime; lscpu | grep -E "Model name|CPU family|^Model:|L3"; grep -o -w -E "avx512f|avx512_vnni|avx_vnni|avx2|fma|f16c" /proc/cpuinfo | sort | uniq -c; } > "$here/machine.txt"
labels="llama.cpp Q4_K_M,serving-cost-lab int4,serving-cost-lab int4 g32"
for pass in 1 2; do
  .venv/bin/python -m engine bench --model default --precisions int4,int4-g32 --reps 3 --max-new-tokens 64 \
      --format md > "$here/bench-$pass.md" 2> "$here/bench-$pass.log"
  .venv/bin/python bench/profile_decode.py --model default --precision int4 --path fused --tokens 64 \
      > "$here/profile-$pass.txt" 2> /dev/null
  .venv/bin/python bench/peers.py --model default --no-ab --ours int4-g32 --labels "$labels" \
      --out "$here/peers-$pass" > "$here/peers-$pass.log" 2>&1
done
uptime >> "$here/machine.txt"
