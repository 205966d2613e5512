#!/bin/bash
# Session 41: our GPTQ g128 against llm-compressor's on the 0.5B (README.md beside this script). Run from the
# repository root after ../run3.sh (the machine to itself). llm-compressor 0.14.0.1 in a venv of its own:
#   python3 -m venv /tmp/llmc && /tmp/llmc/bin/pip install torch==2.13.0 && /tmp/llmc/bin/pip install llmcompressor==0.14.0.1
D=docs/runs/2026-12-07/session41-g128/llmc
W=/tmp/llmc-work
mkdir -p $W
for pid in "$@"; do while kill -0 "$pid" 2>/dev/null; do sleep 5; done; done
date; .venv/bin/python $D/dump_docs.py $W/docs.json > $D/dump_docs.log 2>&1
date; /tmp/llmc/bin/python $D/llmc_gptq.py $W/docs.json $W/qwen2.5-coder-0.5b-llmc-gptq-g128 > $D/llmc_gptq.log 2>&1
date; .venv/bin/python $D/compare.py $W/qwen2.5-coder-0.5b-llmc-gptq-g128 $D/compare.json > $D/compare.log 2>&1
date; uptime
