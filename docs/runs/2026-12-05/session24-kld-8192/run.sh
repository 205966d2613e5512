#!/usr/bin/env bash
# Session 24 (issue 36, item 6): the 1.5B's quality rows on the issue's 8,192 eval tokens (sessions 11-19 cut them
# to 2,048 for time). The llama.cpp rows (the F32 check, Q4_K_M requantized and shipped, Q4_K_M and IQ4_XS with the
# importance matrix) and ours (int8, int4 g32 round-to-nearest, GPTQ and AWQ, calibrated on the chat-and-code set).
# Statistics, not timings: the machine need not be idle. Run from a checkout with .venv (make setup models peers).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
{ lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400; git rev-parse HEAD; } > "$here/machine.txt"
{ time .venv/bin/python bench/quality_matched.py --model default --tokens 8192 --no-probe \
    --group-sizes 32 --methods rtn,awq,gptq --llama-types Q4_K_M-imatrix,IQ4_XS-imatrix \
    --out "$here/kld-8192"; } > "$here/kld-8192.log" 2>&1
