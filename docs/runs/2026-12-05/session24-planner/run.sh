#!/usr/bin/env bash
# Session 24 (issue 40): the plans docs/PLANNER.md quotes. records.json: the 1.5B's measured KLD means (2,048
# tokens) and pass@1 flips of session 19's table, as tests/test_quality_budget.py builds them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
.venv/bin/python -c "import json; from tests.test_quality_budget import records; print(json.dumps(records()))" \
    > "$here/records.json"
budget() { .venv/bin/python -m engine plan --model qwen2.5-coder-1.5b --rate 15 --input 512 --gpus L4 \
    --precisions bf16,int8,int4 --spec off --records "$here/records.json" --no-store "$@"; }
budget --max-kld 0.012 > "$here/budget-0.012.txt" 2>&1
budget --max-kld 0.005 > "$here/budget-0.005.txt" 2>&1
.venv/bin/python -m engine plan --model llama-3.1-70b --rate 10 --input 1024 --gpus "A100 80GB" --traffic diurnal \
    --no-store > "$here/day-policy-70b-a100.txt" 2>&1
.venv/bin/python -m engine plan --model llama-3.1-8b --rate 5 --input 1024 --output 256 --tpot 0.03 \
    --precisions bf16,fp8,int8,int4 --no-store > "$here/cost-page-default.txt" 2>&1
