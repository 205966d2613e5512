"""Load a named model at a precision: the one object generation, quality and the UI share."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.infer import catalog
from engine.common.errors import UserError
from engine.infer.model import Transformer, build_model
from engine.common.setup import EngineSetup  # noqa: F401  (annotations)
from engine.quant import (QuantSpec, check_supported, compute_dtype_for, hold_floats_as_stored, make_spec,
                          quantize_model, quantized_fraction, weight_breakdown)


@dataclass
class LoadedModel:
    name: str
    folder: Path
    spec: QuantSpec
    device: str
    model: Transformer
    tokenizer: object
    load_s: float
    weights: dict[str, int] = field(default_factory=dict)
    quantized: dict = field(default_factory=dict)  # quantized layers' bytes against the same layers in fp32
    calibration: dict | None = None  # a calibrated method's facts (calibrate.Calibrated.facts), for the records

    @property
    def weight_bytes(self) -> int:
        return sum(self.weights.values())

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def label(self) -> str:
        return f"{self.name}@{self.spec.label}"


def resolve_device(device: str | None) -> str:
    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device '{device}' was asked for, but this torch sees no CUDA GPU",
                        "use --device cpu, or install a CUDA build of torch on a GPU machine")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise UserError(f"unknown device '{device}'", "use cpu, cuda or auto")
    return device


_TOKENIZERS: dict = {}  # (folder, its files' stamps) -> tokenizer: a Qwen tokenizer takes about a second to parse
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def load_tokenizer(folder: Path):
    """The folder's tokenizer, parsed once per process while the folder's files are unchanged (name, size and
    mtime of every file but the weights). Shared by every caller in the process: never change it."""
    from transformers import AutoTokenizer

    if not Path(folder).is_dir():  # a hub id (online users): transformers resolves and caches it itself
        return AutoTokenizer.from_pretrained(str(folder))
    folder = Path(folder).resolve()
    stamp = tuple((f.name, st.st_size, st.st_mtime_ns) for f in sorted(folder.iterdir())
                  if f.is_file() and f.suffix not in _WEIGHT_SUFFIXES for st in (f.stat(),))
    key = (str(folder), stamp)
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= 4:  # a few folders at a time (the target's and the draft's), not every one ever seen
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(str(folder))
    return _TOKENIZERS[key]


def _release_source(model) -> None:
    """Copy the tensors that still live in the safetensors file's buffer (embedding, norms, biases).

    While any of them points into it, the whole fp32 file stays resident: an int4 1.5B model held
    8.3 GB instead of 2.3 GB. Copying the few kept tensors lets the buffer go.
    """
    import gc

    with torch.no_grad():
        for mod in model.modules():
            for _, p in mod.named_parameters(recurse=False):
                if p.device.type == "cpu":
                    p.data = p.data.clone()
            for n, b in list(mod.named_buffers(recurse=False)):
                if b.device.type == "cpu":
                    setattr(mod, n, b.clone())
    gc.collect()
    try:  # hand freed heap pages back to the OS (glibc); elsewhere this is a no-op
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def load(name: str = "default", spec: QuantSpec | str = "fp32", device: str | None = None,
         progress=None, should_stop=None) -> LoadedModel:
    """Resolve, build in fp32, convert to `spec`. Refuses unsupported combinations before loading. A GPTQ/AWQ
    calibration asks `should_stop()` before each layer and raises calibrate.Cancelled when it says so."""
    spec = make_spec(spec) if isinstance(spec, str) else spec
    device = resolve_device(device)
    check_supported(spec, device)
    t0 = time.perf_counter()
    folder = catalog.resolve(name, progress)
    say = progress or (lambda s: None)
    say(f"building {Path(folder).name} and converting to {spec.label}")
    base_dtype = compute_dtype_for(spec, device) if spec.precision in ("fp32", "bf16", "fp16") else torch.float32
    model = build_model(folder, dtype=base_dtype, device="cpu")
    tok = load_tokenizer(folder)
    codes, keep_int8, calibration = None, set(), None
    spec = _checkpoint_spec(spec, model, folder)
    if spec.method == "checkpoint":
        codes = model.checkpoint_codes
    elif spec.method == "gguf":  # the model's own llama.cpp blocks, not requantized
        from engine.quant.gguf_codes import read_gguf_codes

        say("reading the int4 blocks of the model's GGUF")
        got = read_gguf_codes(catalog.gguf_path(name, progress), model)
        say(f"int4-gguf: {got.words()}")
        codes, keep_int8 = got.codes, got.keep_int8
    elif spec.calibrated:  # GPTQ/AWQ: computed once from calibration text, then read from the cache
        from engine.infer.calibrate import calibrated

        cal = calibrated(name, Path(folder), model, spec, tok, progress, should_stop=should_stop)
        if cal.fresh:  # calibration left each block's weights at their int4 values: a mixed model's int8 linears
            del model  # must quantize the source weights, as a load from the cache does
            model = build_model(folder, dtype=base_dtype, device="cpu")
        with torch.no_grad():
            for pname, t in cal.floats.items():  # AWQ's folded norms
                model.get_parameter(pname).data = t.to(model.get_parameter(pname).dtype)
        codes, keep_int8, calibration = cal.codes, cal.keep_int8, cal.facts()
    model = quantize_model(model, spec, device, codes, keep_int8)
    if spec.method == "checkpoint" and not spec.quantize_head:
        stored = model.checkpoint_float_dtypes
        for part in hold_floats_as_stored(model, stored["head"], stored["embedding"]):
            say(f"the checkpoint's {part} held as it stores it ({str(stored[part]).removeprefix('torch.')}, exact)")
    if spec.precision != "fp32":
        _release_source(model)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return LoadedModel(
        name=catalog.canonical_name(name) if catalog.canonical_name(name) in catalog.CATALOG else str(name),
        folder=Path(folder), spec=spec, device=device, model=model, tokenizer=tok,
        load_s=time.perf_counter() - t0, weights=weight_breakdown(model), quantized=quantized_fraction(model),
        calibration=calibration,
    )


def _checkpoint_spec(spec: QuantSpec, model, folder) -> QuantSpec:
    """The spec a quantized checkpoint loads as: int4-checkpoint at its own group size (its head quantized only
    if the checkpoint's is), or a float/int8 precision of its dequantized weights; anything else refused."""
    from dataclasses import replace

    scheme = getattr(model, "checkpoint_scheme", None)
    if scheme is None:
        if spec.method == "checkpoint":
            raise UserError(f"{folder} is not a quantized checkpoint (its config.json has no quantization_config)",
                            "load it at int4 (round-to-nearest), int4-gptq or int4-awq")
        return spec
    if spec.precision == "int4" and spec.method != "checkpoint":
        raise UserError(f"{folder} is already quantized ({scheme.words}): int4-{spec.method} would requantize its int4 "
                        "weights", f"load it as int4-checkpoint-g{scheme.group_size} (its own codes), or give the "
                        "unquantized checkpoint")
    if spec.precision == "int4" and spec.group_size != scheme.group_size:
        raise UserError(f"{folder} holds groups of {scheme.group_size}; int4-checkpoint-g{spec.group_size} was asked",
                        f"load it as int4-checkpoint-g{scheme.group_size}")
    if spec.precision == "int4":
        return replace(spec, quantize_head="lm_head" in model.checkpoint_codes)
    return spec


@dataclass
class LoadedSetup:
    """A setup, loaded: the target, the draft model (model and self drafts) and the proposer to build per batch."""

    setup: "EngineSetup"
    target: LoadedModel
    draft: LoadedModel | None
    proposer: object | None  # infer.proposers.ProposerSpec, None without speculation


def target_spec(setup) -> QuantSpec:
    return make_spec(setup.precision, setup.group_size, setup.quantize_embeddings, setup.quantize_head,
                     setup.method)


def draft_spec(setup) -> QuantSpec:
    return make_spec(setup.draft_precision, setup.group_size, setup.quantize_embeddings, setup.quantize_head)


def load_setup(setup, get=None, progress=None) -> LoadedSetup:
    """Load a setup's target, its draft and its proposer: the one loader the CLI, server, peers and runs share.

    `get(name, spec, device, progress)` loads one model (default: `load`; a ModelPool passes its own
    `get` to reuse what it holds).
    """
    from engine.infer.proposers import proposer_spec

    setup = setup.validate()
    get = get or load
    device = resolve_device(setup.device)
    target = get(setup.model, target_spec(setup), device, progress)
    if setup.speculative and "rope_length_dependent" in target.cfg.features():
        raise UserError(f"{target.name} uses {target.cfg.ropes[0].type} rope scaling, whose frequencies follow the "
                        "length of each forward pass: verifying several drafts in one pass computes other numbers "
                        "than decoding them one by one, so speculation would not be lossless",
                        "run this model without a draft (--draft none), or use a checkpoint with a fixed rope type")
    draft = get(setup.draft_model_name, draft_spec(setup), device, progress) if setup.draft_model_name else None
    proposer = proposer_spec(setup.draft, draft, target) if setup.speculative else None
    return LoadedSetup(setup, target, draft, proposer)
