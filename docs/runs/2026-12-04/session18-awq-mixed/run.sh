#!/usr/bin/env bash
# Session 18 (issue 36): AWQ g32 and GPTQ-mixed g32 on the 1.5B, calibrated on chat and code exchanges, the machine
# to itself: 1. calibration (AWQ; GPTQ-mixed reads GPTQ's cached codes) and KLD on the 2,048 tokens every 1.5B
# quality row uses; 2. HumanEval pass@1, all 164, paired (../session18-gptq-code-calibration/paired.py) against
# session 17's fp32 run, whose outcomes three runs on two machines reproduced.
# Run from a checkout with .venv (make setup models workloads eval); writes next to this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
store="$(mktemp -d)"
echo "store: $store" > "$here/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400 >> "$here/machine.txt"
git rev-parse HEAD >> "$here/machine.txt"
{ time .venv/bin/python bench/quality_matched.py --model default --tokens 2048 --parts ours --no-probe \
    --group-sizes 32 --no-int8 --methods awq,gptq-mixed --out "$here/quality"; } > "$here/quality.log" 2>&1
find ~/.cache/serving-cost-lab/quantized -name manifest.json -newer "$here/machine.txt" \
    -exec sh -c 'cp "$1" "$2/manifest-$(basename "$(dirname "$1")").json"' _ {} "$here" \;
SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model default \
    --precisions int4-awq-g32,int4-gptq-mixed-g32 --subset full --batch 8 --no-peers \
    > "$here/accuracy-full.md" 2> "$here/accuracy-full.progress.txt"
.venv/bin/python "$here/../session18-gptq-code-calibration/paired.py" \
    "$here/../session17-gptq-1p5b/accuracy-full.progress.txt" "$here/accuracy-full.progress.txt" > "$here/paired.txt"
