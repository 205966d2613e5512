"""Where a decode step's time goes in our engine: per layer type, against the bandwidth floor.

    .venv/bin/python bench/profile_decode.py --model default --precision int4 --tokens 48

Forward hooks time every linear (by projection name), the attention core (attention minus its
projections), the norms and the rest of the forward (embedding, rope tables, masks, residuals);
"outside forward" is sampling and the generation loop. Each linear's bytes give its achieved
GB/s against the bandwidth probe. The hooks cost a few microseconds per call, which the step
total includes, so compare the "total with hooks" line to an unhooked step (printed first).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.infer.generate import generate  # noqa: E402
from engine.infer.loader import load, make_spec  # noqa: E402
from engine.measure.bandwidth import bandwidth_gbs  # noqa: E402
from engine.measure.runs import default_prompts  # noqa: E402
from engine.present import format_rows  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj", "down_proj",
           "lm_head")


def _bytes(mod) -> int:
    if hasattr(mod, "weight_nbytes"):
        return mod.weight_nbytes()
    return sum(t.numel() * t.element_size() for t in mod.state_dict().values())


def profile(lm, tokens: int, prompt: str):
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    nbytes: dict[str, int] = defaultdict(int)
    starts: dict[int, float] = {}
    hooks = []
    state = {"forwards": 0}  # the first forward is the prefill: not counted

    def category(name: str) -> str | None:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in LINEARS:
            return leaf
        if leaf == "self_attn":
            return "attention (whole)"
        if leaf in ("input_layernorm", "post_attention_layernorm", "norm"):
            return "rmsnorm"
        if leaf == "mlp":
            return "mlp (whole)"
        return None

    for name, mod in lm.model.named_modules():
        cat = category(name)
        if cat is None:
            continue
        if cat in LINEARS:
            nbytes[cat] += _bytes(mod)

        def pre(m, args, _id=id(mod)):
            starts[_id] = time.perf_counter()

        def post(m, args, out, _id=id(mod), _cat=cat):
            if state["forwards"] > 1:
                spent[_cat] += time.perf_counter() - starts[_id]
                calls[_cat] += 1

        hooks += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    fwd = {"s": 0.0}

    def fpre(m, a):
        state["forwards"] += 1
        fwd["t"] = time.perf_counter()

    def fpost(m, a, o):
        if state["forwards"] > 1:
            fwd["s"] += time.perf_counter() - fwd["t"]

    hooks += [lm.model.register_forward_pre_hook(fpre), lm.model.register_forward_hook(fpost)]
    try:
        spent.clear(), calls.clear()
        fwd["s"] = 0.0
        res = generate(lm, [prompt], tokens, stop_at_eos=False)
    finally:
        for h in hooks:
            h.remove()
    return res, spent, calls, nbytes, fwd["s"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args(argv)
    lm = load(a.model, make_spec(a.precision), "cpu")
    prompt = default_prompts()[0]
    generate(lm, [prompt], 8, stop_at_eos=False)  # warm-up
    plain = generate(lm, [prompt], a.tokens, stop_at_eos=False)
    plain_ms = 1000 * statistics.median(plain.step_s)
    res, spent, calls, nbytes, fwd_s = profile(lm, a.tokens, prompt)
    # The prefill forward is in the hooks too: subtract it by scaling to decode steps only.
    steps = len(res.step_s)
    total_ms = 1000 * sum(res.step_s) / steps
    bw = bandwidth_gbs("cpu")
    rows = []

    def per_step(cat):
        return 1000 * spent[cat] / steps if calls[cat] else 0.0

    lin_total = 0.0
    for cat in [c for c in LINEARS if calls[c]]:
        ms = per_step(cat)
        lin_total += ms
        floor = nbytes[cat] / (bw * 1e9) * 1000
        rows.append({"part": cat, "ms/step": round(ms, 2), "share": round(ms / total_ms, 3),
                     "MB read": round(nbytes[cat] / 1e6, 1), "GB/s": round(nbytes[cat] / (ms / 1000) / 1e9, 1)
                     if ms else None, "floor ms": round(floor, 2), "vs floor": round(ms / floor, 2) if floor else None})
    attn_core = per_step("attention (whole)") - sum(per_step(c) for c in ("q_proj", "k_proj", "v_proj", "qkv_proj",
                                                                          "o_proj"))
    mlp_rest = per_step("mlp (whole)") - sum(per_step(c) for c in ("gate_proj", "up_proj", "gate_up_proj",
                                                                   "down_proj"))
    norm = per_step("rmsnorm")
    blocks = per_step("attention (whole)") + per_step("mlp (whole)") + norm
    fwd_ms = 1000 * fwd_s / steps
    other_fwd = fwd_ms - blocks - per_step("lm_head")
    outside = total_ms - fwd_ms
    for part, ms in (("attention core (rope, cache write, sdpa)", attn_core), ("silu * up", mlp_rest),
                     ("rmsnorm", norm), ("rest of forward (embed, masks, residuals)", other_fwd),
                     ("outside forward (sampling, loop)", outside)):
        rows.append({"part": part, "ms/step": round(ms, 2), "share": round(ms / total_ms, 3)})
    all_bytes = sum(nbytes.values())
    floor_all = all_bytes / (bw * 1e9) * 1000
    rows.append({"part": "total with hooks", "ms/step": round(total_ms, 2), "share": 1.0,
                 "MB read": round(all_bytes / 1e6, 1), "GB/s": round(all_bytes / (total_ms / 1000) / 1e9, 1),
                 "floor ms": round(floor_all, 2), "vs floor": round(total_ms / floor_all, 2)})
    print(f"# {lm.label}: decode step {plain_ms:.1f} ms without hooks ({1000 / plain_ms:.1f} tok/s), "
          f"{total_ms:.1f} ms with hooks; bandwidth probe {bw:.1f} GB/s; {lm.cfg.num_layers} layers")
    print(format_rows(rows, "md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
