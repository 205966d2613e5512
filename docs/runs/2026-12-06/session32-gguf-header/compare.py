"""Every tensor of each GGUF in the lab's cache read by gguf's GGUFReader and by engine.quant.gguf_file.read_gguf:
type, data shape, dtype and bytes equal; the time of each read."""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, ".")
from gguf import GGUFReader  # noqa: E402

from engine.common.paths import cache_dir  # noqa: E402
from engine.quant.gguf_file import read_gguf  # noqa: E402

paths = sorted(cache_dir().glob("gguf/*.gguf")) + sorted(p for p in cache_dir().glob("quality-matched/*/*.gguf")
                                                          if "F32" not in p.name)
for p in paths:
    t0 = time.perf_counter()
    r = GGUFReader(str(p))
    t1 = time.perf_counter()
    g = read_gguf(p)
    t2 = time.perf_counter()
    same = len(r.tensors) == len(g.tensors) and all(
        g.tensors[t.name].tensor_type == t.tensor_type and g.tensors[t.name].data.shape == t.data.shape
        and g.tensors[t.name].data.dtype == t.data.dtype and np.array_equal(g.tensors[t.name].data, t.data)
        for t in r.tensors)
    print(f"{p.parent.name}/{p.name}: {len(r.tensors)} tensors, {'all equal' if same else 'DIFFER'}; "
          f"GGUFReader {t1 - t0:.2f} s, read_gguf {t2 - t1:.3f} s", flush=True)
