"""bench/ scripts imported by their file path.

bench/ never joins sys.path: a script's name there (kernel_speed, load, peers...) would shadow an installed
package of the same name for every later import in the session (transformers imports `kernels` if it finds one).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_script(name: str):
    """bench/<name>.py as a module named bench_<name>; loaded once per session."""
    key = f"bench_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
