"""The quality evaluation text: real documents in a fixed, seeded order, in two categories.

- chat: ShareGPT answers (the gpt turn that answers a conversation's first user turn), for the
  chat ids of data/workloads.json, in that file's order (shuffled once with seed 0);
- code: a HumanEval task's prompt followed by its canonical solution, for the code ids, same order.

The text itself comes from the pinned packages (engine.measure.workloads); data/ holds only ids.
Each document is tokenized on its own and cut at MAX_DOC_TOKENS; documents under MIN_DOC_TOKENS
are skipped. A budget of N scored tokens gives each category half: its documents are taken in
order until the half is met, the last one cut to fit. Every document is scored from its second
token on, with a fresh KV cache (a position is the prediction of token t+1 from tokens 0..t of the
same document), so a scored token always has its own document, and nothing else, as context.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from engine.common.errors import UserError

CATEGORIES = ("chat", "code")
DEFAULT_TOKENS = 8192  # scored positions: 4,096 per category
MAX_DOC_TOKENS = 512
MIN_DOC_TOKENS = 16
SOURCE = "ShareGPT answers (chat) + HumanEval prompt and canonical solution (code), data/workloads.json order"


@dataclass(frozen=True)
class EvalDoc:
    """One document: its id in the workload selection, its category, and its token ids."""

    id: str
    category: str
    ids: tuple[int, ...]

    @property
    def positions(self) -> int:
        """Next-token predictions scored in this document."""
        return max(0, len(self.ids) - 1)


def document_texts(category: str) -> list[tuple[str, str]]:
    """(id, text) of every document of a category, in the selection's seeded order."""
    from engine.measure import workloads as W

    if category not in CATEGORIES:
        raise UserError(f"unknown eval text category '{category}'", f"use one of: {', '.join(CATEGORIES)}")
    out = []
    for pid in W.selection()["categories"][category]["ids"]:
        source, _, key = pid.partition(":")
        if source == "humaneval":
            task = W.humaneval()[key]
            out.append((pid, task["prompt"] + task["canonical_solution"]))
        else:
            turn = W._first_turn(W.sharegpt()[key])
            if turn:
                out.append((pid, turn[1]))
    return out


def _budgets(max_tokens: int) -> dict[str, int]:
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < len(CATEGORIES):
        raise UserError(f"the eval text needs at least {len(CATEGORIES)} tokens, not {max_tokens!r}",
                        f"ask for {DEFAULT_TOKENS} (the default) or any whole number from 2")
    half = max_tokens // len(CATEGORIES)
    return {"chat": max_tokens - half, "code": half}


def eval_docs(tokenizer, max_tokens: int = DEFAULT_TOKENS, max_doc_tokens: int = MAX_DOC_TOKENS) -> list[EvalDoc]:
    """The documents holding `max_tokens` scored positions, half chat and half code (chat first)."""
    docs = []
    for cat, budget in _budgets(max_tokens).items():
        left = budget
        for pid, text in document_texts(cat):
            if left <= 0:
                break
            ids = list(tokenizer(text)["input_ids"])[:max_doc_tokens]
            if len(ids) < MIN_DOC_TOKENS:
                continue
            ids = ids[: left + 1]
            docs.append(EvalDoc(pid, cat, tuple(int(i) for i in ids)))
            left -= len(ids) - 1
        if left > 0:
            have = budget - left
            raise UserError(f"the {cat} documents hold only {have} tokens of the {budget} asked for",
                            f"ask for at most {2 * have} tokens")
    return docs


def fingerprint(docs: list[EvalDoc]) -> str:
    """sha256 of every document's token ids and boundaries: what a reference is computed on."""
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{len(d.ids)}:".encode())
        h.update(",".join(map(str, d.ids)).encode())
        h.update(b";")
    return h.hexdigest()


def describe(docs: list[EvalDoc]) -> dict:
    """What was scored: the source, the document ids, and tokens per category."""
    by_cat = {c: {"documents": 0, "tokens": 0} for c in CATEGORIES}
    for d in docs:
        by_cat[d.category]["documents"] += 1
        by_cat[d.category]["tokens"] += d.positions
    return {"eval_text": SOURCE, "eval_fingerprint": fingerprint(docs)[:16], "documents": [d.id for d in docs],
            "tokens_by_category": by_cat}


def flat_ids(docs: list[EvalDoc], max_tokens: int | None = None) -> list[int]:
    """The documents' ids joined into one sequence (for the one-sequence helpers)."""
    out = [i for d in docs for i in d.ids]
    return out if max_tokens is None else out[:max_tokens]
