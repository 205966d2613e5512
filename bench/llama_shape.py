"""Llama 3.2 1B shape against llama.cpp on the same weights, in one run on this machine.

    .venv/bin/python bench/llama_shape.py                   # build once (~3 GB + GGUFs), then measure
                                                            # (~15 min on 2 cores)
    .venv/bin/python bench/llama_shape.py --max-new-tokens 32 --reps 2

Random-init weights with the exact shape of meta-llama/Llama-3.2-1B-Instruct (its config.json:
16 layers, hidden 2048, GQA 32/8, vocab 128256, tied embeddings, llama3 rope scaling) are built
offline by transformers and converted to GGUF by the converter in llama.cpp's own source (the one
the llama-cpp-python sdist vendors, the version `make peers` builds), so llama.cpp and our engine
run the same weights. Speed does not depend on the weights' values; these weights say nothing of
quality. Each system runs in a fresh process on the same prompt ids, greedy, EOS ignored, one
warm-up and --reps timed repetitions (medians, and the best repetition), measured as bench/peers.py measures
(engine/peers/workers.py). Writes <out>/llama_shape.{md,json} and prints the table.

The tokenizer is synthetic (write_tokenizer says why); both systems get the same prompt ids.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.common.paths import cache_dir  # noqa: E402
from engine.peers.gguf_tools import LLAMA_CPP_VERSION, convert_f32, llama_cpp_source, quantize  # noqa: E402,F401

# config.json of meta-llama/Llama-3.2-1B-Instruct, the fields that shape the arithmetic.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "tie_word_embeddings": True, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "attention_bias": False, "mlp_bias": False,
}  # bos/eos: the ids of the tokenizer written beside the weights (write_tokenizer)


def model_dir(layers: int = 16) -> Path:
    return cache_dir() / "models" / ("llama-3.2-1b-shape" if layers == 16 else f"llama-3.2-1b-shape-{layers}l")


# ---------------------------------------------------------------- the weights and the tokenizer


def write_tokenizer(dest: Path, vocab_size: int) -> dict:
    """A byte-fallback BPE of exactly `vocab_size` tokens, as Llama 1/2's tokenizer.json is laid out:
    <unk> <s> </s>, the 256 byte tokens, single characters, then pairs of them. Returns the bos/eos ids.

    Synthetic, since no hub is reachable here: Llama 3's own BPE is not on this machine, and llama.cpp's
    converter accepts a BPE tokenizer only when it recognises its pre-tokenizer (by hashing one text's
    ids), which a made-up BPE cannot pass. A byte-fallback BPE takes its other path (LlamaHfVocab), with
    no such check. Token ids are fixed here and both systems get the same ids, so the tokenizer plays
    no part in the speed measured.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    ascii_chars = ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)]
    need = vocab_size - len(vocab)
    n_chars = next(n for n in range(len(ascii_chars), need) if n + n * n >= need)
    chars = ascii_chars + [chr(0x4E00 + k) for k in range(n_chars - len(ascii_chars))]  # CJK fill the alphabet
    for c in chars:
        vocab[c] = len(vocab)
    merges = []
    for a in chars:
        for b in chars:
            if len(vocab) == vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "model_max_length": 131072}, indent=1))
    ids = {"bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"]}
    (dest / "generation_config.json").write_text(json.dumps(ids))
    return ids


def build_folder(dest: Path, layers: int = 16, seed: int = 0, **overrides) -> Path:
    """Random-init Llama 3.2 1B-shape weights (bf16, transformers' own init) and the tokenizer, built once."""
    if (dest / "config.json").exists() and any(dest.glob("*.safetensors")):
        return dest
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tmp = dest.with_name("." + dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        fields = {k: v for k, v in LLAMA_3_2_1B.items() if k not in ("architectures", "model_type")}
        fields.update(num_hidden_layers=layers, **overrides)
        fields.update(write_tokenizer(tmp, fields["vocab_size"]))
        cfg = AutoConfig.for_model("llama", **fields)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(str(tmp))
        del model
        gc.collect()
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ---------------------------------------------------------------- GGUF through llama.cpp's own converter
# llama_cpp_source, convert_f32 and quantize live in engine.peers.gguf_tools (shared with
# bench/quality_matched.py); imported above.


def gguf_files(folder: Path, types: list[str]) -> dict[str, Path]:
    """{GGUF type: path} beside the folder: F32 converted, the others quantized from it."""
    f32 = convert_f32(folder, folder / f"{folder.name}-F32.gguf")
    return {t: f32 if t == "F32" else quantize(f32, folder / f"{folder.name}-{t}.gguf", t) for t in types}


# ---------------------------------------------------------------- measuring, as bench/peers.py does


def _llama_worker(gguf: Path, cfg) -> dict:
    """llama.cpp (llama-cpp-python, as engine/peers/workers.py runs it) on one GGUF file, in this process."""
    import resource

    import llama_cpp

    from engine.measure.machine import machine_facts
    from engine.peers import workers

    threads = os.cpu_count() or 1
    t = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                          n_gpu_layers=0, seed=0, verbose=False)
    load_s = time.perf_counter() - t
    ids = list(cfg.prompt_ids)

    runs, mem = workers._run_reps(cfg, workers.llama_cpp_timed(llm, ids))
    m = workers._stats(runs, cfg.max_new_tokens)
    m.update(mem.as_dict())
    m.update(load_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             weight_bytes=os.path.getsize(gguf), load_s=load_s, prompt_tokens=len(ids))
    return {"metrics": m, "machine": machine_facts("cpu"),
            "versions": workers._versions("llama_cpp_python") | {"n_threads": threads},
            "new_tokens": runs[0].tokens[:cfg.max_new_tokens]}


