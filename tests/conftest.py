"""Shared fixtures: real models are loaded once per session and shared across tests.

Models come from the user cache (converted once by `make models`); the SQLite store goes to a
temporary folder so tests never touch the user's saved runs.
"""
import os
import tempfile
import warnings

import pytest

warnings.filterwarnings("ignore", message="The pynvml package is deprecated")
os.environ.setdefault("SCL_DATA_DIR", tempfile.mkdtemp(prefix="scl-test-data-"))
# The C++ kernels from the user's kernel cache, for every test and every process a test starts: a test that points
# SCL_CACHE_DIR at a scratch folder (a backend, a server, a catalog copy) would otherwise compile them again, minutes
# on 2 cores, before its first quantized step (seen: a backend's first run not landing within 180 s). Builds are keyed
# by their sources, torch and python (engine/ops/build.py), so sharing them changes no result.
from engine.common.paths import cache_dir as _cache_dir  # noqa: E402

os.environ.setdefault("SCL_KERNEL_CACHE", str(_cache_dir() / "kernels"))

from tests.tiny import register as _register_tiny_models  # noqa: E402

_register_tiny_models()  # "tiny" and "tiny-draft" in engine.measure's model registry, for the pages' tests


@pytest.fixture(scope="session")
def pool():
    from engine.measure.pool import ModelPool

    return ModelPool(keep=8)


def _get(pool, name, precision, **kw):
    from engine.infer.loader import make_spec

    return pool.get(name, make_spec(precision, **kw), "cpu")


@pytest.fixture(scope="session")
def small_fp32(pool):
    """Qwen2.5-Coder-0.5B-Instruct at fp32 (real weights)."""
    return _get(pool, "default-draft", "fp32")


@pytest.fixture(scope="session")
def small_int4(pool):
    return _get(pool, "default-draft", "int4")


@pytest.fixture(scope="session")
def small_int8(pool):
    return _get(pool, "default-draft", "int8")


@pytest.fixture(scope="session")
def big_int4(pool):
    """Qwen2.5-Coder-1.5B-Instruct at int4 (real weights): the default target, made fast by our kernels."""
    return _get(pool, "default", "int4")


@pytest.fixture(scope="session")
def hf_small():
    import torch
    from transformers import AutoModelForCausalLM

    from engine.infer import catalog
    return AutoModelForCausalLM.from_pretrained(str(catalog.resolve("default-draft")), dtype=torch.float32).eval()


@pytest.fixture()
def store(tmp_path):
    from engine.measure.store import Store

    return Store(tmp_path / "lab.sqlite")


@pytest.fixture(scope="session")
def lab_backend(tmp_path_factory):
    """The backend the pages drive in the AppTests: real (engine.backend's app, queue and pool), on a free
    127.0.0.1 port, in a thread of this process so the tiny models registered above are served; its own
    store; stopped when the session ends (tests/app_helpers.backend_in_thread)."""
    from tests.app_helpers import backend_in_thread

    with backend_in_thread(tmp_path_factory.mktemp("backend") / "lab.sqlite") as b:
        yield b


@pytest.fixture
def one_thread():
    """Tiny models are all Python overhead: threads only add contention."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------- skips CI must not take
# `.ci/run` builds every optional piece a test needs (chromium, the peers, vLLM's and GuideLLM's venvs,
# lm-eval, Ray, the sdist): there, a test that skips for want of one of them has not run, and says so by
# failing (SCL_CI=1). A skip for what a host is (its SIMD, no nvcc, no user namespaces, a busy machine) stays
# a skip: these reasons are the only ones allowed.
HOST_PROPERTIES = ("not supported", "nvcc", "unprivileged", "user namespace", "never quiet")


def _ci_must_run(report) -> str | None:
    if not os.environ.get("SCL_CI") or not report.skipped:
        return None
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if any(p in reason for p in HOST_PROPERTIES) or hasattr(report, "wasxfail"):
        return None
    return reason


def _fail_where_ci_must_run(report, what: str) -> None:
    reason = _ci_must_run(report)
    if reason:
        report.outcome = "failed"
        report.longrepr = f"{what} skipped on CI, where .ci/run provides what it needs (SCL_CI=1): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_where_ci_must_run(outcome.get_result(), "test")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_where_ci_must_run(outcome.get_result(), "module")
