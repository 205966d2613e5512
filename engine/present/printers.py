"""Printers only format: rows as a markdown table (tabulate), CSV or JSON."""
from __future__ import annotations

import csv
import io
import json

from tabulate import tabulate


def format_rows(rows: list[dict], fmt: str = "md", columns: list[str] | None = None) -> str:
    """md/csv/json of `rows`; columns default to every key that holds a value somewhere, in order."""
    if fmt == "json":
        return json.dumps(rows if columns is None else [{c: r.get(c) for c in columns} for r in rows], indent=1)
    if not rows:
        return "(no runs)"
    cols = columns or [k for k in rows[0] if any(r.get(k) is not None for r in rows)]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()
    if fmt != "md":
        raise ValueError(f"unknown format {fmt!r}")
    body = [["" if r.get(c) is None else r.get(c) for c in cols] for r in rows]
    return tabulate(body, headers=cols, tablefmt="github", disable_numparse=True)
