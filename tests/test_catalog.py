"""Model store: assembling pinned GGUF chunks, checksums, the safetensors cache and its repair."""
import dataclasses
import filecmp
import hashlib
import os
import shutil
from pathlib import Path

import pytest

from engine.infer import catalog
from engine.common.errors import UserError

SMALL = catalog.CATALOG["qwen2.5-coder-0.5b"]


def test_assemble_real_parts_checks_size_and_sha(tmp_path):
    out = catalog.assemble_gguf(SMALL, tmp_path / "m.gguf")
    assert out.stat().st_size == SMALL.size
    h = hashlib.sha256(out.read_bytes()[:1 << 20]).hexdigest()
    assert len(h) == 64
    assert out.read_bytes()[:4] == b"GGUF"


def test_bad_checksum_is_refused_with_the_fix(tmp_path):
    bad = dataclasses.replace(SMALL, sha256="0" * 64)
    with pytest.raises(UserError, match="force-reinstall"):
        catalog.assemble_gguf(bad, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
    assert not list(tmp_path.glob("*.partial"))


def test_missing_package_names_the_command():
    missing = dataclasses.replace(SMALL, package_prefix="no-such-package-part")
    with pytest.raises(UserError, match="make models"):
        catalog._part_files(missing)


def test_unknown_model_lists_choices(tmp_path):
    with pytest.raises(UserError, match="default-draft"):
        catalog.resolve("qwen-9000")
    with pytest.raises(UserError, match="config.json"):
        catalog.resolve(str(tmp_path))


def test_aliases_resolve_to_cached_folders():
    p = catalog.resolve("default-draft")
    assert (p / "config.json").exists() and (p / "model.safetensors").exists()
    assert catalog.canonical_name("DEFAULT") == "qwen2.5-coder-1.5b"


@pytest.fixture(scope="module")
def real_small() -> Path:
    """The user's converted 0.5B, resolved before any test points SCL_CACHE_DIR elsewhere (resolved after, from a
    clone whose config a test has just corrupted, it was converted again from the GGUF: 45 s for nothing)."""
    return catalog.resolve("default-draft")


def _clone_cache(tmp_path, monkeypatch, src: Path):
    """A copy of the real 0.5B cache in a temporary cache dir (big file hard-linked, small files copied)."""
    root = tmp_path / "cache"
    dst = root / "models" / SMALL.name
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name == "model.safetensors":
            os.link(f, dst / f.name)
        else:
            shutil.copy(f, dst / f.name)
    monkeypatch.setenv("SCL_CACHE_DIR", str(root))
    return dst


def test_corrupted_cache_is_detected(tmp_path, monkeypatch, real_small):
    dst = _clone_cache(tmp_path, monkeypatch, real_small)
    assert catalog._cache_valid(SMALL)
    (dst / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 1}')
    assert not catalog._cache_valid(SMALL)
    dst2 = _clone_cache(tmp_path / "b", monkeypatch, real_small)
    (dst2 / "model.safetensors").unlink()
    (dst2 / "model.safetensors").write_bytes(b"truncated")
    assert not catalog._cache_valid(SMALL)


@pytest.mark.slow
def test_corrupted_cache_is_rebuilt_not_crashed_on(tmp_path, monkeypatch, real_small):
    dst = _clone_cache(tmp_path, monkeypatch, real_small)
    (dst / "tokenizer_config.json").write_text("{ torn")
    said = []
    path = catalog.resolve("default-draft", progress=said.append)
    assert any("rebuilding" in s for s in said)
    assert catalog._cache_valid(SMALL) and path == dst
    # The rebuilt folder is the model it was: every file written anew and byte-identical to the intact cache's,
    # which the engine tests load and run (loading it here again took 10 s for nothing more).
    assert (dst / "model.safetensors").stat().st_ino != (real_small / "model.safetensors").stat().st_ino
    for f in real_small.iterdir():
        assert filecmp.cmp(f, dst / f.name, shallow=False), f.name
