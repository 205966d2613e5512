#!/bin/sh
# Session 34: the fused decode step's attention phase on a slot cache against paged pools, one process, alternated
# (ab_attention.py: head-major pools with blocks in order, every other block, shuffled, blocks of 256, and the
# block-major layout of before f7d6bee). Run from the repository root; the machine otherwise idle.
set -e
D=docs/runs/2026-12-06/session34-paged-attention
PYTHONPATH=. .venv/bin/python $D/ab_attention.py 30 > $D/ab_attention.md 2> $D/ab_attention.log
