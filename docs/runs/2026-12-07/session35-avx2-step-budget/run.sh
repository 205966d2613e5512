#!/usr/bin/env bash
# Session 35 (issue 41, item 1, on the AVX2-only Zen 3 host whose kind gave the issue's 8.9x and 12.6x ITL tails):
# session 26's command again. vLLM's client, concurrency 8, 32 fresh random prompts of 256 tokens, 128 output
# tokens forced, prefill chunk 64; each model's servers one after another: --max-step-factor 0 (a decode round
# plus one whole chunk, the budget before issue 41) against 2.5 (the default). The machine to itself.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
uptime > "$here/load.txt"
.venv/bin/python bench/itl_tails.py --model default-draft --step-factors 0,2.5 --requests 32 > "$here/0p5b.md" 2> "$here/0p5b.log"
.venv/bin/python bench/itl_tails.py --model default --step-factors 0,2.5 --requests 32 > "$here/1p5b.md" 2> "$here/1p5b.log"
uptime >> "$here/load.txt"
