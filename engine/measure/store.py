"""SQLite store: runs (written as each finishes), reports, and user price/GPU overrides.

Rows are only ever inserted or deleted on the user's request; a saved record is never rewritten.
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
import uuid
from datetime import datetime, timezone
from pathlib import Path

from engine.common.errors import UserError
from engine.common.paths import data_dir
from engine.measure.records import RunRecord, validate

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    kind TEXT NOT NULL,
    model TEXT,
    precision TEXT,
    draft TEXT,
    label TEXT,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    report_id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    name TEXT NOT NULL,
    notes TEXT NOT NULL DEFAULT '',
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gpu_overrides (
    name TEXT PRIMARY KEY,
    updated_at TEXT NOT NULL,
    fields TEXT NOT NULL
);
"""


def default_path() -> Path:
    return data_dir() / "lab.sqlite"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Store:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._conn() as c:
            c.executescript(SCHEMA)

    @contextmanager
    def _conn(self):
        """One short-lived connection per call (safe across Streamlit's threads): committed or rolled
        back, then closed. `with sqlite3.connect()` alone commits but never closes."""
        c = sqlite3.connect(self.path, timeout=30)
        try:
            c.execute("PRAGMA journal_mode=WAL")
            with c:
                yield c
        finally:
            c.close()

    # ---- runs
    def save_run(self, rec: RunRecord) -> str:
        """Insert a record, checked first against fields.py (records.validate, strict): a record with a bad or
        undeclared field is refused by name and nothing is written."""
        d = validate(rec.to_dict(), strict=True)
        draft = (d["config"].get("draft") or {}).get("kind")
        with self._conn() as c:
            c.execute(
                "INSERT INTO runs (run_id, created_at, kind, model, precision, draft, label, record) "
                "VALUES (?,?,?,?,?,?,?,?)",
                (rec.run_id, rec.created_at, rec.kind, d["config"].get("model"), d["config"].get("precision"),
                 draft, rec.label, rec.to_json()),
            )
        return rec.run_id

    def import_run(self, rec: RunRecord | dict) -> bool:
        """Store a record measured elsewhere (a backend's), validated; False when its run_id is already here.

        The dashboard imports the records its backend sends; the backend may share this very file.
        """
        if isinstance(rec, dict):
            rec = RunRecord.from_dict(rec)
        try:
            self.save_run(rec)
        except sqlite3.IntegrityError:  # the same run, stored before (or by the backend itself)
            return False
        return True

    def get_run(self, run_id: str) -> RunRecord:
        with self._conn() as c:
            row = c.execute("SELECT record FROM runs WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise UserError(f"no run with id '{run_id}'", "list runs with `python -m engine runs`")
        return RunRecord.from_json(row[0])

    def list_runs(self, limit: int = 200, kind: str | None = None) -> list[RunRecord]:
        q = ("SELECT record FROM runs" + (" WHERE kind=?" if kind else "")
             + " ORDER BY created_at DESC, rowid DESC LIMIT ?")
        args = (kind, limit) if kind else (limit,)
        with self._conn() as c:
            rows = c.execute(q, args).fetchall()
        return [RunRecord.from_json(r[0]) for r in rows]

    def delete_run(self, run_id: str) -> None:
        with self._conn() as c:
            c.execute("DELETE FROM runs WHERE run_id=?", (run_id,))

    # ---- reports (the body is a JSON document built by reports.py)
    def save_report(self, name: str, notes: str, body: dict) -> str:
        name = (name or "").strip()
        if not name:
            raise UserError("a report needs a name", "type a name before saving")
        rid = uuid.uuid4().hex[:12]
        with self._conn() as c:
            c.execute("INSERT INTO reports (report_id, created_at, name, notes, body) VALUES (?,?,?,?,?)",
                      (rid, _now(), name[:200], notes or "", json.dumps(body, allow_nan=False)))
        return rid

    def list_reports(self) -> list[dict]:
        with self._conn() as c:
            rows = c.execute("SELECT report_id, created_at, name, notes FROM reports "
                             "ORDER BY created_at DESC, rowid DESC").fetchall()
        return [dict(zip(("report_id", "created_at", "name", "notes"), r)) for r in rows]

    def get_report(self, report_id: str) -> dict:
        with self._conn() as c:
            row = c.execute("SELECT report_id, created_at, name, notes, body FROM reports WHERE report_id=?",
                            (report_id,)).fetchone()
        if row is None:
            raise UserError(f"no report with id '{report_id}'", "pick one from the list of saved reports")
        d = dict(zip(("report_id", "created_at", "name", "notes"), row[:4]))
        d["body"] = json.loads(row[4])
        return d

    def delete_report(self, report_id: str) -> None:
        with self._conn() as c:
            c.execute("DELETE FROM reports WHERE report_id=?", (report_id,))

    # ---- GPU price/spec overrides (the shipped data/gpus.csv is never written)
    def set_gpu_override(self, name: str, fields: dict) -> None:
        with self._conn() as c:
            c.execute("INSERT INTO gpu_overrides (name, updated_at, fields) VALUES (?,?,?) "
                      "ON CONFLICT(name) DO UPDATE SET updated_at=excluded.updated_at, fields=excluded.fields",
                      (name, _now(), json.dumps(fields, allow_nan=False)))

    def gpu_overrides(self) -> list[dict]:
        with self._conn() as c:
            rows = c.execute("SELECT name, fields FROM gpu_overrides ORDER BY name").fetchall()
        return [{"name": n, **json.loads(f)} for n, f in rows]

    def delete_gpu_override(self, name: str) -> None:
        with self._conn() as c:
            c.execute("DELETE FROM gpu_overrides WHERE name=?", (name,))
