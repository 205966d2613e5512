#!/usr/bin/env bash
# Session 31 (issue 36, "under load, the quality-matched int4 >= 2.5x llama-server at its best"), on the AMD EPYC
# Zen 4 VM (sessions 19's two passes were on the Intel Xeon): AWQ g32 of the 1.5B calibrated once into a fresh cache
# (timed: the calibration target is <= 20 min on 2 cores), then two passes of bench/under_load.py (vLLM's client,
# concurrency 8, 32 requests of 128 random tokens, 128 output tokens forced, each server alone): ours AWQ g32 (pass@1
# 88/164, the reference's 87) and int4-gguf g32 against llama-server at Q4_K_M (the shipped file) and Q4_K_M with an
# importance matrix (llama.cpp's fastest here: IQ4_XS is 0.6x its speed, session 19). Run from a clean checkout.
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
for pass in 1 2; do
  .venv/bin/python bench/under_load.py --model default --ours int4-awq-g32,int4-gguf --llama Q4_K_M,Q4_K_M-imatrix \
      --out "$here/under-load-pass$pass" > "$here/under-load-pass$pass.log" 2>&1
done
uptime > "$here/load-after.txt"
