"""llama.cpp's own GGUF tools, run from this machine: its converter and its quantizer.

- llama_cpp_source(): vendor/llama.cpp of the llama-cpp-python sdist (the version `make peers`
  builds, LLAMA_CPP_VERSION), unpacked once into the cache: the converter
  convert_hf_to_gguf.py, its gguf-py and its conversion package.
- convert_f32(folder, dest): a Hugging Face folder (safetensors + config + tokenizer) as an F32 GGUF,
  written by that convert_hf_to_gguf.py with its own gguf-py.
- quantize(f32, dest, ftype, imatrix=None): llama.cpp's quantizer, the code llama-quantize runs
  (llama_model_quantize, through llama-cpp-python), from the F32 GGUF to `ftype` (Q4_K_M, IQ4_XS, ...);
  with an importance matrix, llama-quantize itself (the binding cannot be handed one).
- imatrix(gguf, dest, tokenizer_folder): llama-imatrix's importance matrix of a GGUF, computed on the
  calibration text our GPTQ and AWQ read (engine.infer.calibrate), never on the text KLD or pass@1 score.
- convert(folder, dest, ftype): the same converter writing F16, BF16 or Q8_0 itself.
- reference_ggufs(name, folder, types): a model folder's weights as each type (converted, or quantized
  from the F32 conversion; `<type>-imatrix` with an importance matrix computed on that F32 GGUF), cached
  by what the weights are (quality.weights_fingerprint), not by their name.

Each writes to a temporary name and renames, so a file at `dest` is whole; an existing one is kept.
Shared by bench/llama_shape.py (random weights, speed), bench/quality_matched.py (the quality
reference's weights, quality) and engine.peers.servers (llama-server at a precision other than the
shipped Q4_K_M: the same weights our engine quantizes, converted by llama.cpp).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import cache_dir

__all__ = ["CONVERTER_TYPES", "FTYPES", "IMATRIX", "LLAMA_CPP_VERSION", "LLAMA_PRECISIONS", "REQUANT", "convert",
           "convert_f32", "gguf_dir", "imatrix", "llama_cpp_source", "llama_gguf", "llama_precision_unavailable",
           "llama_tool", "quantize", "reference_ggufs"]

LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp `make peers` builds

FTYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
          "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")
IMATRIX = "-imatrix"  # a type's suffix when it is quantized with an importance matrix: Q4_K_M-imatrix
# Q4_K_M's suffix when llama.cpp quantizes the catalog weights itself (no matrix, llama-quantize's default), as a
# user quantizing their own model would; plain "Q4_K_M" is the catalog GGUF as shipped
REQUANT = "-requant"
# llama.cpp's weights as the peers (llama-server, the llama-cpp-python peer) run them: the catalog GGUF as
# shipped (Q4_K_M), or the same weights our engine quantizes (the catalog folder, Q4_K_M dequantized)
# converted or quantized by llama.cpp's own tools (reference_ggufs, built once). The -imatrix types are
# llama.cpp at its best: an importance matrix computed on the calibration text our GPTQ/AWQ read.
LLAMA_PRECISIONS = {"Q4_K_M": "the catalog GGUF as shipped",
                    "Q4_K_M" + REQUANT: "quantized by llama.cpp from the catalog weights without an importance "
                                        "matrix (llama-quantize's default)",
                    "Q4_K_M" + IMATRIX: "quantized by llama.cpp from the catalog weights with an importance matrix "
                                        "(llama-imatrix on the calibration text)",
                    "IQ4_XS": "quantized by llama.cpp from the catalog weights (4.25 bits, non-linear grid)",
                    "IQ4_XS" + IMATRIX: "quantized by llama.cpp from the catalog weights with an importance matrix "
                                        "(llama-imatrix on the calibration text)",
                    "Q8_0": "converted to Q8_0 by llama.cpp from the catalog weights (8 bits, one scale per 32)",
                    "BF16": "converted by llama.cpp from the catalog weights",
                    "F16": "converted by llama.cpp from the catalog weights"}
IMATRIX_CTX = 512  # llama-imatrix's chunk (its default): the calibration text is cut into chunks of this many tokens


def llama_tool(name: str) -> Path:
    """llama.cpp's `name` (llama-imatrix, llama-quantize): SCL_LLAMA_TOOLS/<name>, else the one `make peers`
    builds in the cache, else on PATH."""
    import shutil

    cands = [Path(os.environ["SCL_LLAMA_TOOLS"]) / name] if os.environ.get("SCL_LLAMA_TOOLS") else []
    cands.append(cache_dir() / f"llama-tools-{LLAMA_CPP_VERSION}" / "bin" / name)
    found = shutil.which(name)
    cands += [Path(found)] if found else []
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise UserError(f"llama.cpp's {name} is not built here (looked in: {', '.join(map(str, cands))})",
                    "run `make peers` (builds llama-imatrix and llama-quantize from the llama-cpp-python "
                    f"{LLAMA_CPP_VERSION} sdist), or set SCL_LLAMA_TOOLS to a folder holding them")


def _not_a_llama_precision(precision: str) -> UserError:
    return UserError(f"llama.cpp runs {', '.join(LLAMA_PRECISIONS)} here, not '{precision}'",
                     f"use precision one of: {', '.join(LLAMA_PRECISIONS)}")


def llama_precision_unavailable(precision: str) -> str | None:
    """Why llama.cpp's weights at `precision` cannot be made here (None when they can). Builds nothing."""
    if precision not in LLAMA_PRECISIONS:
        return _not_a_llama_precision(precision).problem
    if precision == "Q4_K_M":
        return None
    if precision.endswith(IMATRIX):
        try:
            llama_tool("llama-imatrix")
            llama_tool("llama-quantize")
        except UserError as e:
            return str(e)
        return None
    import importlib.util

    if precision not in CONVERTER_TYPES and importlib.util.find_spec("llama_cpp") is None:
        return (f"llama.cpp at {precision} needs llama.cpp's quantizer (llama-cpp-python), which is not installed: "
                "run `make peers`")
    return None