def measure_llama(gguf: Path, cfg, timeout_s: int) -> dict:
    """_llama_worker in a fresh process (peak memory its own, no state shared with the others)."""
    from engine.peers.peer import RESULT_TAG as TAG

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        p = subprocess.run([sys.executable, __file__, "--worker"], text=True, capture_output=True, env=env,
                           input=json.dumps({"gguf": str(gguf), "config": cfg.to_dict()}), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(TAG):
            return json.loads(line[len(TAG):])
    return {"error": f"worker exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}"}


def measure_ours(folder: Path, cfg) -> dict:
    """Our engine through engine.peers.measure: the folder loaded by path, in a fresh process."""
    from engine import peers

    rec = peers.measure(cfg)
    if not rec.metrics:
        return {"error": rec.notes}
    return {"metrics": rec.metrics, "machine": rec.machine, "versions": rec.versions, "kernels": rec.kernels,
            "new_tokens": ((rec.output or {}).get("new_tokens") or [[]])[0]}


def _worker_main() -> int:
    from engine.peers.peer import RESULT_TAG as TAG, PeerConfig

    job = json.loads(sys.stdin.read())
    try:
        d = _llama_worker(Path(job["gguf"]), PeerConfig.from_dict(job["config"]))
    except Exception as e:  # the parent reports it as the reason this row has no numbers
        import traceback

        traceback.print_exc()
        d = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(TAG + json.dumps(d, default=str), flush=True)
    return 0


# ---------------------------------------------------------------- the run


# Our configs (precision, activations) and the llama.cpp GGUF types each is set against. Q4_K_M is
# what bench/peers.py runs (the catalog's GGUF); Q4_0 is the plainest 4-bit type (one scale per 32
# weights; ours keeps a scale and a minimum per 64). "a8": int8 activations in our int4 kernels, as
# llama.cpp quantizes its activations to 8 bits for these types.
OURS_CONFIGS = [("fp32", "fp32"), ("int8", "fp32"), ("int4", "fp32"), ("int4", "int8")]
VERSUS = {"fp32": ["F32"], "int8": ["Q8_0"], "int4": ["Q4_0", "Q4_K_M"]}


def _label(prec: str, act: str) -> str:
    return prec + (" a8" if act == "int8" else "")


def table_rows(ours: dict, llama: dict) -> list[dict]:
    """One row per (our config, llama.cpp type) pair: both decode rates and ours / llama.cpp."""
    def rates(d):  # (median, best repetition): on shared cores a busy spell can slow a whole repetition
        m = (d or {}).get("metrics", {})
        return m.get("decode_tok_s"), max(m.get("reps_decode_tok_s") or [0]) or None

    rows = []
    for prec, act in OURS_CONFIGS:
        o, ob = rates(ours.get(_label(prec, act)))
        for t in VERSUS[prec]:
            ll, lb = rates(llama.get(t))
            rows.append({"ours": _label(prec, act),
                         "ours_path": _path((ours.get(_label(prec, act)) or {}).get("kernels")),
                         "llama_cpp": t, "ours_tok_s": _r(o), "llama_cpp_tok_s": _r(ll),
                         "ratio": _r(o / ll) if o and ll else None,
                         "ours_best": _r(ob), "llama_cpp_best": _r(lb),
                         "ratio_best": _r(ob / lb) if ob and lb else None})
    return rows


def _r(x):
    return round(x, 2) if x else None


def _path(kernels: dict | None) -> str | None:
    """Which forward path our decode steps took (engine.ops.backend_info's counts, whole worker process)."""
    if not kernels or "fused_steps" not in kernels:
        return None
    f, r = kernels["fused_steps"], kernels["reference_steps"]
    why = ", ".join(kernels.get("reference_reasons") or {})[:80]
    return "fused C++ step" if f and not r else f"PyTorch ({why})" if not f else f"fused {f}, PyTorch {r} ({why})"


def markdown(rows: list[dict], ours: dict, llama: dict) -> str:
    def why(d):
        return d.get("error", "")[:80] if d else "not run"

    out = ["| ours | tok/s (best) | llama.cpp | tok/s (best) | ours / llama.cpp (best / best) | our path |",
           "| --- | ---: | --- | ---: | ---: | --- |"]
    for r in rows:
        o = r["ours_tok_s"] if r["ours_tok_s"] is not None else why(ours.get(r["ours"]))
        ll = r["llama_cpp_tok_s"] if r["llama_cpp_tok_s"] is not None else why(llama.get(r["llama_cpp"]))
        out.append(f"| {r['ours']} | {o} ({r['ours_best']}) | {r['llama_cpp']} | {ll} ({r['llama_cpp_best']}) "
                   f"| {r['ratio'] or ''} ({r['ratio_best'] or ''}) | {r['ours_path'] or ''} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=16, help="16 is the real shape; fewer for a quick check")
    ap.add_argument("--only", default="", help="comma list: keep ours precisions / GGUF types named here")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per system")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return _worker_main()
    import random

    from engine import peers

    command = "python bench/llama_shape.py " + " ".join(argv if argv is not None else sys.argv[1:])
    keep = {k.strip() for k in a.only.split(",") if k.strip()}
    t0 = time.time()
    load_before = os.getloadavg()  # the cores are shared: how busy they were, said beside the table
    folder = build_folder(model_dir(a.layers), a.layers)
    types = sorted({t for p, _ in OURS_CONFIGS for t in VERSUS[p] if not keep or t in keep})
    ggufs = gguf_files(folder, types)
    print(f"[{time.time() - t0:5.0f}s] weights and GGUFs ready in {folder}", flush=True)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    rnd = random.Random(0)
    ids = [rnd.randrange(259, vocab) for _ in range(a.prompt_tokens)]  # past the specials and byte tokens
    base = peers.PeerConfig.of(model=str(folder), prompt_ids=ids, max_new_tokens=a.max_new_tokens, reps=a.reps,
                               timeout_s=a.timeout)
    ours, llama = {}, {}
    # Interleaved (ours, then the llama.cpp types it is set against), so a slow spell of the machine
    # falls on both sides of a ratio rather than on one system.
    for prec, act in OURS_CONFIGS:
        lab = _label(prec, act)
        if not keep or lab in keep or prec in keep:
            ours[lab] = measure_ours(folder, base.with_fields(system=peers.OURS, precision=prec, act=act))
            _say(t0, f"ours {lab}", ours[lab])
        for t in VERSUS[prec]:
            if t in ggufs and t not in llama:
                llama[t] = measure_llama(ggufs[t], base.with_fields(system="llama.cpp", precision=t), a.timeout)
                _say(t0, f"llama.cpp {t}", llama[t])
    rows = table_rows(ours, llama)
    md = markdown(rows, ours, llama)
    machine = next((d["machine"] for d in [*ours.values(), *llama.values()] if d.get("machine")), {})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    head = [f"# Llama 3.2 1B shape (random init), {a.prompt_tokens}-token prompt, {a.max_new_tokens} new tokens, "
            f"median of {a.reps}", "", f"Command: `{command}`", "",
            "Machine: " + ", ".join(f"{k}={machine.get(k)}" for k in ("cpu_model", "cores", "simd", "memory_bytes")
                                    if machine.get(k)),
            f"Load average (1, 5, 15 min): {_load(load_before)} before, {_load(os.getloadavg())} after", "", ""]
    (out / "llama_shape.md").write_text("\n".join(head) + md + "\n")
    (out / "llama_shape.json").write_text(json.dumps(
        {"command": command, "folder": str(folder), "load_average": {"before": load_before, "after": os.getloadavg()},
         "gguf": {t: str(p) for t, p in ggufs.items()},
         "prompt_ids": ids, "rows": rows, "ours": ours, "llama_cpp": llama}, indent=1, default=str))
    print(md)
    print(f"wrote {out}/llama_shape.{{md,json}}")
    return 0


def _load(avg) -> str:
    return ", ".join(f"{x:.1f}" for x in avg)


def _say(t0: float, what: str, d: dict) -> None:
    m = d.get("metrics") or {}
    v = m.get("decode_tok_s")
    print(f"[{time.time() - t0:5.0f}s] {what}: " + (f"{v:.2f} tok/s, TTFT {m['ttft_s'] * 1000:.0f} ms, "
                                                     f"peak RSS {m.get('peak_rss_bytes', 0) / 2**20:.0f} MB"
                                                     if v else d.get("error", "?")), flush=True)


if __name__ == "__main__":
    sys.exit(main())
