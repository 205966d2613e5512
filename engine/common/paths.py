"""Where things live: the repository's shipped data, the user's cache and the user's saved data."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "data"  # shipped tables and texts; never written


def cache_dir() -> Path:
    """Converted models, kernel builds, quality references; SCL_CACHE_DIR overrides."""
    env = os.environ.get("SCL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "serving-cost-lab"


def data_dir() -> Path:
    """The user's store (runs, reports, price edits); SCL_DATA_DIR overrides."""
    env = os.environ.get("SCL_DATA_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "serving-cost-lab"
