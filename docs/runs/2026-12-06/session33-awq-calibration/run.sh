#!/usr/bin/env bash
# Session 33 (issue 36, "calibration of the 1.5B <= 20 min on 2 cores"), AMD EPYC Zen 4 VM, the machine to itself:
# AWQ g32 of the 1.5B calibrated once into a fresh cache entry (the entry session 31 made moved aside first), as
# session 31's run.sh timed it (1,221 s there). Then the new entry's codes, scales, mins and folded floats compared
# bit for bit with session 31's (compare.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
uptime > "$here/load-before.txt"
start=$(date +%s)
.venv/bin/python - > "$here/calibrate.log" 2>&1 <<'PY'
import sys
sys.path.insert(0, ".")
from engine.infer.loader import load, make_spec
load("default", make_spec("int4-awq-g32"), "cpu", progress=lambda s: print(s, flush=True))
PY
echo "calibration and load of int4-awq-g32: $(( $(date +%s) - start )) s" >> "$here/times.txt"
uptime > "$here/load-after.txt"
