#!/usr/bin/env bash
# Session 25 (issue 40): a quality budget on the KLD median, then the mean, at the same limit. records.json: the
# 1.5B's measured KLD mean, median and p99 (2,048 tokens) and pass@1 flips of session 19's table, as
# tests/test_quality_budget.py builds them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
.venv/bin/python -c "import json; from tests.test_quality_budget import records; print(json.dumps(records()))" \
    > "$here/records.json"
budget() { .venv/bin/python -m engine plan --model qwen2.5-coder-1.5b --rate 15 --input 512 --gpus L4 \
    --precisions bf16,int8,int4 --spec off --records "$here/records.json" --no-store "$@"; }
budget --max-kld 0.01 --kld-stat median > "$here/budget-median-0.01.txt" 2>&1
budget --max-kld 0.01 > "$here/budget-mean-0.01.txt" 2>&1