def llama_gguf(model: str, precision: str, progress=None) -> Path:
    """The GGUF llama.cpp runs for a catalog `model` at `precision` (LLAMA_PRECISIONS): the catalog file as
    shipped for Q4_K_M, else the catalog weights converted or quantized by llama.cpp (once; minutes for the 1.5B)."""
    from engine.infer import catalog

    if precision not in LLAMA_PRECISIONS:
        raise _not_a_llama_precision(precision)
    if precision == "Q4_K_M":
        return catalog.gguf_path(model, progress)
    return reference_ggufs(catalog.canonical_name(model), catalog.resolve(model, progress), (precision,),
                           progress)[precision]


def _run_tool(cmd: list, tmp: Path, dest: Path, what: str) -> Path:
    """Run one of llama.cpp's programs writing `tmp`, then rename it to `dest` (a failed run leaves neither)."""
    try:
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{what} failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-1500:]}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    return dest


def llama_cpp_source() -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist (the version `make peers` builds), unpacked once:
    the converter, its gguf-py and its conversion package only."""
    base = cache_dir() / "llama-cpp-src"
    src = base / f"llama_cpp_python-{LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").exists():
        return src
    sdist = base / f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
    if not sdist.exists():
        base.mkdir(parents=True, exist_ok=True)
        p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                            f"llama-cpp-python=={LLAMA_CPP_VERSION}", "-d", str(base)], capture_output=True, text=True)
        if p.returncode != 0 or not sdist.exists():
            raise UserError(f"could not download the llama-cpp-python {LLAMA_CPP_VERSION} sdist: "
                            f"{(p.stderr or p.stdout).strip()[-300:]}",
                            f"put llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz in {base}")
    top = f"llama_cpp_python-{LLAMA_CPP_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tf:
        keep = [m for m in tf.getmembers() if m.name == top + "convert_hf_to_gguf.py"
                or m.name.startswith((top + "gguf-py/", top + "conversion/"))]
        tf.extractall(base, members=keep, filter="data")
    return src


# The types convert_hf_to_gguf.py writes itself (--outtype): no F32 GGUF in between (2 GB for the 0.5B).
CONVERTER_TYPES = ("F32", "F16", "BF16", "Q8_0")


def convert_f32(folder: Path, dest: Path) -> Path:
    """The folder as an F32 GGUF, written by convert_hf_to_gguf.py with its own gguf-py (once)."""
    return convert(folder, dest, "F32")


def convert(folder: Path, dest: Path, ftype: str) -> Path:
    """The folder as a GGUF of `ftype` (one of CONVERTER_TYPES), written by convert_hf_to_gguf.py with
    its own gguf-py (once)."""
    if ftype not in CONVERTER_TYPES:
        raise UserError(f"llama.cpp's converter does not write {ftype}",
                        f"convert to F32 and quantize, or use one of: {', '.join(CONVERTER_TYPES)}")
    folder, dest = Path(folder), Path(dest)
    if dest.exists():
        return dest
    src = llama_cpp_source()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    # The Llama converter imports sentencepiece before it finds no tokenizer.model and falls through
    # to the BPE vocab (tokenizer.json); sentencepiece is not in the lab's venv, so an import-only
    # stand-in that refuses to be used lets it get there.
    shim = cache_dir() / "llama-cpp-src" / "no-sentencepiece"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "sentencepiece.py").write_text(
        "class SentencePieceProcessor:\n    def __init__(self, *a, **k):\n"
        "        raise RuntimeError('sentencepiece is not installed: this folder has no tokenizer.model')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "gguf-py"), str(shim)]), "HF_HUB_OFFLINE": "1"}
    env.pop("NO_LOCAL_GGUF", None)
    p = subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(folder), "--outtype", ftype.lower(),
                        "--outfile", str(tmp)], capture_output=True, text=True, env=env, cwd=str(src))
    if p.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {(p.stderr or p.stdout).strip()[-1500:]}")
    os.replace(tmp, dest)
    return dest


def quantize(f32: Path, dest: Path, ftype: str, imatrix: Path | None = None) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize, through llama-cpp-python) from the F32 GGUF (once);
    with an importance matrix, llama-quantize --imatrix (the same function, handed the matrix)."""
    f32, dest = Path(f32), Path(dest)
    if dest.exists():
        return dest
    if ftype not in FTYPES:
        raise UserError(f"'{ftype}' is not a llama.cpp GGUF type this lab quantizes to",
                        f"use one of: {', '.join(FTYPES)}")
    if imatrix is not None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".partial")
        return _run_tool([llama_tool("llama-quantize"), "--imatrix", imatrix, f32, tmp, ftype, os.cpu_count() or 1],
                         tmp, dest, f"llama-quantize --imatrix to {ftype}")
    try:
        import llama_cpp
    except ImportError:
        raise UserError("llama.cpp's quantizer runs through llama-cpp-python, which is not installed",
                        "run `make peers` (installs it into .venv)") from None

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{'ALL' if ftype == 'F32' else 'MOSTLY'}_{ftype}")
    params.nthread = os.cpu_count() or 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize to {ftype} returned {rc}")
    os.replace(tmp, dest)
    return dest


