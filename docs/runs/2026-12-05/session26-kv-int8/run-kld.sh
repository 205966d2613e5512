#!/usr/bin/env bash
# Session 26: the int8 KV cache's own quality loss again, now that the queries are quantized as the keys are
# (the PyTorch path, PagedKVCache.queries): the 1.5B's fp32 weights, its K/V cached at bf16 and at int8, KLD
# against its fp32 reference on the lab's 8,192 tokens (bench/kv_cache.py part 1, as sessions 7-8 ran it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
PYTHONPATH=. .venv/bin/python bench/kv_cache.py --parts capacity --json "$here/kld.json" > "$here/kld.md" 2> "$here/kld.log"
