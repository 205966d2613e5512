#!/usr/bin/env bash
# Session 26 (issue 41, item 3): decode over an fp32 and an int8 paged KV cache, before (769dd08: each attention
# item dequantized its int8 tiles into fp32) and after (integer q.k dot products), one after the other.
#   git worktree add /tmp/w/before 769dd08 && cp bench/kv_int8_attention.py /tmp/w/before/bench/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(git -C "$here" rev-parse --show-toplevel)"
before="${1:-/tmp/w/before}"
for side in before after; do
  src=$root; [ $side = before ] && src=$before
  (cd "$src" && PYTHONPATH=. "$root/.venv/bin/python" bench/kv_int8_attention.py --contexts 512,2048,4096 --rounds 5 \
     --out "$here/$side" > "$here/$side.md" 2> "$here/$side.log")
done
