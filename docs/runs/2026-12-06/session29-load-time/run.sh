#!/usr/bin/env bash
# Session 29: how long a quantized load takes (the 0.5B and the 1.5B, int4 and int8), with round-to-nearest codes and
# the CPU tiled layouts made by the extension against the torch definitions, arms alternated in one process; then
# the torch definition of int4 at 8017ac5 against this tree's. AMD EPYC Zen 4, 2 cores, nothing else running.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
.venv/bin/python bench/load_time.py --models default-draft,default --precisions int4,int8 --reps 2 \
    > "$here/load_time.md" 2> "$here/load_time.log"
.venv/bin/python "$here/formats_ab.py" > "$here/formats_ab.txt"
