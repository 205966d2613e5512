#!/bin/bash
# Issue 26's target run as it ran on 2026-12-02 (22:55-23:44 UTC), from a worktree of the repository at
# ef2c6b6 with a store of its own, on a quiet 2-core AMD EPYC VM (nothing else running).
export SCL_DATA_DIR=${SCL_DATA_DIR:?a store of its own}
PY=.venv/bin/python
start=$(date +%s)
$PY -m engine accuracy --model default --precisions fp32,int8,int4-g32,int4-g64 --subset full --batch 8 \
   > accuracy-full.md 2> accuracy-full.progress.txt
echo "rc=$? elapsed=$(( $(date +%s) - start ))" >> accuracy-full.progress.txt
# KLD beside it (2026-12-03, same store; statistics, not timings): see beside.sh
