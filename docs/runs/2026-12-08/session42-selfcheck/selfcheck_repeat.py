"""Session 42: the planner self-check's measurement (tests/test_planner_selfcheck.py's _measure_and_check: our server
at int4 on the 0.5B, closed-loop points at C = 1, 4, 8, then `plan check load --in-sample`), printed once per run.
Run from the repository root: .venv/bin/python docs/runs/2026-12-08/session42-selfcheck/selfcheck_repeat.py"""
import shutil
import sys
from pathlib import Path

sys.path.insert(0, "tests")
sys.path.insert(0, ".")
import test_planner_selfcheck as t  # noqa: E402

from engine.peers import servers  # noqa: E402

spec = servers.ServerSpec.of("serving-cost-lab", model="default-draft", precision="int4", slots=8, max_model_len=1024)
rs = servers.start(spec, progress=print)
try:
    d = Path("/tmp/selfck/data")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    recs, rows, table = t._measure_and_check(rs.url, d)
    print(table)
finally:
    rs.stop()
