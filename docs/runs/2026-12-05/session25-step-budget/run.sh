#!/usr/bin/env bash
# Session 25 (issue 41, item 1): the step's token budget under load, vLLM's client, concurrency 8, fresh random
# prompts of 256 tokens, 128 output tokens forced; each model's servers one after another in one run, chunk 64:
# --max-step-factor 0 (the budget before: a decode round plus one whole chunk) against 3 (the default) and 2.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
.venv/bin/python bench/itl_tails.py --model default-draft --step-factors 0,3,2 --requests 32 > "$here/0p5b.md" 2> "$here/0p5b.log"
.venv/bin/python bench/itl_tails.py --model default --step-factors 0,3 --requests 32 > "$here/1p5b.md" 2> "$here/1p5b.log"
# then, right after: factor 2.5 against 0 on both
.venv/bin/python bench/itl_tails.py --model default-draft --step-factors 0,2.5 --requests 32 > "$here/0p5b-2.5.md" 2> "$here/0p5b-2.5.log"
.venv/bin/python bench/itl_tails.py --model default --step-factors 0,2.5 --requests 32 > "$here/1p5b-2.5.md" 2> "$here/1p5b-2.5.log"
