#!/usr/bin/env bash
# Session 31 (issue 36, item 6): HumanEval pass@1 (all 164, greedy, 8 slots) of llama-server at llama.cpp's
# weights WITHOUT an importance matrix (llama-quantize's default, built once into the lab's cache): `run.sh
# Q4_K_M-requant`, `run.sh IQ4_XS`, exactly as `python -m engine accuracy --llama <type>` runs its peer
# row, but without
# re-running one of our precisions first (the reference's outcomes are session 17's fp32 run, reproduced on two
# machines). A store of its own; paired problem by problem against that fp32 run. Writes next to this script.
set -euo pipefail
type="${1:-Q4_K_M-requant}"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$(git -C "$here" rev-parse --show-toplevel)"
store="$(mktemp -d)"
SCL_DATA_DIR="$store" SCL_LLAMA_TYPE="$type" .venv/bin/python - > "$here/$type-accuracy.md" \
  2> "$here/$type-accuracy.progress.txt" <<'PY'
import os
import sys
from engine.common.formulas import DEFAULT_USD_PER_HOUR
from engine.measure import sandbox
from engine.measure.accuracy import DEFAULT_MAX_NEW_TOKENS
from engine.measure.pool import ModelPool
from engine.measure.runner import run_many
from engine.measure.store import Store
from engine.peers import servers
from engine.peers.server_accuracy import ServerAccuracyItem
from engine.present import format_rows
from engine.present.accuracy_view import NOTE, accuracy_rows

sandbox.check_available()
common = dict(subset="full", ids=None, max_new_tokens=DEFAULT_MAX_NEW_TOKENS,
              usd_per_hour=DEFAULT_USD_PER_HOUR, limits=sandbox.Limits())
items = [ServerAccuracyItem(servers.ServerSpec.of("llama-server", model="default", precision=t, slots=8,
                                                  max_model_len=2048).validate(), common)
         for t in (os.environ["SCL_LLAMA_TYPE"],)]
store = Store()
recs = run_many(items, ModelPool(keep=1), store, say=lambda s: print(f"  [{s}]", file=sys.stderr),
                noun="configuration", on_skip=lambda rec: print(f"{rec.label}: {rec.notes}", file=sys.stderr))
print(format_rows(accuracy_rows(recs, store.list_runs(1000)), "md"))
print("\n" + NOTE)
PY
.venv/bin/python "$here/../../2026-12-04/session18-gptq-code-calibration/paired.py" \
    "$here/../../2026-12-04/session17-gptq-1p5b/accuracy-full.progress.txt" "$here/$type-accuracy.progress.txt" \
    > "$here/$type-paired.txt"
rm -rf "$store"
