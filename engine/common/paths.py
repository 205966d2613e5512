"""Where things live: the repository's shipped data, the user's cache and the user's saved data."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "data"  # shipped tables and texts; never written


def _user_dir(override: str, xdg: str, fallback: str) -> Path:
    env = os.environ.get(override)
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get(xdg) or os.path.expanduser(fallback)) / "serving-cost-lab"


def cache_dir() -> Path:
    """Converted models, kernel builds, quality references; SCL_CACHE_DIR overrides."""
    return _user_dir("SCL_CACHE_DIR", "XDG_CACHE_HOME", "~/.cache")


def data_dir() -> Path:
    """The user's store (runs, reports, price edits); SCL_DATA_DIR overrides."""
    return _user_dir("SCL_DATA_DIR", "XDG_DATA_HOME", "~/.local/share")
