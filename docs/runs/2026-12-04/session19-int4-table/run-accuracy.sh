#!/usr/bin/env bash
# Session 19 (issue 36, item 6), after run.sh: HumanEval pass@1 (all 164, greedy, batch 8) of GPTQ g128 and of
# llama-server at llama.cpp's best weights (Q4_K_M and IQ4_XS with an importance matrix on the calibration text),
# in a store of its own, paired problem by problem against session 17's fp32 run on this machine (whose outcomes
# runs on two machines reproduced). The machine to itself. Writes next to this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
store="$(mktemp -d)"
SCL_DATA_DIR="$store" .venv/bin/python -m engine accuracy --model default --precisions int4-gptq-g128 \
    --subset full --batch 8 --llama Q4_K_M-imatrix,IQ4_XS-imatrix \
    > "$here/accuracy-full.md" 2> "$here/accuracy-full.progress.txt"
.venv/bin/python "$here/../session18-gptq-code-calibration/paired.py" \
    "$here/../session17-gptq-1p5b/accuracy-full.progress.txt" "$here/accuracy-full.progress.txt" > "$here/paired.txt"
.venv/bin/python "$here/export_accuracy.py" "$store" > "$here/accuracy-records-s19.json"
rm -rf "$store"
