"""Where a decode step's time goes in our engine, for the fused and the unfused path, against the bandwidth floor.

    .venv/bin/python bench/profile_decode.py --model default --precision int4 --tokens 48
    .venv/bin/python bench/profile_decode.py --model default-draft --act int8 --path fused

Fused path (engine/ops/fused.py, one C++ call per step): the step's own phase timers (per thread,
wall time; "barrier wait" is a thread waiting for the other at the end of a phase), the projections'
bytes against the bandwidth probe, and what is spent outside the C++ call (embedding, sampling,
the generation loop). Unfused path (the PyTorch reference): forward hooks time every linear (by
projection name), the attention core, the norms and the rest of the forward; the hooks cost a few
microseconds per call, so the first line also gives an unhooked step.

Both: a decode step from generate() (median), and forward passes of 1 row and of gamma + 1 = 5 rows
(speculative verification) at the same position, min of --reps.
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

from engine import ops  # noqa: E402
from engine.infer.generate import generate  # noqa: E402
from engine.infer.loader import load, make_spec  # noqa: E402
from engine.infer.model import Rows  # noqa: E402
from engine.measure.bandwidth import bandwidth_gbs  # noqa: E402
from engine.measure.runs import default_prompts  # noqa: E402
from engine.present import format_rows  # noqa: E402

LINEARS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj", "down_proj",
           "lm_head")
# fused-step categories that stream a projection's weights -> the linears they read (a layer whose q/k/v or gate/up
# differ in precision, as a mixed model's may, keeps them apart: their bytes count in the same phase)
FUSED_WEIGHTS = {"qkv tiles": ("qkv_proj", "q_proj", "k_proj", "v_proj"), "o tiles + residual": ("o_proj",),
                 "gate/up tiles + silu*up + down-input prep": ("gate_up_proj", "gate_proj", "up_proj"),
                 "down tiles + residual": ("down_proj",), "final norm + head": ("lm_head",)}


def _bytes(mod) -> int:
    if hasattr(mod, "weight_nbytes"):
        return mod.weight_nbytes()
    return sum(t.numel() * t.element_size() for t in mod.state_dict().values())


def linear_bytes(lm) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for name, mod in lm.model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in LINEARS:
            out[leaf] += _bytes(mod)
    return out


def forward_ms(lm, ids: list[int], rows: int, reps: int) -> float:
    """min time of a forward pass of `rows` rows of one sequence after a prefill of ids."""
    m = lm.model
    cache = m.new_cache(1, len(ids) + rows + 8)
    toks = torch.tensor(ids)
    with torch.inference_mode():
        m.forward_rows(toks, Rows.of([(0, 0, len(ids))], "cpu"), cache, logits_at=torch.tensor([len(ids) - 1]))
        ts = []
        nxt = torch.tensor(ids[-rows:])
        for _ in range(reps):
            t = time.perf_counter()
            m.forward_rows(nxt, Rows.of([(0, len(ids), rows)], "cpu"), cache)
            ts.append(time.perf_counter() - t)
    return 1000 * min(ts)


def hooked_profile(lm, tokens: int, prompt: str):
    """The unfused path under forward hooks: seconds per category over the decode steps."""
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    starts: dict[int, float] = {}
    hooks = []
    state = {"forwards": 0}  # the first forward is the prefill: not counted

    def category(name: str) -> str | None:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in LINEARS:
            return leaf
        return {"self_attn": "attention (whole)", "input_layernorm": "rmsnorm", "post_attention_layernorm": "rmsnorm",
                "norm": "rmsnorm", "mlp": "mlp (whole)"}.get(leaf)

    for name, mod in lm.model.named_modules():
        cat = category(name)
        if cat is None:
            continue

        def pre(m, args, _id=id(mod)):
            starts[_id] = time.perf_counter()

        def post(m, args, out, _id=id(mod), _cat=cat):
            if state["forwards"] > 1:
                spent[_cat] += time.perf_counter() - starts[_id]
                calls[_cat] += 1

        hooks += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    fwd = {"s": 0.0}
    inner = lm.model.forward_rows

    def timed_forward_rows(*args, **kw):  # generation calls forward_rows, not the module's __call__
        state["forwards"] += 1
        t = time.perf_counter()
        try:
            return inner(*args, **kw)
        finally:
            if state["forwards"] > 1:
                fwd["s"] += time.perf_counter() - t

    lm.model.forward_rows = timed_forward_rows
    try:
        res = generate(lm, [prompt], tokens, stop_at_eos=False)
    finally:
        del lm.model.forward_rows
        for h in hooks:
            h.remove()
    return res, spent, calls, fwd["s"]


def unfused_rows(lm, tokens, prompt, bw, nbytes):
    res, spent, calls, fwd_s = hooked_profile(lm, tokens, prompt)
    steps = len(res.step_s)
    total_ms = 1000 * sum(res.step_s) / steps

    def per_step(cat):
        return 1000 * spent[cat] / steps if calls[cat] else 0.0

    rows = []
    for cat in [c for c in LINEARS if calls[c]]:
        ms = per_step(cat)
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
    for part, ms in (("attention core (rope, cache write, sdpa)", attn_core), ("silu * up", mlp_rest),
                     ("rmsnorm", norm), ("rest of forward (embed, rope tables, residuals)",
                                         fwd_ms - blocks - per_step("lm_head")),
                     ("outside forward (sampling, loop)", total_ms - fwd_ms)):
        rows.append({"part": part, "ms/step": round(ms, 2), "share": round(ms / total_ms, 3)})
    return rows, total_ms


def fused_rows(lm, tokens, prompt, bw, nbytes):
    m = lm.model
    started = {"on": False}

    def on_token(*_):
        if not started["on"]:  # the prefill step is over: count decode steps only
            ops.fused.fused_profile(m, True, True)
            started["on"] = True

    generate(lm, [prompt], 4, stop_at_eos=False)  # builds the plan
    res = generate(lm, [prompt], tokens, stop_at_eos=False, on_token=on_token)
    prof = ops.fused.fused_profile(m, False, True)
    steps = max(1, prof["steps"])
    step_ms = 1000 * statistics.median(res.step_s)
    th = prof["threads"]
    cats = list(th[0])
    rows, inside = [], 0.0
    for cat in cats:
        per = [1000 * t[cat] / steps for t in th]
        ms0, mean = per[0], sum(per) / len(per)
        inside += ms0
        if mean < 0.005:
            continue
        row = {"part": cat, "ms/step": round(ms0, 2), "share": round(ms0 / step_ms, 3),
               "thread ms": " / ".join(f"{v:.2f}" for v in per)}
        lin = FUSED_WEIGHTS.get(cat)
        if lin:
            b = sum(nbytes[x] for x in lin)
            floor = b / (bw * 1e9) * 1000
            row.update({"MB read": round(b / 1e6, 1), "GB/s": round(b / (mean / 1000) / 1e9, 1),
                        "floor ms": round(floor, 2), "vs floor": round(mean / floor, 2)})
        rows.append(row)
    rows.append({"part": "outside the fused call (embedding, logits, sampling, loop)",
                 "ms/step": round(step_ms - inside, 2), "share": round((step_ms - inside) / step_ms, 3)})
    return rows, step_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--act", choices=("fp32", "int8"), default=None,
                    help="int4 and int8 weights' activations (default: the KernelConfig default)")
    ap.add_argument("--path", choices=("both", "fused", "unfused"), default="both")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.act is not None:
        ops.configure(act_int8=a.act == "int8")
    lm = load(a.model, make_spec(a.precision), "cpu")
    prompt = default_prompts()[0]
    ids = lm.tokenizer(prompt)["input_ids"]
    nbytes = linear_bytes(lm)
    bw = bandwidth_gbs("cpu")
    all_bytes = sum(nbytes.values())
    floor_ms = all_bytes / (bw * 1e9) * 1000
    info = ops.backend_info()
    print(f"# {lm.label}: {lm.cfg.num_layers} layers, projections {all_bytes / 1e6:.0f} MB, bandwidth probe "
          f"{bw:.1f} GB/s -> floor {floor_ms:.1f} ms/step ({1000 / floor_ms:.1f} tok/s); kernels {info['cpu']}, "
          f"int4 and int8 activations {info.get('int4_activations')}, {info['threads']} threads")
    summary = []
    for path in (("unfused", "fused") if a.path == "both" else (a.path,)):
        with ops.using(fused=path == "fused"):
            generate(lm, [prompt], 8, stop_at_eos=False)  # warm-up
            plain = generate(lm, [prompt], a.tokens, stop_at_eos=False)
            plain_ms = 1000 * statistics.median(plain.step_s)
            one, five = forward_ms(lm, ids, 1, a.reps), forward_ms(lm, ids, 5, a.reps)
            rows, with_prof_ms = (fused_rows if path == "fused" else unfused_rows)(lm, a.tokens, prompt, bw, nbytes)
        summary.append({"path": path, "step ms (generate)": round(plain_ms, 2), "tok/s": round(1000 / plain_ms, 1),
                        "vs floor": round(plain_ms / floor_ms, 2), "% of floor tok/s": round(100 * floor_ms / plain_ms),
                        "forward 1 row ms": round(one, 2), "forward 5 rows ms": round(five, 2),
                        "5 rows / 1 row": round(five / one, 2)})
        print(f"\n## {path} path: decode step {plain_ms:.1f} ms ({1000 / plain_ms:.1f} tok/s), "
              f"{with_prof_ms:.1f} ms while profiled\n")
        cols = list(dict.fromkeys(k for r in rows for k in r))   # every row's columns, first seen first
        print(format_rows(rows, "md", cols))
    print("\n## summary\n")
    print(format_rows(summary, "md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
