#!/bin/sh
# Session 34 (issue 41.3): what bench's static batch (run_static: prefill-first, chunks of 512) holds for a windowed
# model at 32,768 positions with a 4,096-token window: the paged cache it now picks (blocks behind the window go
# back) against slots of every position, the Mistral shape (head_dim 64: the fused step) and the Gemma 3 shape,
# three passes alternating the caches. Run from the repository root.
# block-major/: the first version of this command, before the CPU pool went head-major and blocks were taken in runs
# (before f7d6bee; one pass each, the Mistral shape at its head_dim 32, which runs the PyTorch path; the paged decode
# steps read 1.44x (Mistral) and 2.33x (Gemma 3) the slots' there).
set -e
D=docs/runs/2026-12-06/session34-kv-static
PYTHONPATH=. .venv/bin/python bench/kv_window.py --static --head-dim 64 --out $D/mistral > $D/mistral.log 2>&1
PYTHONPATH=. .venv/bin/python bench/kv_window.py --static --family gemma3 --out $D/gemma3 > $D/gemma3.log 2>&1
