#!/bin/bash
# Session 41: run.sh's comparison on the 1.5B's off-grid reference (the permuted folder), after ../run5.sh, the
# machine to itself: llm-compressor's GPTQ g128 on our calibration documents, then compare15.py (which calibrates
# our GPTQ g128 with the head dense first: the head is in the cache key). Run from the repository root.
D=docs/runs/2026-12-07/session41-g128/llmc
W=/tmp/llmc-work
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
mkdir -p $W
for pid in "$@"; do while kill -0 "$pid" 2>/dev/null; do sleep 5; done; done
date; .venv/bin/python $D/dump_docs.py $W/docs15.json $P > $D/dump_docs15.log 2>&1
date; /tmp/llmc/bin/python $D/llmc_gptq.py $W/docs15.json $W/permuted-1.5b-llmc-gptq-g128 > $D/llmc_gptq15.log 2>&1
date; .venv/bin/python $D/compare15.py $W/permuted-1.5b-llmc-gptq-g128 $D/compare15.json > $D/compare15.log 2>&1
date; uptime
