"""fp32 through execute(): on the main thread against a worker thread (as the backend runs it), alternated."""
import sys, threading, time
sys.path.insert(0, "/work/main")
from engine.measure.grid import DEFAULT_WORKLOAD, default_comparison
from engine.measure.pool import ModelPool
from engine.measure.runs import execute

cfgs = default_comparison("default-draft", "default-draft", 32, self_draft=True, workload=DEFAULT_WORKLOAD, reps=3)
which = sys.argv[1] if len(sys.argv) > 1 else "fp32"
cfg = next(c for c in cfgs if c.setup.precision == which and c.setup.draft == "none")
pool = ModelPool(keep=2)

def once(where):
    out = {}
    def go():
        out["rec"] = execute(cfg, pool, None)
    if where == "main":
        go()
    else:
        t = threading.Thread(target=go); t.start(); t.join()
    r = out["rec"]
    print(f"{where:6s} {cfg.setup.label}: {r.metrics['decode_tok_s']:.2f} decode tok/s, noise "
          f"{(r.metrics.get('noise') or {}).get('verdict')}", flush=True)

for where in ("main", "thread", "main", "thread"):
    once(where)
