"""Session 33: the AWQ g32 cache entry made by this session's calibration against session 31's, bit for bit.

    .venv/bin/python docs/runs/2026-12-06/session33-awq-calibration/compare.py OLD_ENTRY NEW_ENTRY
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

old, new = Path(sys.argv[1]), Path(sys.argv[2])
same = True
for f in ("codes.safetensors", "floats.safetensors"):
    a, b = load_file(str(old / f)), load_file(str(new / f))
    diff = sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not torch.equal(a[k], b[k]))
    print(f"{f}: {len(a)} tensors, {len(diff)} differ" + (f": {diff[:5]}" if diff else ""))
    same = same and not diff
ma, mb = json.loads((old / "manifest.json").read_text()), json.loads((new / "manifest.json").read_text())
keys = sorted(k for k in ma.keys() | mb.keys() if ma.get(k) != mb.get(k))
print("manifest fields that differ:", keys)
print("bit-identical codes and floats:", same)
