"""A multi-turn workload: ShareGPT V3 conversations replayed turn by turn (`multiturn:N[:TURNS]`).

Selection (deterministic, no ids file): every complete ShareGPT record (workloads.sharegpt()), in id order,
whose first TURNS exchanges alternate human -> gpt with non-empty text; shuffled with workloads.SEED; the
first N kept. A conversation replays exactly its first TURNS exchanges (the cap on turns); later ones are
not sent. Turn k's messages are [user 1, assistant 1 (the recorded answer), ..., user k], as vLLM's
multi-turn benchmark replays recorded answers, so turn k+1's prompt begins with turn k's and a prefix
cache can reuse it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from engine.common.errors import UserError

NAME = "multiturn"
DEFAULT_COUNT = 8
DEFAULT_TURNS = 4
MIN_TURNS, MAX_TURNS = 2, 16
USAGE = f"{NAME}:N[:TURNS] (N conversations of TURNS turns, default {NAME}:{DEFAULT_COUNT}:{DEFAULT_TURNS})"


@dataclass(frozen=True)
class Exchange:
    """One recorded exchange: the user's message and the answer the dataset holds for it."""

    user: str
    assistant: str


@dataclass(frozen=True)
class Conversation:
    id: str  # "sharegpt:<id>"
    exchanges: tuple[Exchange, ...]

    def messages(self, turn: int) -> list[dict]:
        """Turn `turn`'s (0-based) chat messages: the earlier exchanges as recorded, then its user message."""
        out = []
        for e in self.exchanges[:turn]:
            out += [{"role": "user", "content": e.user}, {"role": "assistant", "content": e.assistant}]
        return out + [{"role": "user", "content": self.exchanges[turn].user}]


def is_multiturn(spec: str | None) -> bool:
    """Whether a workload spec names the multi-turn workload (alone or in a mix)."""
    return isinstance(spec, str) and any(p.strip().lower().partition(":")[0].strip() == NAME for p in spec.split(","))


def parse(spec: str) -> tuple[int, int]:
    """'multiturn:8:4' -> (8 conversations, 4 turns); 'multiturn' -> the defaults."""
    if "," in spec:
        raise UserError(f"the {NAME} workload cannot be mixed with others ('{spec}')", f"use {USAGE} alone")
    name, _, rest = spec.strip().lower().partition(":")
    if name.strip() != NAME:
        raise UserError(f"'{spec}' is not the {NAME} workload", f"use {USAGE}")
    parts = [p.strip() for p in rest.split(":")] if rest.strip() else []
    if len(parts) > 2:
        raise UserError(f"workload '{spec}' has too many parts", f"use {USAGE}")
    try:
        count = int(parts[0]) if parts and parts[0] else DEFAULT_COUNT
        turns = int(parts[1]) if len(parts) > 1 and parts[1] else DEFAULT_TURNS
    except ValueError:
        raise UserError(f"workload '{spec}' holds a count that is not a whole number", f"use {USAGE}") from None
    if not MIN_TURNS <= turns <= MAX_TURNS:
        raise UserError(f"{turns} turns per conversation is out of range",
                        f"use {NAME}:{count}:{MIN_TURNS} to {NAME}:{count}:{MAX_TURNS}")
    have = len(eligible(turns))
    if not 1 <= count <= have:
        raise UserError(f"workload {NAME}:{count}:{turns} asks for {count} conversations; {have} have {turns} turns",
                        f"use {NAME}:1:{turns} to {NAME}:{have}:{turns}")
    return count, turns


def canonical(spec: str) -> str:
    count, turns = parse(spec)
    return f"{NAME}:{count}:{turns}"


def _exchanges(conv: dict, turns: int) -> tuple[Exchange, ...] | None:
    """The first `turns` exchanges, where they alternate human -> gpt with non-empty text; else None."""
    msgs = conv.get("conversations") or []
    if len(msgs) < 2 * turns:
        return None
    out = []
    for u, a in zip(msgs[0:2 * turns:2], msgs[1:2 * turns:2]):
        if u.get("from") != "human" or a.get("from") != "gpt":
            return None
        text_u, text_a = u.get("value") or "", a.get("value") or ""
        if not (text_u.strip() and text_a.strip()):
            return None
        out.append(Exchange(text_u, text_a))
    return tuple(out)


@lru_cache(maxsize=4)
def eligible(turns: int) -> tuple[str, ...]:
    """Ids of the conversations with at least `turns` exchanges, in the selection's seeded order."""
    from engine.measure.workloads import SEED, sharegpt

    ids = [cid for cid, conv in sorted(sharegpt().items()) if _exchanges(conv, turns)]
    random.Random(SEED).shuffle(ids)
    return tuple(ids)


def load(spec: str) -> list[Conversation]:
    """The conversations of a `multiturn` spec, each cut to its first TURNS exchanges."""
    from engine.measure.workloads import sharegpt

    count, turns = parse(spec)
    return [Conversation(f"sharegpt:{cid}", _exchanges(sharegpt()[cid], turns)) for cid in eligible(turns)[:count]]
