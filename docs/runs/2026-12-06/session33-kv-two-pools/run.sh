#!/bin/sh
# Session 33 (issue 41.3): what a windowed model's KV cache holds at 32,768 positions, a 4,096-token window.
# Gemma 3 shape (5 windowed layers : 1 full; the windowed ones in their own pool) and, again, the Mistral shape.
# Run from the repository root. first-pass/: the same Gemma command while the test suite ran beside it
# (its wall times are not the machine's alone; its blocks and bytes are the same).
set -e
PYTHONPATH=. .venv/bin/python bench/kv_window.py --family gemma3 --out docs/runs/2026-12-06/session33-kv-two-pools \
  > docs/runs/2026-12-06/session33-kv-two-pools/kv_window.log 2>&1
PYTHONPATH=. .venv/bin/python bench/kv_window.py --out docs/runs/2026-12-06/session33-kv-two-pools/mistral \
  > docs/runs/2026-12-06/session33-kv-two-pools/mistral/kv_window.log 2>&1
