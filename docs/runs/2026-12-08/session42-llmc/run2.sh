#!/bin/bash
# Session 42, after run.sh (waits for its PID): the 0.5B (its reference the shipped Q4_K_M dequantized, on Q4_K's
# grid), GPTQ g128 at the lab's defaults (head quantized) by our GPTQ and by llm-compressor, each calibrated here; KLD
# on 2,048 tokens. Session 41 compared the two there with the head dense.
D=docs/runs/2026-12-08/session42-llmc
while kill -0 "$1" 2>/dev/null; do sleep 5; done
QM=".venv/bin/python bench/quality_matched.py --model default-draft --no-probe --no-shipped --no-weight-check"
date; { time $QM --tokens 2048 --parts ours --group-sizes 128 --no-int8 --methods gptq,gptq-llmc --out $D/qm05-g128; } > $D/qm05-g128.log 2>&1
date; uptime
