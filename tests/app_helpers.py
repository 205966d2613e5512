"""Shared by the AppTest page tests: tiny models, a scratch store, and what a page shows."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 180


@pytest.fixture(autouse=True)
def app_env(tmp_path, tmp_path_factory, monkeypatch):
    """A fresh store per test and one scratch model cache per session (the tiny models are registered by conftest)."""
    monkeypatch.setenv("SCL_PAGE_DIRECT", "1")  # run the page file itself (see _ui.hand_over_to_app)
    monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SCL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "scl-app-cache"))
    yield tmp_path


def problems(at) -> list[str]:
    """Exceptions (tracebacks) and error boxes on the page."""
    return [e.value for e in at.exception] + [e.value for e in at.error]


def frame(at, *columns):
    """The first dataframe on the page that has all these columns."""
    for d in at.dataframe:
        if all(c in d.value.columns for c in columns):
            return d.value
    raise AssertionError(f"no table with columns {columns}")
