"""How long a quantized load takes, with round-to-nearest codes and the CPU tiled layouts made by the extension
(what every load runs) against the torch definitions they reproduce byte for byte (engine/ops/formats.py and
prepared.tile_int4/tile_int8), arms alternated in one process:

    .venv/bin/python bench/load_time.py --models default-draft,default --precisions int4,int8 --reps 2

Each row: the median of --reps loads (`engine.infer.loader.load`, model already converted and in the page cache
after a warm-up load), and the part of it spent in quantize_model (codes, layouts, fused projections).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import ops  # noqa: E402
from engine.infer import loader  # noqa: E402
from engine.ops import prepared  # noqa: E402
from engine.present import format_rows  # noqa: E402


@contextlib.contextmanager
def torch_definitions():
    """The loads' codes and layouts by the torch definitions (the path before the extension made them)."""
    saved = ops.quantize_int4_at_load, ops.quantize_int8_at_load, ops.prepare_int4, ops.prepare_int8

    def prep4(packed, scales, mins, K, gs):
        w, sm = prepared.tile_int4(packed, scales, mins)
        return prepared.PreparedInt4(packed.shape[0], K, gs, "cpu_tiled", w, sm)

    def prep8(q, s):
        w, sp = prepared.tile_int8(q, s.reshape(-1).float())
        return prepared.PreparedInt8(q.shape[0], q.shape[1], "cpu_tiled", w, sp)

    ops.quantize_int4_at_load = lambda w, gs: ops.quantize_int4(w, gs)
    ops.quantize_int8_at_load = lambda w: ops.quantize_int8(w)
    ops.prepare_int4, ops.prepare_int8 = prep4, prep8
    try:
        yield
    finally:
        ops.quantize_int4_at_load, ops.quantize_int8_at_load, ops.prepare_int4, ops.prepare_int8 = saved


def timed_load(model: str, precision: str) -> tuple[float, float]:
    """(load s, quantize_model s) of one load."""
    spent = [0.0]
    inner = loader.quantize_model

    def quantize_model(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t

    loader.quantize_model = quantize_model
    try:
        t0 = time.perf_counter()
        lm = loader.load(model, precision, "cpu")
        total = time.perf_counter() - t0
    finally:
        loader.quantize_model = inner
    del lm
    return total, spent[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="default-draft,default")
    ap.add_argument("--precisions", default="int4,int8")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    if ops.load_cpu_extension() is None:
        print("the CPU extension is not built here: nothing to compare", file=sys.stderr)
        return 2
    rows = []
    for model in a.models.split(","):
        for precision in a.precisions.split(","):
            timed_load(model, precision)  # warm-up: the safetensors in the page cache, the extension loaded
            got = {"extension": [], "torch": []}
            for _ in range(a.reps):
                for arm in ("torch", "extension"):
                    with torch_definitions() if arm == "torch" else contextlib.nullcontext():
                        got[arm].append(timed_load(model, precision))
            med = {arm: (statistics.median(t for t, _ in v), statistics.median(q for _, q in v))
                   for arm, v in got.items()}
            rows.append({"model": model, "precision": precision,
                         "load s, torch": round(med["torch"][0], 2), "load s, extension": round(med["extension"][0], 2),
                         "load speed-up": round(med["torch"][0] / med["extension"][0], 2),
                         "quantize_model s, torch": round(med["torch"][1], 2),
                         "quantize_model s, extension": round(med["extension"][1], 2)})
            print(rows[-1], file=sys.stderr, flush=True)
    print(format_rows(rows, "md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
