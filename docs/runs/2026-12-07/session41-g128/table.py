"""Issue 36's one table for the 1.5B on the off-grid reference, session 40's table with the cells it left open
(GPTQ g128; pass@1 of llama.cpp's importance-matrix and IQ4_XS weights) and GPTQ-mixed g64, every cell read from
the raw outputs it cites (nothing typed in):

- KLD median / p99 / same top-1 and weight MB on the same 2,048 tokens against the same fp32 reference: session
  40's merged/quality_matched.json, and this session's qm-g128/ and qm-g64/ (the rows of both sessions reproduce
  bit for bit: frontier.json's GPTQ g32 rows read session 40's numbers);
- pass@1, all 164, paired problem by problem against session 17's fp32 run: session 40's paired.txt and this
  session's (session 18's paired.py over this session's accuracy-full.progress.txt);
- generation tok/s at batch 8 and $ per 1,000 solved: each accuracy run's own table;
- single-stream tok/s (bench/peers.py, fresh processes, median of 3 per pass): every pass of session 40 (speed-1..5)
  and of this session (speed-1..3) that ran the configuration, its ratio to llama.cpp's requantized Q4_K_M taken
  within each pass.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-07/session41-g128/table.py > .../table.md
"""
import importlib.util
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
S40 = HERE.parent / "session40-offgrid-table"
_spec = importlib.util.spec_from_file_location("s40_table", S40 / "table.py")
s40 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(s40)

ROWS = s40.ROWS[:4] + [
    ("ours int4 g128, GPTQ (v3)", "ours int4-gptq-g128", "int4 gptq g128", "serving-cost-lab int4 gptq g128"),
] + s40.ROWS[4:6] + [
    ("ours int4 g64, GPTQ-mixed (v3)", "ours int4-gptq-mixed-g64", None, "serving-cost-lab int4 gptq-mixed"),
] + [(n, q, a or {"llama.cpp Q4_K_M-imatrix": "llama-server Q4_K_M-imatrix", "llama.cpp IQ4_XS":
                  "llama-server IQ4_XS", "llama.cpp IQ4_XS-imatrix": "llama-server IQ4_XS-imatrix"}.get(s), s)
     for n, q, a, s in s40.ROWS[6:]]


def accuracy() -> dict:
    out = {}
    for path in s40.ACCURACY_MD + [HERE / "accuracy-full.md"]:
        for c in s40.md_rows(path):
            out.setdefault(s40.short(c[0]), {}).update(
                gen=float(c[10]), usd=float(c[11]), **{"from": str(path.relative_to(HERE.parent.parent))})
    line = re.compile(r"^(?P<label>.+?): (?P<k>\d+)/164 .* lost (?P<lost>\d+) gained (?P<gained>\d+) "
                      r"McNemar p (?P<p>\S+)$")
    for path in (S40 / "paired.txt", HERE / "paired.txt"):
        for text in path.read_text().splitlines():
            m = line.match(text)
            if m and m["p"] != "nan":
                out.setdefault(s40.short(m["label"]), {}).update(solved=int(m["k"]), lost=int(m["lost"]),
                                                                 gained=int(m["gained"]), p=float(m["p"]))
    return out


def main() -> None:
    q = json.loads((S40 / "merged" / "quality_matched.json").read_text())["rows"]
    for run in ("qm-g128", "qm-g64"):
        q |= json.loads((HERE / run / "quality_matched.json").read_text())["rows"]
    acc = accuracy()
    passes = [sp for sp in (s40.speeds(d / f"speed-{i}") for d in (S40, HERE) for i in range(1, 10))
              if sp.get(s40.BASE)]
    print("| config | KLD median | p99 | same top-1 | weight MB | pass@1 (of 164) | lost / gained | McNemar p "
          "| gen tok/s (batch 8) | $/1,000 solved | single-stream tok/s, median over its passes | passes "
          "| vs llama.cpp Q4_K_M, median | range |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, ql, al, sl in ROWS:
        r, a = q.get(ql, {}), acc.get(al or "", {})
        tok = [sp[sl] for sp in passes if sl in sp]
        ratio = [sp[sl] / sp[s40.BASE] for sp in passes if sl in sp]
        cells = [name,
                 f"{r['kld_median']:.5f}" if "kld_median" in r else "",
                 f"{r['kld_p99']:.4f}" if "kld_p99" in r else "",
                 f"{r['top1_agreement']:.2%}" if "top1_agreement" in r else "",
                 f"{r['weight_bytes'] / 1e6:,.0f}" if r.get("weight_bytes") else "",
                 f"{a['solved']} ({a['solved'] / 164:.1%})" if "solved" in a else "not run",
                 f"{a['lost']} / {a['gained']}" if "lost" in a else "",
                 f"{a['p']:.3g}" if "p" in a else "",
                 f"{a['gen']:.1f}" if "gen" in a else "", f"{a['usd']:.3f}" if "usd" in a else "",
                 f"{statistics.median(tok):.2f}" if tok else "", str(len(tok)) if tok else "",
                 f"{statistics.median(ratio):.2f}" if ratio else "",
                 f"{min(ratio):.2f}-{max(ratio):.2f}" if ratio else ""]
        print("| " + " | ".join(cells) + " |")
    print("\nfp32 (session 17, the unpermuted 1.5B: the same function): 87/164 solved. Accuracy runs: "
          + "; ".join(sorted({a["from"] for a in acc.values() if "from" in a})) + ".")


if __name__ == "__main__":
    main()
