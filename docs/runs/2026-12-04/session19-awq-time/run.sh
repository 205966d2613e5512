#!/usr/bin/env bash
# Session 19 (issue 36): AWQ's calibration of the 1.5B after its search's round trip was fused, the machine to
# itself: calibrates int4-awq-g32 into a fresh quantized/ (the models and GGUFs linked from the usual cache), then
# compares the entry's codes and folded floats with session 18's entry, made by the earlier search.
# Run from a checkout with .venv (make setup models); writes next to this script.
#   run.sh <session 18's entry folder, e.g. ~/.cache/serving-cost-lab/quantized/default-awq-g32-b0860f0072c0>
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before="$1"
cd "$(git -C "$here" rev-parse --show-toplevel)"
cache="$(mktemp -d)"
for d in models gguf kernels; do ln -s "$HOME/.cache/serving-cost-lab/$d" "$cache/$d"; done
{ lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400; git rev-parse HEAD; } > "$here/machine.txt"
SCL_CACHE_DIR="$cache" .venv/bin/python - "$before" > "$here/calibration.txt" 2>&1 <<'PY'
import json, sys, time
from pathlib import Path
import torch
from safetensors.torch import load_file
from engine.common.paths import cache_dir
from engine.infer.loader import load

t0 = time.perf_counter()
load("default", "int4-awq-g32", progress=lambda s: print(s, flush=True))
print(f"load with calibration: {time.perf_counter() - t0:.1f} s; torch threads {torch.get_num_threads()}")
(entry,) = (cache_dir() / "quantized").glob("default-awq-g32-*")
before = Path(sys.argv[1])
print("entry", entry.name, "before", before.name)
for m in (json.loads((p / "manifest.json").read_text()) for p in (before, entry)):
    print("manifest seconds", m["seconds"], "tokens", m["calibration_tokens"], "set", m["calibration_set"])
for f in ("codes.safetensors", "floats.safetensors"):
    a, b = load_file(str(before / f)), load_file(str(entry / f))
    same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    print(f"{f}: {len(a)} tensors, identical to the earlier search's: {same}")
PY
cp "$(ls -d "$cache"/quantized/default-awq-g32-*)/manifest.json" "$here/manifest.json"
rm -rf "$cache"
