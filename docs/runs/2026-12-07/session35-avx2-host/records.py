"""The six `engine bench` records run.sh made (bench-1, bench-2, and one run before it of the same command with
one pass), read from the lab's store: config, the probes' floor and bw_efficiency -> records.json."""
import json
import sqlite3
import sys
from pathlib import Path

db = Path.home() / ".local/share/serving-cost-lab/lab.sqlite"
rows = sqlite3.connect(db).execute("select created_at, record from runs order by rowid")
out = []
for created, rec in rows:
    r = json.loads(rec)
    m = r.get("metrics", {})
    out.append({"created_at": created, "precision": r["config"].get("precision"),
                "group_size": r["config"].get("group_size"), "simd": (r.get("machine") or {}).get("simd"),
                **{k: m.get(k) for k in ("bw_probe", "bw_floor_ms", "bw_efficiency", "tok_s", "tok_ms_p50",
                                         "weights_MB")}})
json.dump(out, sys.stdout, indent=1)
