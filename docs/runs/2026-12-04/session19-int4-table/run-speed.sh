#!/usr/bin/env bash
# Session 19 (issue 36, item 6), after run.sh: single-stream speed of every row's configuration against llama.cpp's,
# two passes back to back (each system in a fresh process, 64 new tokens, median of 3; bench/peers.py). Needs
# `make peers`; the machine to itself. Writes next to this script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
# llama.cpp's weights built once before any timing (llama-imatrix on the calibration text, llama-quantize)
.venv/bin/python -c "
from engine.peers.gguf_tools import llama_gguf
for t in ('Q4_K_M-imatrix', 'IQ4_XS', 'IQ4_XS-imatrix'):
    print(t, llama_gguf('default', t, print))" > "$here/llama-ggufs.log" 2>&1
labels="llama.cpp Q4_K_M,llama.cpp Q4_K_M-imatrix,llama.cpp IQ4_XS,llama.cpp IQ4_XS-imatrix,serving-cost-lab int8"
labels="$labels,serving-cost-lab int4,serving-cost-lab int4 g32,serving-cost-lab int4 gptq g32"
labels="$labels,serving-cost-lab int4 gptq g128,serving-cost-lab int4 awq g32,serving-cost-lab int4 gptq-mixed g32"
labels="$labels,serving-cost-lab int4 gguf g32"
for pass in 1 2; do
  .venv/bin/python bench/peers.py --model default --no-ab \
      --ours int4-g32,int4-gptq-g32,int4-gptq-g128,int4-awq-g32,int4-gptq-mixed-g32,int4-gguf \
      --llama Q4_K_M-imatrix,IQ4_XS,IQ4_XS-imatrix --labels "$labels" --out "$here/speed$pass" \
      > "$here/speed$pass.log" 2>&1
done
