"""Records as rows: one flat dict per record, every column of columns.py (llama-bench style)."""
from __future__ import annotations

from typing import Iterable

from engine.present.columns import COLUMNS, for_view


def row(rec, usd_per_hour: float | None = None) -> dict:
    """Every column's value for one record; $/1M needs a price and is None without one."""
    return {c.name: c.value(rec, usd_per_hour) for c in COLUMNS}


def rows(records: Iterable, usd_per_hour: float | None = None) -> list[dict]:
    return [row(r, usd_per_hour) for r in records]


def view_columns(table: list[dict], view: str) -> list[str]:
    """The columns of a view that hold a value in at least one row, in declared order."""
    return [c.name for c in for_view(view) if any(r.get(c.name) is not None for r in table)]
