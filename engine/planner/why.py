"""One term of a plan's explanation. Each function that computes a term writes it (roofline's steps and memory,
queueing's serving point, speculation's round, the search's replicas and price), so the words and the number
come from the same place."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Why:
    """What, the formula with its inputs, its value and unit."""

    term: str
    formula: str
    value: float | str
    unit: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def ms(seconds: float) -> float:
    return seconds * 1e3
