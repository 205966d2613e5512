#!/usr/bin/env bash
# Session 26 (issue 41, item 1): the step budget re-measured on the version that sizes the prefill chunk to the
# chosen rows (3302d22 on; session 25's rows ran the version that cut chunks), from a clean checkout of 769dd08
# (the working tree held uncommitted kernel edits: a server started from it would build them). vLLM's client,
# concurrency 8, fresh random prompts of 256 tokens, 128 output tokens forced; each model's servers one after
# another: --max-step-factor 0 (a decode round plus one whole chunk) against 2.5 (the default).
#   git worktree add /tmp/w/before 769dd08 && docs/runs/2026-12-05/session26-step-budget/run.sh /tmp/w/before
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${1:-$(git -C "$here" rev-parse --show-toplevel)}"
cd "$src"
py=/work/main/.venv/bin/python
[ -x .venv/bin/python ] && py=.venv/bin/python
$py bench/itl_tails.py --model default-draft --step-factors 0,2.5 --requests 32 > "$here/0p5b.md" 2> "$here/0p5b.log"
$py bench/itl_tails.py --model default --step-factors 0,2.5 --requests 32 > "$here/1p5b.md" 2> "$here/1p5b.log"
