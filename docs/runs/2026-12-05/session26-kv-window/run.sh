#!/bin/sh
# Issue 41, item 3: what a windowed model's KV cache holds at 32k context (session 26).
cd "$(dirname "$0")/../../../.." || exit 1
PYTHONPATH=. .venv/bin/python bench/kv_window.py --window 4096 --context 32768 --new 64 --seqs 2 --chunk 64 \
  --out docs/runs/2026-12-05/session26-kv-window 2>&1 | grep -v -i "warn\|pynvml\|Writing model" \
  | tee docs/runs/2026-12-05/session26-kv-window/kv_window.log
