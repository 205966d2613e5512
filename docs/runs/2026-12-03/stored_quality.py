"""Print the stored `quality` records of the 0.5B (newest per label) as the table in quality-0p5b-methods-2048.md.

    OMP_NUM_THREADS=1 .venv/bin/python docs/runs/2026-12-03/stored_quality.py
"""
from engine.measure.store import Store

seen, rows = set(), []
for r in Store().list_runs(50):
    if r.kind != "quality" or r.label in seen or "0.5b" not in r.label:
        continue
    seen.add(r.label)
    rows.append((r.label, r.run_id, r.metrics["quality"], r.metrics.get("weight_bytes")))
print("| config | run | KLD mean ± | median | p99 | max | same top-1 | PPL ratio | weight MB |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for label, rid, q, wb in rows[::-1]:
    print(f"| {label} | {rid} | {q['kld_mean']:.4f} ± {q['kld_mean_err']:.4f} | {q['kld_median']:.5f} | {q['kld_p99']:.4f} "
          f"| {q['kld_max']:.3f} | {q['top1_agreement']:.2%} | {q['ppl_ratio']:.4f} | {wb / 1e6:.1f} |")
