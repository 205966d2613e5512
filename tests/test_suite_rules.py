"""Rules of the suite itself (where a skip is a failure, what no test may do to the import path) and of the code
(no module past 600 lines)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from tests import conftest
from tests.bench_scripts import BENCH


def _skip(reason: str):
    return SimpleNamespace(skipped=True, longrepr=("tests/x.py", 1, f"Skipped: {reason}"))


def test_on_ci_a_skip_for_something_ci_builds_fails_and_a_host_property_does_not(monkeypatch):
    monkeypatch.setenv("SCL_CI", "1")
    for reason in ("llama-cpp-python is not installed (`make peers`)", "chromium not found",
                   "vLLM's CPU build is not installed (no .venv-vllm)", "the llama-cpp-python sdist is not cached"):
        assert conftest._ci_must_run(_skip(reason)) == f"Skipped: {reason}"
    for reason in ("avx512_vnni not supported by this CPU (cannot run here)", "nvcc not found (set CUDA_HOME)",
                   "this machine runs the tests unprivileged: the tests above already took that path"):
        assert conftest._ci_must_run(_skip(reason)) is None
    xfailed = _skip("known bug")
    xfailed.wasxfail = "known bug"
    assert conftest._ci_must_run(xfailed) is None
    monkeypatch.delenv("SCL_CI")
    assert conftest._ci_must_run(_skip("chromium not found")) is None  # a developer's machine: a skip


def test_bench_is_not_on_the_import_path():
    """Every test module is imported by now: none put bench/ on sys.path, where `kernel_speed`, `load` or `peers`
    would shadow an installed package (bench/kernels.py once shadowed `kernels`, which transformers imports)."""
    assert str(BENCH) not in sys.path and str(BENCH) + "/" not in sys.path


MAX_MODULE_LINES = 600  # one module, one idea: past this it is two (docs/ARCHITECTURE.md)


def test_no_module_is_longer_than_600_lines():
    root = Path(__file__).resolve().parents[1]
    files = [root / "app.py"] + [f for d in ("engine", "pages", "bench", "tests") for f in (root / d).rglob("*.py")]
    long = {str(f.relative_to(root)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES}
    assert files and not long, f"split by idea: {long}"
