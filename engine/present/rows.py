"""Records as rows: one flat dict per record, every column of columns.py (llama-bench style).

A column with an interval adds `<name>_lo` and `<name>_hi` beside its value (CSV/JSON carry them);
`display_rows` turns rows into the text tables show (`median ± h`), `with_half_widths` adds the
numeric `<name>_pm` the pages' sortable tables show beside each value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from engine.common.fields import M
from engine.present.columns import BY_NAME, COLUMNS, display, for_view, plus_minus


def row(rec, usd_per_hour: float | None = None) -> dict:
    """Every column's value for one record; $/1M needs a price and is None without one."""
    out = {}
    for c in COLUMNS:
        out[c.name] = c.value(rec, usd_per_hour)
        if c.interval is not None:
            out[f"{c.name}_lo"], out[f"{c.name}_hi"] = c.bounds(rec, usd_per_hour)
    return out


def rows(records: Iterable, usd_per_hour: float | None = None) -> list[dict]:
    return [row(r, usd_per_hour) for r in records]


def view_columns(table: list[dict], view: str) -> list[str]:
    """The columns of a view that hold a value in at least one row, in declared order."""
    return [c.name for c in for_view(view) if any(r.get(c.name) is not None for r in table)]


def with_bounds(names: list[str], table: list[dict]) -> list[str]:
    """names with each one's `_lo`/`_hi` after it, where some row has them (for CSV and JSON)."""
    out = []
    for n in names:
        out.append(n)
        out += [k for k in (f"{n}_lo", f"{n}_hi") if any(r.get(k) is not None for r in table)]
    return out


def display_rows(table: list[dict], names: list[str]) -> list[dict]:
    """The named cells as text, `median ± h` where the row has an interval (md, the report HTML)."""
    return [{n: display(BY_NAME[n], r) if n in BY_NAME else ("" if r.get(n) is None else str(r[n])) for n in names}
            for r in table]


def detail(rec) -> list[tuple[str, str]]:
    """(label, text) of the `detail` view's columns for one run: what a page writes beside the run's result."""
    r = row(rec)
    return [(c.label, display(c, r)) for c in for_view("detail") if r.get(c.name) not in (None, "")]


def with_half_widths(table: list[dict]) -> list[dict]:
    """Copies of the rows with `<name>_pm` (the ± as a number) for every column with an interval."""
    out = []
    for r in table:
        r = dict(r)
        for c in COLUMNS:
            if c.interval is not None:
                h = plus_minus(r.get(c.name), r.get(f"{c.name}_lo"), r.get(f"{c.name}_hi"))
                r[f"{c.name}_pm"] = None if h is None else round(h, c.digits if c.digits is not None else 6)
        out.append(r)
    return out


# ---------------------------------------------------------------- per category

@dataclass
class CategoryView:
    """A record seen through one of its workload categories: metrics are metrics.by_category[category]
    (the same names as the record's), everything else is the record's. 'all' is the record itself."""

    rec: Any
    category: str

    @property
    def metrics(self) -> dict:
        if self.category == "all":
            return self.rec.metrics or {}
        b = ((self.rec.metrics or {}).get(M.by_category) or {}).get(self.category)
        return b if isinstance(b, dict) else {}

    def __getattr__(self, name):  # config, label, run_id, kernels, created_at, kind: the record's
        return getattr(self.rec, name)


def category_views(records: Iterable) -> list[CategoryView]:
    """Each record's categories, then 'all' when it has more than one."""
    out = []
    for r in records:
        cats = (r.metrics or {}).get(M.by_category)
        names = list(cats) if isinstance(cats, dict) else []
        out += [CategoryView(r, c) for c in names]
        if len(names) != 1:
            out.append(CategoryView(r, "all"))
    return out


def category_rows(records: Iterable, usd_per_hour: float | None = None) -> list[dict]:
    """One row per record and category (the per-category table: speed, acceptance, speedup)."""
    return rows(category_views(records), usd_per_hour)
