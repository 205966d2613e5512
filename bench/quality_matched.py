"""Quality on equal terms against llama.cpp's Q4_K_M: the same starting weights, the same reference.

    .venv/bin/python bench/quality_matched.py --model default            # the 1.5B, 8,192 tokens
    .venv/bin/python bench/quality_matched.py --model default-draft --tokens 2048

The only offline weights are shipped Q4_K_M GGUFs, so the lab's fp32 reference is that Q4_K_M
dequantized to fp32 (the catalog's converted folder). Scored against it, the shipped Q4_K_M runs its
own weights, while our int4 re-quantizes already-quantized weights. This bench puts llama.cpp on the
same footing: the reference folder (safetensors + config + tokenizer) is converted by llama.cpp's own
convert_hf_to_gguf.py to an F32 GGUF and quantized by llama.cpp's own quantizer to Q4_K_M
(engine.peers.gguf_tools; cached under the lab's cache dir, built once). Then, on the same tokens and
the same reference (engine.measure.quality), it scores:

- llama.cpp F32 GGUF: must read KLD ~0 (else conversion or tokenization differ; the run says so);
- llama.cpp Q4_K_M requantized from the reference: the peer row on equal terms;
- `--llama-types`: llama.cpp's other quantizations of the same F32 GGUF, at its best: IQ4_XS, and
  `<type>-imatrix` with llama-imatrix's importance matrix computed on the calibration text our GPTQ/AWQ
  read (engine.peers.gguf_tools; never the eval text);
- llama.cpp Q4_K_M as shipped: its own weights (it cannot lose on weights; shown for what it is);
- ours int4 at group sizes 32/64/128 and int8 (the engine's default kernels: int8 activations in
  the int4 CPU kernels, engine.ops.config); `--methods rtn,gptq,awq,gptq-mixed,gptq-llmc` picks how the int4
  grid is chosen (round-to-nearest by default; the calibrated ones are engine/infer/calibrate.py's);

and the KL at positions 0..3 of each document against the rest, per row. The position-0 probe then
runs the fp32 reference model with its linear layers' inputs rounded as llama.cpp's CPU dot products
round them (Q8_K: 8 bits per block of 256 for K-quant weights; Q8_0: per block of 32), weights untouched,
to show whether activation rounding alone makes the first positions' outliers.

The quality-matched pick (engine.measure.quality.quality_matched): our configurations (int4 at each group
size, and int8) whose KLD median, p99 and same top-1 are no worse than the requantized Q4_K_M's; of those, the
fewest weight bytes.
Writes <out>/quality_matched.{md,json} (command line at the top of the md).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.common.errors import UserError  # noqa: E402
from engine.measure import quality  # noqa: E402
from engine.measure.kld import Scores  # noqa: E402
from engine.peers import gguf_tools  # noqa: E402
from engine.peers.gguf_tools import reference_ggufs  # noqa: E402
from engine.quant.gguf_file import gguf_tensor_types, read_gguf  # noqa: E402
from engine.quant.gguf_codes import gguf_name, hf_name  # noqa: E402

F32_MAX_KLD = 1e-3  # the F32 GGUF through llama.cpp against the reference: above this, something differs
GROUP_SIZES = (32, 64, 128)
REQUANT, SHIPPED, F32 = "llama.cpp Q4_K_M (requantized from the reference)", \
    "llama.cpp Q4_K_M (shipped: its own weights)", "llama.cpp F32 (the reference, converted)"




def requant_label(gguf_type: str) -> str:
    """A row of llama.cpp quantizing the reference's F32 GGUF to `gguf_type` (REQUANT for Q4_K_M)."""
    if gguf_type.removesuffix(gguf_tools.REQUANT) == "Q4_K_M":
        return REQUANT
    return f"llama.cpp {gguf_type} (quantized from the reference)"


# ---------------------------------------------------------------- the rows

def ours_row(model: str, spec, docs, ref, progress=None) -> tuple[dict, Scores]:
    """One of our precisions on the documents against the reference: its statistics and per-position scores."""
    from engine.infer.loader import load
    from engine.ops import kernel_config

    lm = load(model, spec, "cpu", progress)
    t = time.perf_counter()
    sc = quality.score_model(lm, docs, ref)
    out = quality.results(sc, docs)
    cfg = kernel_config()
    out.update(system="serving-cost-lab", precision=lm.spec.label, weight_bytes=lm.weight_bytes,
               score_s=time.perf_counter() - t, calibration=lm.calibration,
               kernels={"enabled": cfg.enabled, "act_int8": cfg.act_int8, "isa": cfg.isa})
    del lm
    gc.collect()
    return out, sc


