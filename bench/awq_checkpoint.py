"""One set of int4 weights every server reads: an AWQ GEMM checkpoint of a model folder, packed by AutoAWQ's own code.

    .venv/bin/python bench/awq_checkpoint.py --model default --out ~/.cache/serving-cost-lab/awq/qwen2.5-coder-1.5b-g32

Our engine loads it as `int4-checkpoint-g32` (engine/quant/checkpoints.py) and vLLM's CPU build serves it with its
CPUWNA16 kernels (engine.peers.servers: vLLM at `int4-checkpoint`), so a comparison of the two under load runs the
same weights. The codes are min/max per group with an integer zero point (AWQ's layout has no float min): this is
AWQ's format, not its activation-aware search. The decoder blocks' linears are quantized; embedding, head, norms
and biases stay as the folder holds them, or (--floats fp16, as AutoAWQ saves a model) are rounded to fp16.
Written to a temporary folder and renamed, so a folder at --out is whole.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def grid(w: torch.Tensor, gs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min/max asymmetric 4-bit codes of w [N, K] per group of gs, zero an integer in 0..15: (the weights on that
    grid [N, K], fp16 scales [G, N], int32 zeros [G, N]) as AutoAWQ's packer takes them."""
    g = w.float().view(w.shape[0], -1, gs)
    mx, mn = g.amax(-1), g.amin(-1)
    scale = ((mx - mn).clamp(min=1e-5) / 15).half().float()
    zero = (-mn / scale).round().clamp(0, 15)
    q = (g / scale[..., None] + zero[..., None]).round().clamp(0, 15)
    w_hat = ((q - zero[..., None]) * scale[..., None]).view_as(w)
    return w_hat, scale.T.contiguous().half(), zero.T.contiguous().int()


def pack(weight: torch.Tensor, bias: torch.Tensor | None, gs: int):
    """AutoAWQ's WQLinear_GEMM of one linear's weight [N, K] on grid()'s codes (its qweight, qzeros, scales)."""
    from awq.modules.linear.gemm import WQLinear_GEMM

    w_hat, scale, zero = grid(weight, gs)
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    lin.weight.data = w_hat
    if bias is not None:
        lin.bias.data = bias.float()
    return WQLinear_GEMM.from_linear(lin, 4, gs, False, scale, zero)


def quantization_config(gs: int) -> dict:
    """config.json's quantization_config as AutoAWQ writes it (AwqConfig.to_transformers_dict)."""
    return {"quant_method": "awq", "zero_point": True, "group_size": gs, "bits": 4, "version": "gemm",
            "modules_to_not_convert": None}


FLOATS = {"source": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def write(src: Path, dest: Path, gs: int = 32, progress=print, floats: str = "source") -> Path:
    """The AWQ GEMM checkpoint of the model folder `src` at `dest` (once); the float tensors as `src` holds them
    ("source") or rounded to fp16/bf16."""
    from safetensors.torch import load_file, save_file

    src, dest = Path(src), Path(dest)
    if (dest / "config.json").exists():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    sd = {}
    for f in sorted(src.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    out = {}
    for k, t in sd.items():
        name, _, part = k.rpartition(".")
        if not (name.startswith("model.layers.") and name.rsplit(".", 1)[-1] in LINEARS):
            out[k] = t if FLOATS[floats] is None else t.to(FLOATS[floats])  # embedding, head, norms
        elif part == "bias":
            out[k] = t.half()  # as AutoAWQ keeps a quantized linear's bias
        else:
            q = pack(t, sd.get(f"{name}.bias"), gs)
            out |= {f"{name}.qweight": q.qweight, f"{name}.qzeros": q.qzeros, f"{name}.scales": q.scales}
            progress(f"packed {name} {tuple(t.shape)}")
    save_file({k: v.contiguous() for k, v in out.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = quantization_config(gs)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in src.iterdir():  # tokenizer, chat template, generation config: not the catalog's manifest, which
        # names the weights the lab converted (these are other weights)
        if f.suffix in (".json", ".jinja", ".txt", ".model") and f.name not in ("config.json", "manifest.json"):
            shutil.copy(f, tmp / f.name)
    os.replace(tmp, dest)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="a catalog model or a folder")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--out", required=True)
    ap.add_argument("--floats", choices=list(FLOATS), default="source",
                    help="embedding, head and norms as the folder holds them, or in fp16 (as AutoAWQ saves) or bf16")
    a = ap.parse_args(argv)
    from engine.infer import catalog

    print(write(catalog.resolve(a.model), Path(a.out), a.group_size, progress=lambda s: None, floats=a.floats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
