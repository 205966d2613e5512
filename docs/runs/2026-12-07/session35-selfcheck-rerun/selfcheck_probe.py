import sys, json
sys.path.insert(0, "tests"); sys.path.insert(0, ".")
from pathlib import Path
from engine.peers import servers
import test_planner_selfcheck as t
spec = servers.ServerSpec.of("serving-cost-lab", model="default-draft", precision="int4", slots=8, max_model_len=1024)
rs = servers.start(spec, progress=print)
try:
    recs, rows, table = t._measure_and_check(rs.url, Path("/tmp/s35/selfcheck-data"))
finally:
    rs.stop()
print(table)
for r in recs:
    m = r.metrics
    print(r.config.get("label"), {k: m.get(k) for k in sorted(m) if any(x in k for x in ("ttft", "itl", "tok_s", "tpot", "e2e", "requests", "duration"))})
