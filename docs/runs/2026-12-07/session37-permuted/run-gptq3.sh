#!/bin/bash
# Session 37, after GPTQ's Hessian is shrunk toward its diagonal and damped 10% (calibrate.VERSIONS["gptq"] = 3):
# GPTQ g32 and GPTQ-mixed g32 again on the permuted 1.5B, the same 2,048 tokens and reference.
set -x
D=docs/runs/2026-12-07/session37-permuted
P=$HOME/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0
date; .venv/bin/python bench/quality_matched.py --model $P --tokens 2048 --no-probe --no-shipped --no-weight-check --parts ours --group-sizes 32 --no-int8 --methods gptq,gptq-mixed --out $D/qm-ours-gptq3
date