def llama_row(model: str, gguf: Path | None, precision: str, label: str, docs,
              progress=None) -> tuple[dict, Scores | None]:
    """A GGUF through llama.cpp (engine.peers.quality_worker, a fresh process) against the same reference."""
    from engine.peers.quality_worker import llama_cpp_quality

    q = llama_cpp_quality(model, ref_lm=None, progress=progress, gguf=gguf, precision=precision, label=label,
                          docs=docs, scores=True)
    sc = Scores.from_lists(q.pop("scores")) if "scores" in q else None
    return q, sc


def weights_equal(gguf: Path, folder: Path) -> dict:
    """Every tensor of a GGUF dequantized by gguf-py against the folder's safetensors: the largest absolute
    difference per GGUF type, and the tensors that differ. The shipped GGUF against the reference folder
    says whether llama.cpp runs exactly the reference's weights (then its KL is arithmetic, not weights)."""
    import numpy as np
    from gguf.quants import dequantize
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    where = {}
    for f in files:
        with safe_open(str(f), "pt") as h:
            where.update({k: f for k in h.keys()})
    worst, differ = {}, []
    for t in read_gguf(gguf).tensors.values():
        name = hf_name(t.name)
        if name not in where:
            differ.append(f"{t.name}: no {name} in the folder")
            continue
        with safe_open(str(where[name]), "pt") as h:
            b = h.get_tensor(name).float().numpy()
        a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(b.shape)
        d = float(np.abs(a - b).max())
        worst[t.tensor_type.name] = max(worst.get(t.tensor_type.name, 0.0), d)
        if d > 0:
            differ.append(f"{t.name} ({t.tensor_type.name}): max |diff| {d:.3g}")
    return {"equal": not differ, "max_abs_diff_by_type": worst, "differ": differ[:20], "tensors_differing": len(differ)}


# ---------------------------------------------------------------- the position-0 probe

def act_block(gguf_type: str) -> int | None:
    """The block llama.cpp's CPU backend rounds a matmul's activations in, for weights of this GGUF type:
    256 (Q8_K) for the K-quants, 32 (Q8_0/Q8_1) for the legacy quants, None (no rounding) for F32/F16/BF16.
    Other types (the IQ quants, ternary...) are refused rather than guessed."""
    if gguf_type in ("F32", "F16", "BF16"):
        return None
    if gguf_type in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
        return 256
    if gguf_type in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return 32
    raise UserError(f"the probe does not know how llama.cpp rounds activations for {gguf_type} weights",
                    "add the type's vec_dot_type (ggml-cpu's type_traits) to act_block")


def round_q8(x: torch.Tensor, block: int) -> torch.Tensor:
    """x rounded to 8 bits with one scale per `block` values along the last dim (amax / 127, round to nearest),
    as ggml's quantize_row_q8_0 / q8_K do. A last dim not a multiple of the block is refused."""
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"a row of {k} values does not split into blocks of {block}")
    b = x.float().reshape(*x.shape[:-1], k // block, block)
    d = b.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(b / torch.where(d > 0, d, torch.ones_like(d))).clamp(-127, 127) * d,
                    torch.zeros_like(b))
    return q.reshape(x.shape).to(x.dtype)


