"""How much of the reference's Q4_K grid each int4 recovers exactly.

The lab's fp32 reference is the shipped Q4_K_M dequantized, so its Q4_K tensors lie on Q4_K's grid:
each sub-block of 32 weights is d·sc·q − dmin·m with q in 0..15. A quantizer that lands on the same
grid reproduces the reference exactly there and scores a KLD that no quantizer of real weights could.
This measures, per Q4_K tensor of the shipped file and per sub-block of 32:
- llama.cpp's Q4_K_M requantized from the reference (llama.cpp's own quantizer, engine.peers.gguf_tools):
  the share of sub-blocks whose dequantized weights equal the reference's bit for bit;
- ours, round-to-nearest g32 (min/max per group): the share equal up to the fp16 rounding of our scale and
  min (2^-11 of each), which happens where the sub-block's codes span the whole 0..15;
- the share of sub-blocks whose codes span 0..15 (which says why round-to-nearest recovers what it does).

    .venv/bin/python bench/blocks_recovered.py --model default --out docs/runs/<date>/blocks-recovered
    .venv/bin/python bench/blocks_recovered.py --llama-type Q4_K_M-imatrix   # llama.cpp with its importance matrix
    .venv/bin/python bench/blocks_recovered.py --folder <a permuted folder>   # any folder: what llama.cpp copies

Writes <out>/blocks_recovered.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.infer import catalog  # noqa: E402
from engine.ops.formats import dequantize_int4, quantize_int4, unpack_int4  # noqa: E402
from engine.peers.gguf_tools import reference_ggufs  # noqa: E402
from engine.quant.gguf_codes import decode_int4_blocks  # noqa: E402

GROUP = 32


def compare(ref_raw, req_raw, req_kind: str, n: int, k: int) -> dict[str, int]:
    """Counts of sub-blocks (of 32) for one Q4_K tensor of the shipped file: total, llama.cpp's requantization
    equal bit for bit (0 unless it chose Q4_K too), ours round-to-nearest equal to fp16 rounding, codes spanning
    0..15."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    ref = torch.from_numpy(dequantize(ref_raw, GGMLQuantizationType.Q4_K).astype(np.float32).reshape(n, k))
    packed, _, _ = decode_int4_blocks(ref_raw, "Q4_K", n, k)
    q = unpack_int4(packed).view(n, k // GROUP, GROUP)
    full = (q.amin(-1) == 0) & (q.amax(-1) == 15)
    out = {"sub_blocks": n * k // GROUP, "spans_0_15": int(full.sum())}
    if req_kind == "Q4_K":
        req = torch.from_numpy(dequantize(req_raw, GGMLQuantizationType.Q4_K).astype(np.float32).reshape(n, k))
        out["llama_exact"] = int((req == ref).view(n, k // GROUP, GROUP).all(-1).sum())
    else:
        out["llama_exact"] = 0
    out["rtn_exact_fp16"] = rtn_exact(ref)
    return out


def rtn_exact(ref: torch.Tensor) -> int:
    """Sub-blocks of 32 that our round-to-nearest g32 reproduces, up to the fp16 rounding of scale and min."""
    n, k = ref.shape
    p, s, m = quantize_int4(ref, GROUP)
    tol = ((15 * s.float().abs() + m.float().abs()) * 2 ** -11).repeat_interleave(GROUP, 1)
    return int(((dequantize_int4(p, s, m, k) - ref).abs() <= tol).view(n, k // GROUP, GROUP).all(-1).sum())


def run(model: str, progress=print, llama_type: str = "Q4_K_M") -> dict:
    from engine.quant.gguf_file import read_gguf

    t0 = time.time()
    folder = catalog.resolve(model)
    shipped = read_gguf(catalog.gguf_path(model))
    req = read_gguf(reference_ggufs(catalog.canonical_name(model), Path(folder), (llama_type,),
                                    progress)[llama_type]).tensors
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in shipped.tensors.values():
        if t.tensor_type.name != "Q4_K":
            continue
        k, n = (int(x) for x in t.shape)
        r = req[t.name]
        c = compare(t.data, r.data, r.tensor_type.name, n, k)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else t.name
        c["requantized_as_q4_k"] = c["sub_blocks"] if r.tensor_type.name == "Q4_K" else 0
        for key, v in c.items():
            kinds[kind][key] += v
            kinds["all"][key] += v
        progress(f"{t.name}: {c}")
    return {"model": catalog.canonical_name(model), "shipped": str(catalog.gguf_path(model).name),
            "llama_type": llama_type,
            "kinds": {k: dict(v) for k, v in kinds.items()}, "wall_s": round(time.time() - t0, 1)}


def run_folder(folder: Path, progress=print, llama_type: str = "Q4_K_M") -> dict:
    """Against a reference folder that is on no GGUF's grid (bench/permuted_model.py): per tensor of llama.cpp's
    requantization, the share of sub-blocks of 32 equal to the folder's weights bit for bit, by the type llama.cpp
    chose; and ours round-to-nearest g32 equal to fp16 rounding, as above."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from safetensors import safe_open

    from engine.quant.gguf_codes import hf_name
    from engine.quant.gguf_file import read_gguf

    t0 = time.time()
    folder = Path(folder)
    req = read_gguf(reference_ggufs(str(folder), folder, (llama_type,), progress)[llama_type]).tensors
    h = safe_open(str(folder / "model.safetensors"), "pt")
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in req.values():
        kind = t.tensor_type.name
        if len(t.shape) != 2 or kind in ("F32", "F16", "BF16") or hf_name(t.name) not in h.keys():
            continue
        k, n = (int(x) for x in t.shape)
        ref = h.get_tensor(hf_name(t.name)).float()
        got = torch.from_numpy(dequantize(t.data, GGMLQuantizationType[kind]).astype(np.float32).reshape(n, k))
        c = {"sub_blocks": n * k // GROUP, "llama_exact": int((got == ref).view(n, -1, GROUP).all(-1).sum()),
             "rtn_exact_fp16": rtn_exact(ref)}
        for key in (f"{kind} {t.name.split('.')[2] if t.name.startswith('blk.') else t.name}", f"{kind} all", "all"):
            for f, v in c.items():
                kinds[key][f] += v
        progress(f"{t.name} ({kind}): {c}")
    return {"model": str(folder), "llama_type": llama_type, "kinds": {k: dict(v) for k, v in kinds.items()},
            "wall_s": round(time.time() - t0, 1)}


def markdown_folder(rep: dict, command: str) -> str:
    lines = [f"# Sub-blocks of an off-grid reference recovered exactly ({rep['model']})", "", f"Command: `{command}`",
             "", f"Every block-quantized tensor of llama.cpp's {rep['llama_type']} requantized from the folder, per "
             "sub-block of 32 weights, by the type llama.cpp chose for it: equal to the folder's fp32 weights bit for "
             "bit. Ours: round-to-nearest g32 of the same tensors, equal up to the fp16 rounding of scale and min.", "",
             "| llama.cpp type, tensors | sub-blocks | llama.cpp exact | ours RTN g32 exact |",
             "| --- | ---: | ---: | ---: |"]
    for kind, c in sorted(rep["kinds"].items(), key=lambda kv: (kv[0] == "all", kv[0])):
        n = c["sub_blocks"]
        lines.append(f"| {kind} | {n:,} | {c['llama_exact'] / n:.2%} | {c['rtn_exact_fp16'] / n:.2%} |")
    lines += ["", f"Wall time {rep['wall_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def markdown(rep: dict, command: str) -> str:
    lines = [f"# Sub-blocks of the reference's Q4_K grid recovered exactly ({rep['model']})", "",
             f"Command: `{command}`", "",
             "Every Q4_K tensor of the shipped file, per sub-block of 32 weights. The reference is that file "
             f"dequantized. llama.cpp: its {rep.get('llama_type', 'Q4_K_M')} requantized from the reference (its own "
             "quantizer), equal bit for bit. Ours: round-to-nearest g32, equal up to the fp16 rounding of scale and "
             "min.", "",
             "| tensors | sub-blocks | llama.cpp requantized as Q4_K | llama.cpp exact | ours RTN g32 exact "
             "| codes span 0..15 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for kind, c in sorted(rep["kinds"].items(), key=lambda kv: (kv[0] == "all", kv[0])):
        n = c["sub_blocks"]
        lines.append(f"| {kind} | {n:,} | {c['requantized_as_q4_k'] / n:.1%} | {c['llama_exact'] / n:.1%} | "
                     f"{c['rtn_exact_fp16'] / n:.1%} | {c['spans_0_15'] / n:.1%} |")
    lines += ["", f"Wall time {rep['wall_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--llama-type", default="Q4_K_M", help="llama.cpp's requantization to compare: Q4_K_M or "
                                                            "Q4_K_M-imatrix (engine.peers.gguf_tools)")
    ap.add_argument("--folder", default=None, help="an off-grid reference folder (bench/permuted_model.py) instead "
                                                      "of a catalog model's shipped grid")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "blocks-recovered"))
    a = ap.parse_args(argv)
    command = "python bench/blocks_recovered.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.folder:
        rep = run_folder(Path(a.folder), llama_type=a.llama_type)
        md = markdown_folder(rep, command)
    else:
        rep = run(a.model, llama_type=a.llama_type)
        md = markdown(rep, command)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "blocks_recovered.json").write_text(json.dumps(rep, indent=1))
    (out / "blocks_recovered.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
