#!/usr/bin/env bash
# Session 19 (issue 36, item 6): one table for the 1.5B. 1. GPTQ g128 on the chat-and-code calibration text (the last
# row not yet scored on it) and its KLD on the 2,048 tokens every 1.5B row uses; 2. one report merged from the runs on
# those tokens and that reference (newest last: a later run's row replaces an earlier one of the same label).
# Then run-speed.sh and run-accuracy.sh. Run from a checkout with .venv (make setup models peers); the machine to
# itself. Writes next to this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
runs="$(cd "$here/.." && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
{ lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400; git rev-parse HEAD; } > "$here/machine.txt"
{ time .venv/bin/python bench/quality_matched.py --model default --tokens 2048 --parts ours --no-probe \
    --group-sizes 128 --no-int8 --methods gptq --out "$here/gptq-g128"; } > "$here/gptq-g128.log" 2>&1
.venv/bin/python bench/quality_matched.py --out "$here/merged" --merge \
    "$runs/../2026-12-03/qm-1p5b-merged/quality_matched.json" \
    "$runs/session16-1p5b/quality/quality_matched.json" \
    "$runs/int4-gguf-1p5b/quality_matched.json" \
    "$runs/session18-gptq-code-calibration/quality/quality_matched.json" \
    "$runs/session18-awq-mixed/quality/quality_matched.json" \
    "$here/gptq-g128/quality_matched.json" \
    --note "Merged from six runs on the same 2,048 tokens and reference (session 19, docs/runs/2026-12-04/session19-int4-table/run.sh); GPTQ, AWQ and GPTQ mixed calibrated on sharegpt-chat-and-code-exchanges." \
    > "$here/merged.log" 2>&1