def calibration_text(folder: Path, tokens: int) -> str:
    """The calibration documents our GPTQ and AWQ read (engine.infer.calibrate.calibration_docs: ShareGPT chat
    and code exchanges none of the eval text holds, each cut at 512 tokens), as the text llama-imatrix tokenizes."""
    from engine.infer.calibrate import calibration_docs
    from engine.infer.loader import load_tokenizer

    tok = load_tokenizer(folder)
    return "\n\n".join(tok.decode(ids) for ids in calibration_docs(tok, tokens))


def imatrix(gguf: Path, dest: Path, folder: Path, tokens: int | None = None) -> Path:
    """llama-imatrix's importance matrix of `gguf` over `tokens` of the calibration text (once): chunks of
    IMATRIX_CTX tokens, the output tensor left out (its default). Written as a GGUF imatrix."""
    from engine.infer.calibrate import DEFAULT_TOKENS

    dest = Path(dest)
    if dest.exists():
        return dest
    tokens = tokens or DEFAULT_TOKENS
    exe = llama_tool("llama-imatrix")
    dest.parent.mkdir(parents=True, exist_ok=True)
    text = dest.with_name(dest.stem + ".txt")
    text.write_text(calibration_text(folder, tokens))
    tmp = dest.with_name(dest.stem + ".partial.gguf")  # llama-imatrix picks its format by the .gguf suffix
    return _run_tool([exe, "-m", gguf, "-f", text, "-o", tmp, "-c", IMATRIX_CTX, "--chunks",
                      max(2, tokens // IMATRIX_CTX), "--no-ppl", "-t", os.cpu_count() or 1], tmp, dest, "llama-imatrix")


def gguf_dir(name: str, folder: Path) -> Path:
    """Where the GGUFs of these weights live: keyed by what the weights are, not their name."""
    from engine.measure import quality

    w = quality.weights_fingerprint(name, folder)
    if w is None:
        raise UserError(f"{folder} has no safetensors or catalog manifest to identify its weights",
                        "point at a model folder (config.json + *.safetensors + tokenizer)")
    tag = Path(str(name)).name.replace(" ", "_")
    return cache_dir() / "quality-matched" / f"{tag}-{hashlib.sha256(w.encode()).hexdigest()[:12]}"


def reference_ggufs(name: str, folder: Path, types=("Q4_K_M",), progress=None) -> dict[str, Path]:
    """{type: the folder's weights as that GGUF} (built once). The converter writes CONVERTER_TYPES
    itself; the others are quantized by llama.cpp's quantizer from an F32 conversion, which is then
    returned too ("F32"). `<type>-imatrix`: quantized with llama-imatrix's matrix of that F32 GGUF on the
    calibration text (returned too, as "imatrix"). `Q4_K_M-requant` is the type Q4_K_M (one file, both names)."""
    say = progress or (lambda s: None)
    d = gguf_dir(name, folder)
    out: dict[str, Path] = {}
    asked, types = types, tuple(dict.fromkeys(t.removesuffix(REQUANT) for t in types))
    for t in types:
        if t in CONVERTER_TYPES and t != "F32":
            if not (d / f"model-{t}.gguf").exists():
                say(f"converting {folder} to a {t} GGUF with llama.cpp's convert_hf_to_gguf.py")
            out[t] = convert(folder, d / f"model-{t}.gguf", t)
    rest = [t for t in types if t not in out]
    if rest:
        f32 = d / "model-F32.gguf"
        if not f32.exists():
            say(f"converting {folder} to an F32 GGUF with llama.cpp's convert_hf_to_gguf.py")
        out["F32"] = convert_f32(folder, f32)
        for t in rest:
            if t == "F32":
                continue
            ftype, imat = (t[:-len(IMATRIX)], True) if t.endswith(IMATRIX) else (t, False)
            if imat and "imatrix" not in out:
                dest = d / f"imatrix-{_calibration_tag()}.gguf"
                if not dest.exists():
                    say("computing llama.cpp's importance matrix (llama-imatrix) of the F32 GGUF on the "
                        "calibration text")
                out["imatrix"] = imatrix(f32, dest, folder)
            if not (d / f"model-{t}.gguf").exists():
                say(f"quantizing the F32 GGUF to {ftype} with llama.cpp's quantizer"
                    + (" and the importance matrix" if imat else ""))
            out[t] = quantize(f32, d / f"model-{t}.gguf", ftype, out["imatrix"] if imat else None)
    out.update({t: out[t.removesuffix(REQUANT)] for t in asked})
    return out


def _calibration_tag() -> str:
    from engine.infer.calibrate import CALIBRATION_SET, DEFAULT_TOKENS

    return f"{CALIBRATION_SET}-{DEFAULT_TOKENS}"