def activation_probe(lm, docs, blocks: dict[str, dict[str, int | None]], first: int = 4, prefix: int = 32) -> dict:
    """KL(fp32 || fp32 with rounded linear inputs) at positions 0..first-1 and first..prefix-2 of each document.

    blocks: {mode: {module name: block or None}}. Weights are untouched: only the activations entering each
    linear layer are rounded, as llama.cpp's CPU dot products round them.
    """
    from engine.ops.config import using

    linears = {n: m for n, m in lm.model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = {}
    with using(fused=False):  # the PyTorch path, so the hooks see every linear layer
        ref = [quality.logprobs(lm, list(d.ids[:prefix])) for d in docs]
        for mode, per in blocks.items():
            hooks = []
            for n, m in linears.items():
                b = per.get(n)
                if b:
                    hooks.append(m.register_forward_pre_hook(lambda _m, a, b=b: (round_q8(a[0], b),) + a[1:]))
            try:
                kl = []
                for d, r in zip(docs, ref):
                    lp = quality.logprobs(lm, list(d.ids[:prefix]))
                    kl.append((r.exp() * (r - lp)).sum(-1))
            finally:
                for h in hooks:
                    h.remove()
            k = torch.nn.utils.rnn.pad_sequence(kl, batch_first=True, padding_value=float("nan")).double()
            row = {str(p): {"kld_mean": float(k[:, p].nanmean()), "kld_max": float(k[:, p].nan_to_num(-1).max()),
                            "over_1": int((k[:, p] > 1).sum())} for p in range(first)}
            rest = k[:, first:]
            rest = rest[~rest.isnan()]
            row["rest"] = {"positions": int(rest.numel()), "kld_mean": float(rest.mean()),
                           "kld_median": float(rest.median())}
            row["rounded_layers"] = sum(1 for n in linears if per.get(n))
            out[mode] = row
    return out


def probe_blocks(lm, gguf_types: dict[str, str]) -> dict[str, dict[str, int | None]]:
    """The rounding modes of the probe: as the Q4_K_M GGUF's types say, and 32 / 256 everywhere they divide."""
    names = [n for n, m in lm.model.named_modules() if isinstance(m, torch.nn.Linear)]
    as_gguf = {}
    for n in names:
        g = gguf_name(n)
        if g == "output.weight" and g not in gguf_types:  # tied embeddings: the output is token_embd
            g = "token_embd.weight"
        if g is None or g not in gguf_types:
            raise UserError(f"no GGUF tensor for our layer {n} (expected {g})",
                            "the probe maps Hugging Face Qwen2/Llama layer names; extend gguf_name for this model")
        as_gguf[n] = act_block(gguf_types[g])
    ins = {n: m.in_features for n, m in lm.model.named_modules() if isinstance(m, torch.nn.Linear)}
    return {"as the Q4_K_M GGUF (Q8_K per 256 for K-quants, Q8_0 per 32 else)": as_gguf,
            "8-bit per 32 everywhere (Q8_0; ours: int8 per 32)": {n: 32 for n in names if ins[n] % 32 == 0},
            "8-bit per 256 everywhere it divides (Q8_K)": {n: 256 for n in names if ins[n] % 256 == 0}}


# ---------------------------------------------------------------- the report

COLS = [("kld_mean", "KLD mean", "{:.4f}"), ("kld_median", "median", "{:.5f}"), ("kld_p99", "p99", "{:.4f}"),
        ("kld_max", "max", "{:.3f}"), ("top1_agreement", "same top-1", "{:.2%}"), ("ppl_ratio", "PPL ratio", "{:.4f}")]


def _fmt(v, f):
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f.format(v)


def calibration_lines(rows: dict) -> list[str]:
    """Which calibration made each calibrated row's codes: a calibrated row is one draw (the same cache key under
    other float rounding calibrates other codes, docs/BENCHMARKS.md session 38), so the report names its codes."""
    cal = {label: r["calibration"] for label, r in rows.items() if isinstance(r.get("calibration"), dict)}
    if not cal:
        return []
    out = ["", "Calibrated rows, one calibration each (the same key under other float rounding gives other codes):"]
    for label, c in cal.items():
        out.append(f"- {label}: {c.get('method')} version {c.get('version')}, {c.get('calibration_tokens')} tokens "
                   f"of {c.get('calibration_set')}, cache key {c.get('key')}, codes {c.get('codes')}"
                   + (f", {c['int8_linears']} linears at int8" if c.get("int8_linears") else ""))
    return out


def markdown(rep: dict) -> str:
    out = [f"# Quality on equal terms against llama.cpp's Q4_K_M: {rep['model']}", "",
           f"Command: `{rep['command']}`", ""]
    if rep.get("merged_from"):
        out += ["Merged from the runs (each measured some of the rows, on the same tokens and reference):"] + \
            [f"- `{c}`" for c in rep["merged_from"]] + [""]
    out += [
           f"Scored tokens: {rep['tokens']:,} ({rep['documents']} documents, half chat half code; "
           "engine.measure.eval_text), "
           f"every row against the same fp32 reference "
           f"({rep.get('reference_note', 'the shipped Q4_K_M dequantized')}: {rep['reference']}). "
           f"Wall time {rep['wall_s'] / 60:.1f} min on {os.cpu_count()} shared cores; load average "
           f"{rep['load_average']['before']} before, {rep['load_average']['after']} after.", "",
           "| config | " + " | ".join(c[1] for c in COLS)
           + " | weight MB | KL pos 0 (mean / max) | KL pos 1-3 mean | KL pos 4+ mean |",
           "| --- |" + " ---: |" * (len(COLS) + 4)]
    for label, r in rep["rows"].items():
        if "failed" in r or "unavailable" in r:
            out.append(f"| {label} | {r.get('failed') or r.get('unavailable')} |" + " |" * (len(COLS) + 3))
            continue
        p = rep["positions"].get(label) or {}
        p0 = p.get("0") or {}
        p13 = [p.get(str(i), {}).get("kld_mean") for i in (1, 2, 3)]
        p13 = sum(x for x in p13 if x is not None) / max(1, sum(x is not None for x in p13))
        out.append(f"| {label} | " + " | ".join(_fmt(r.get(k), f) for k, _, f in COLS)
                   + f" | {_fmt((r.get('weight_bytes') or 0) / 1e6, '{:.0f}')} | "
                   f"{_fmt(p0.get('kld_mean'), '{:.3f}')} / "
                   f"{_fmt(p0.get('kld_max'), '{:.2f}')} | {_fmt(p13, '{:.4f}')} | "
                   f"{_fmt((p.get('rest') or {}).get('kld_mean'), '{:.4f}')} |")
    out += calibration_lines(rep["rows"])
    m = rep.get("match") or {}
    out += ["", "## Quality-matched pick", "",
            f"Target: {REQUANT}. Criteria: KLD median and p99 no higher, same top-1 no lower "
            "(engine.measure.quality.quality_matched; point values, no tolerance).", ""]
    if m:
        for label in m.get("matched", []):
            out.append(f"- {label}: matches")
        for label, lost in (m.get("misses") or {}).items():
            out.append(f"- {label}: worse on {', '.join(lost)}")
        out += ["", f"**Pick: {m.get('pick') or 'none of our configurations matches'}**"
                + (" (the matched one with the fewest weight bytes)" if m.get("pick") else ""), ""]
    sw = rep.get("shipped_weights")
    if sw:
        out += ["## The shipped GGUF's weights", "",
                ("The shipped Q4_K_M dequantized by gguf-py equals the reference's safetensors exactly, "
                 f"tensor by tensor (max |diff| by type: {sw['max_abs_diff_by_type']}): "
                 "llama.cpp's shipped row runs the reference's own "
                 "weights." if sw["equal"] else f"The shipped GGUF's weights differ from the reference's in "
                 f"{sw['tensors_differing']} tensors: {'; '.join(sw['differ'][:5])}"), ""]
    f = rep.get("f32_check") or {}
    out += ["## F32 GGUF check", "", f.get("verdict", "not run"), ""]
    pr = rep.get("probe") or {}
    if pr:
        out += ["## Position-0 probe: the fp32 reference with only its activations rounded", "",
                f"{pr.get('documents', '?')} documents, the first {pr['prefix']} tokens of each; "
                "KL(fp32 || fp32 with every linear layer's input rounded "
                "to 8 bits per block, weights untouched), exact over the full vocabulary.", "",
                "| rounding | layers | KL pos 0 mean / max (docs > 1) | pos 1 | pos 2 | pos 3 | pos 4+ mean |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for mode, r in pr["modes"].items():
            out.append(f"| {mode} | {r['rounded_layers']} | {r['0']['kld_mean']:.3f} / {r['0']['kld_max']:.2f} "
                       f"({r['0']['over_1']}) | "
                       + " | ".join(f"{r[str(i)]['kld_mean']:.4f}" for i in (1, 2, 3))
                       + f" | {r['rest']['kld_mean']:.5f} |")
        out.append("")
    out += ["## Notes", ""] + [f"- {n}" for n in rep.get("notes", [])]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the run

def run(model: str, tokens: int, out_dir: Path | None, command: str, *, group_sizes=GROUP_SIZES, int8: bool = True,
        methods: tuple[str, ...] = ("rtn",),
        shipped: bool = True, probe: bool = True, probe_prefix: int = 16, probe_tokens: int | None = None,
        weight_check: bool = True, llama: bool = True, ours: bool = True, llama_types: tuple[str, ...] = (),
        progress=None) -> dict:
    """The whole bench (see the module docstring); writes <out_dir>/quality_matched.{md,json} as rows arrive.

    probe_tokens: the eval text whose documents the probe runs (their first probe_prefix tokens each);
    default the same documents as the scored rows.
    """
    from engine.infer.catalog import CATALOG, canonical_name, resolve
    from engine.infer.loader import load, load_tokenizer
    from engine.measure.eval_text import describe, eval_docs

    say = progress or (lambda s: None)
    t0, load_before = time.time(), os.getloadavg()
    name = canonical_name(model) if canonical_name(model) in CATALOG else str(model)
    folder = resolve(model, say)
    docs = eval_docs(load_tokenizer(folder), tokens)
    rep = {"command": command, "model": name, "folder": str(folder), "tokens": sum(d.positions for d in docs),
           "documents": len(docs), "eval": describe(docs), "rows": {}, "positions": {}, "notes": [],
           "reference_note": reference_note(folder)}

    def save():
        rep["wall_s"] = time.time() - t0
        rep["load_average"] = {"before": [round(x, 1) for x in load_before],
                               "after": [round(x, 1) for x in os.getloadavg()]}
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "quality_matched.json").write_text(json.dumps(rep, indent=1, default=str))
            (out_dir / "quality_matched.md").write_text(markdown(rep))

    def add(label, row, sc):
        rep["rows"][label] = ({k: v for k, v in row.items() if k != "by_category"}
                              | {"by_category": row.get("by_category")})
        if sc is not None:
            rep["positions"][label] = quality.position_profile(sc, docs)
        r = rep["rows"][label]
        say(f"[{time.time() - t0:5.0f}s] {label}: " + (f"KLD mean {r['kld_mean']:.4f} median {r['kld_median']:.5f} "
            f"p99 {r['kld_p99']:.4f} top-1 {r['top1_agreement']:.2%}" if "kld_mean" in r else str(r)[:300]))
        save()

    # 1. the reference (fp32, cached), and the GGUFs of exactly its weights
    fp32 = load(model, "fp32", "cpu", say) if probe else None  # else loaded only if the reference is not cached
    ref_path = quality.ensure_reference(name, folder, docs, fp32, say)
    ref = quality.load_reference(ref_path, docs)
    rep["reference"] = ref_path.name
    ggufs = reference_ggufs(name, folder, ("Q4_K_M",), say)
    rep["gguf"] = {t: str(p) for t, p in ggufs.items()}
    # the probe needs the fp32 model: run it now and free the model after
    if probe:
        types = gguf_tensor_types(ggufs["Q4_K_M"])
        pdocs = docs if probe_tokens is None else eval_docs(load_tokenizer(folder), probe_tokens)
        rep["probe"] = {"prefix": probe_prefix, "documents": len(pdocs), "q4_k_m_types": _count(types),
                        "modes": activation_probe(fp32, pdocs, probe_blocks(fp32, types), prefix=probe_prefix)}
        say(f"[{time.time() - t0:5.0f}s] probe done")
        save()
    del fp32
    gc.collect()

    # 2. llama.cpp on the same reference: F32 (the check), requantized Q4_K_M, shipped Q4_K_M
    if llama:
        _llama_rows(rep, model, name, folder, ggufs, docs, shipped, weight_check, add, save, say, t0)
        for t in llama_types:  # llama.cpp's other quantizations of the same F32 GGUF (built once)
            extra = reference_ggufs(name, folder, (t,), say)
            if "imatrix" in extra:
                rep["gguf"]["imatrix"] = str(extra["imatrix"])
            row, sc = llama_row(model, extra[t], t, requant_label(t), docs, say)
            add(requant_label(t), row, sc)
    if ours:
        _our_rows(rep, model, docs, ref, group_sizes, int8, add, say, methods)
    finish(rep)
    save()
    return rep


def finish(rep: dict) -> None:
    """The quality-matched pick and the notes, from the rows there are."""
    target = rep["rows"].get(REQUANT) or {}
    # every configuration of ours is a candidate (the issue: our fastest whose quality is no worse), int8 too
    ours = {k: v for k, v in rep["rows"].items() if k.startswith("ours ")}
    if "kld_median" in target and ours:
        rep["match"] = quality.quality_matched(ours, target)
    rep["notes"] = notes(rep) + list(rep.get("extra_notes") or [])


def merge(reps: list[dict], command: str) -> dict:
    """One report from runs of the same model and tokens that measured different parts (--parts)."""
    base = dict(reps[0])
    for r in reps[1:]:
        if (r["model"], r["eval"]["eval_fingerprint"]) != (base["model"], base["eval"]["eval_fingerprint"]):
            raise UserError("these runs scored different models or tokens", "merge runs of one --model and --tokens")
        base["rows"] = {**base["rows"], **r["rows"]}
        base["positions"] = {**base["positions"], **r["positions"]}
        for k in ("probe", "f32_check", "shipped_weights", "gguf"):
            if r.get(k) and not base.get(k):
                base[k] = r[k]
    base["merged_from"] = [r["command"] for r in reps]
    base["wall_s"] = max(r.get("wall_s", 0) for r in reps)
    base["command"] = command
    finish(base)
    return base


def _llama_rows(rep, model, name, folder, ggufs, docs, shipped, weight_check, add, save, say, t0) -> None:
    from engine.infer.catalog import CATALOG

    row, sc = llama_row(model, ggufs["F32"], "F32", F32, docs, say)
    add(F32, row, sc)
    ok = row.get("kld_mean") is not None and row["kld_mean"] < F32_MAX_KLD and row.get("top1_agreement", 0) > 0.999
    rep["f32_check"] = {"ok": ok, "kld_mean": row.get("kld_mean"), "kld_max": row.get("kld_max"),
                        "top1_agreement": row.get("top1_agreement"), "vocab_check": row.get("vocab_check"),
                        "verdict": (f"llama.cpp running the reference's own weights (F32 GGUF) reads KLD mean "
                                    f"{row.get('kld_mean', float('nan')):.2e}, "
                                    f"max {row.get('kld_max', float('nan')):.2e}, "
                                    f"same top-1 {row.get('top1_agreement', float('nan')):.2%}: "
                                    + ("the conversion and tokenization are the same as ours." if ok else
                                       "NOT ~0: the conversion or the tokenization differs; the llama.cpp rows below "
                                       "are not on equal terms until that is found."))}
    save()
    row, sc = llama_row(model, ggufs["Q4_K_M"], "Q4_K_M", REQUANT, docs, say)
    add(REQUANT, row, sc)
    if shipped and name in CATALOG:
        if weight_check:
            from engine.infer.catalog import gguf_path

            rep["shipped_weights"] = weights_equal(gguf_path(model, say), folder)
            say(f"[{time.time() - t0:5.0f}s] shipped GGUF vs reference weights: {rep['shipped_weights']['equal']}")
        row, sc = llama_row(model, None, "Q4_K_M", SHIPPED, docs, say)
        add(SHIPPED, row, sc)


def _our_rows(rep, model, docs, ref, group_sizes, int8, add, say, methods=("rtn",)) -> None:
    from engine.quant.convert import make_spec

    for m in methods:  # each int4 method at each group size
        for g in group_sizes:
            row, sc = ours_row(model, make_spec(f"int4-{m}", g), docs, ref, say)
            add(f"ours {row['precision']}", row, sc)
    if int8:
        row, sc = ours_row(model, make_spec("int8"), docs, ref, say)
        add(f"ours {row['precision']}", row, sc)


def _count(types: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in types.values():
        out[t] = out.get(t, 0) + 1
    return dict(sorted(out.items()))


def reference_note(folder: Path) -> str:
    """What the fp32 reference is: the shipped Q4_K_M dequantized, or that permuted off its grid."""
    perm = Path(folder) / "permutation.json"
    if perm.is_file():
        seed = json.loads(perm.read_text()).get("seed")
        return (f"the shipped Q4_K_M dequantized, its hidden dimensions permuted (engine.quant.permute, seed {seed}): "
                "the same function with every weight sub-block off Q4_K's grid, so no quantizer can copy it")
    return "the shipped Q4_K_M dequantized"


def notes(rep: dict) -> list[str]:
    ref = rep.get("reference_note", "the shipped Q4_K_M dequantized")
    start = ("it quantizes the same off-grid weights our int4 does" if "permuted" in ref else
             "it re-quantizes already-quantized weights, as our int4 does, so the two start from the same point")
    n = [f"The reference is {ref} (fp32). The requantized Q4_K_M is that folder converted by llama.cpp's own "
         "convert_hf_to_gguf.py (--outtype f32, the llama-cpp-python 0.3.36 sdist's) and quantized by llama.cpp's "
         f"own quantizer (llama_model_quantize, what llama-quantize runs): {start}.",
         "Our rows run the engine's default CPU kernels: int4 and int8 weights with activations rounded to int8 "
         "per block of 32 (SCL_KERNEL_ACT, engine.ops.config; int8 weights since session 39); int8 is a "
         "candidate too: the pick is our configuration with the fewest weight bytes (the fastest at the bandwidth "
         "floor) that is no worse."]
    if SHIPPED in rep["rows"]:
        n.insert(1, "The shipped Q4_K_M row runs the reference's own weights: its KL is llama.cpp's arithmetic alone "
                    "(activation rounding, f16 KV cache), not weight error. It is not a like-for-like quality row.")
    pr = rep.get("probe")
    if pr:
        modes = list(pr["modes"].values())
        n.append(f"Position-0 probe: rounding only the activations (weights fp32) as the Q4_K_M GGUF's dot products do "
                 f"gives KL {modes[0]['0']['kld_mean']:.3f} mean at position 0 "
                 f"(max {modes[0]['0']['kld_max']:.2f}) against "
                 f"{modes[0]['rest']['kld_mean']:.5f} at positions 4+; "
                 f"per block of 32 everywhere: {modes[1]['0']['kld_mean']:.3f} "
                 f"at position 0; per block of 256 everywhere: {modes[2]['0']['kld_mean']:.3f}.")
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=None, help="scored tokens (default 8192, engine.measure.eval_text)")
    ap.add_argument("--group-sizes", default="32,64,128")
    ap.add_argument("--no-int8", action="store_true")
    ap.add_argument("--methods", default="rtn",
                    help="int4 methods at each group size: rtn,gptq,awq,gptq-mixed,gptq-llmc")
    ap.add_argument("--no-shipped", action="store_true", help="skip the shipped Q4_K_M row")
    ap.add_argument("--no-probe", action="store_true", help="skip the position-0 activation-rounding probe")
    ap.add_argument("--probe-prefix", type=int, default=16, help="tokens of each document the probe runs")
    ap.add_argument("--probe-tokens", type=int, default=None,
                    help="eval-text size whose documents the probe runs (default: the scored documents)")
    ap.add_argument("--no-weight-check", action="store_true", help="skip comparing the shipped GGUF's weights")
    ap.add_argument("--parts", default="llama,ours",
                    help="which rows to measure: llama (the llama.cpp rows), ours (our rows); with --merge, none")
    ap.add_argument("--llama-types", default="",
                    help="llama.cpp's other quantizations too (with --parts llama), e.g. "
                         "Q4_K_M-imatrix,IQ4_XS,IQ4_XS-imatrix (engine.peers.gguf_tools.LLAMA_PRECISIONS)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="write one report from quality_matched.json files of runs that measured different --parts")
    ap.add_argument("--note", action="append", default=[], help="a line added to the report's notes (with --merge)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "runs" / "2026-12-02"))
    a = ap.parse_args(argv)
    from engine.measure.eval_text import DEFAULT_TOKENS

    command = ".venv/bin/python bench/quality_matched.py " + " ".join(argv if argv is not None else sys.argv[1:])
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if a.merge:
        reps = [json.loads(Path(p).read_text()) for p in a.merge]
        reps[0]["extra_notes"] = list(a.note)
        rep = merge(reps, command.strip())
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "quality_matched.json").write_text(json.dumps(rep, indent=1, default=str))
        (out / "quality_matched.md").write_text(markdown(rep))
        print(markdown(rep))
        return 0
    parts = {x.strip() for x in a.parts.split(",") if x.strip()}
    if parts - {"llama", "ours"}:
        raise UserError(f"unknown --parts {sorted(parts - {'llama', 'ours'})}", "use llama, ours or both")
    rep = run(a.model, a.tokens or DEFAULT_TOKENS, Path(a.out), command.strip(),
              group_sizes=tuple(int(x) for x in a.group_sizes.split(",") if x.strip()), int8=not a.no_int8,
              methods=tuple(x.strip() for x in a.methods.split(",") if x.strip()), shipped=not a.no_shipped,
              probe=not a.no_probe, probe_prefix=a.probe_prefix,
              probe_tokens=a.probe_tokens, weight_check=not a.no_weight_check, llama="llama" in parts,
              ours="ours" in parts, llama_types=tuple(x.strip() for x in a.llama_types.split(",") if x.strip()),
              progress=say)
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
