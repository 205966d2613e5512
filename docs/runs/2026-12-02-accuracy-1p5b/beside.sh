#!/bin/bash
# KLD beside the accuracy rows (2026-12-03 04:05-04:32 UTC, same store as run.sh): quality records of the same
# model and precisions on the 8,192 positions of docs/BENCHMARKS.md "Quality". Statistics, not timings.
export SCL_DATA_DIR=${SCL_DATA_DIR:?the store of run.sh}
PY=.venv/bin/python
$PY -m engine bench --model default --precisions fp32,int8,int4 --quality --quality-tokens 8192 \
   --reps 1 --max-new-tokens 4 --prompt "def add(a, b):" > bench-quality-8192.md
$PY -m engine bench --model default --precisions int4 --group-size 32 --quality --quality-tokens 8192 \
   --reps 1 --max-new-tokens 4 --prompt "def add(a, b):" > bench-quality-8192-int4-g32.md
# llama.cpp's Q4_K_M of the shipped GGUF (2026-12-03 05:36-05:44 UTC, at 9c712b4, which stores it as a run)
$PY -m engine quality --model default --precisions "" > quality-llama-cpp-q4km-8192.md
# speculative decoding on the same problems (2026-12-03 04:33-04:39 UTC): int4 g64 drafted by n-gram lookup
$PY -m engine accuracy --model default --precisions int4-g64 --draft ngram --gamma 4 --subset full --batch 8 --no-peers \
   > accuracy-int4-ngram-full.md
# the tables, read from the store (--reference from 7d4fa89 on)
$PY -m engine accuracy --stored > accuracy-stored.md
$PY -m engine accuracy --stored --reference 4 > accuracy-stored-reference-int4-g64.md
