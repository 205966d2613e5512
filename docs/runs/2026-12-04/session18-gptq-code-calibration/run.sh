#!/usr/bin/env bash
# Session 18 (issue 36): GPTQ g32 on the 1.5B calibrated on chat and code exchanges (calibrate.CALIBRATION_SET),
# the machine to itself. 1. calibration and KLD on the 2,048 tokens every 1.5B quality row uses; 2. HumanEval
# pass@1, all 164, GPTQ only: the fp32 reference solved the same 87 problems, each outcome identical, in three
# runs on two machines (2026-12-02, sessions 16 and 17), so paired.py pairs against session 17's fp32 run.
# Run from a checkout with .venv (make setup models workloads eval); writes next to this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
store="$(mktemp -d)"
echo "store: $store" > "$here/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400 >> "$here/machine.txt"
git rev-parse HEAD >> "$here/machine.txt"
{ time .venv/bin/python bench/quality_matched.py --model default --tokens 2048 --parts ours --no-probe \
    --group-sizes 32 --no-int8 --methods gptq --out "$here/quality"; } > "$here/quality.log" 2>&1
find ~/.cache/serving-cost-lab/quantized -name manifest.json -newer "$here/machine.txt" \
    -exec cp {} "$here/calibration-manifest.json" \;
SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model default --precisions int4-gptq-g32 \
    --subset full --batch 8 --no-peers > "$here/accuracy-full.md" 2> "$here/accuracy-full.progress.txt"
.venv/bin/python "$here/paired.py" "$here/../session17-gptq-1p5b/accuracy-full.progress.txt" \
    "$here/accuracy-full.progress.txt" > "$here/paired.txt"
