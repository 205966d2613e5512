"""Issue 36's one table for the 1.5B on the off-grid reference, assembled from the raw outputs it cites (nothing
typed in):

- KLD median / p99 / same top-1 and weight MB: merged/quality_matched.json (run.sh: four runs of one commit on the
  same 2,048 tokens and the permuted folder's fp32 reference);
- pass@1 on all 164 HumanEval problems, greedy, batch 8, paired problem by problem against session 17's fp32 run of
  the unpermuted 1.5B (the same function): paired.txt (session 18's paired.py over accuracy-full.progress.txt and
  sessions 38 and 39's progress logs of GPTQ g32 and GPTQ-mixed g32, the same codes as this run's quality rows);
- generation tok/s at batch 8 and $ per 1,000 solved: each accuracy run's own table (engine accuracy: generation time
  at the measured speed and the lab's default price, over the problems solved);
- single-stream tok/s (bench/peers.py, fresh processes, median of 3 per pass): each configuration's median over the
  passes speed-1/ .. speed-5/ (run.sh, run-speed-more.sh), and the median and range of its ratio to llama.cpp's
  requantized Q4_K_M within each pass.

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-07/session40-offgrid-table/table.py > .../table.md
"""
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAY = HERE.parent
ACCURACY_MD = [HERE / "accuracy-full.md", DAY / "session38-avx512" / "accuracy-full.md",
               DAY / "session39-w8a8" / "accuracy-full.md"]
BASE = "llama.cpp Q4_K_M-requant"

# (row, quality label, accuracy label, speed label); accuracy labels carry the model folder, speed labels too
ROWS = [
    ("ours int8", "ours int8", "int8", "serving-cost-lab int8"),
    ("ours int4 g32, round-to-nearest", "ours int4-g32", "int4 g32", "serving-cost-lab int4 g32"),
    ("ours int4 g64, round-to-nearest", "ours int4-g64", "int4", "serving-cost-lab int4"),
    ("ours int4 g32, GPTQ (v3)", "ours int4-gptq-g32", "int4 gptq g32", "serving-cost-lab int4 gptq g32"),
    ("ours int4 g32, AWQ", "ours int4-awq-g32", "int4 awq g32", "serving-cost-lab int4 awq g32"),
    ("ours int4 g32, GPTQ-mixed (v3)", "ours int4-gptq-mixed-g32", "int4 gptq-mixed g32",
     "serving-cost-lab int4 gptq-mixed g32"),
    ("llama.cpp Q4_K_M", "llama.cpp Q4_K_M (requantized from the reference)", "llama-server Q4_K_M-requant",
     BASE),
    ("llama.cpp Q4_K_M + importance matrix", "llama.cpp Q4_K_M-imatrix (quantized from the reference)", None,
     "llama.cpp Q4_K_M-imatrix"),
    ("llama.cpp IQ4_XS", "llama.cpp IQ4_XS (quantized from the reference)", None, "llama.cpp IQ4_XS"),
    ("llama.cpp IQ4_XS + importance matrix", "llama.cpp IQ4_XS-imatrix (quantized from the reference)", None,
     "llama.cpp IQ4_XS-imatrix"),
]


def md_rows(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in path.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| config") and "---" not in line]


def short(label: str) -> str:
    """A label without its model folder and batch: '<folder>@int4 g32 b=8' -> 'int4 g32'."""
    label = re.sub(r" b=\d+$", "", label)
    label = re.sub(r" \(/[^)]*\)$", "", label)
    return label.split("@", 1)[1] if "@" in label and label.startswith("/") else label.replace(
        " (qwen2.5-coder-1.5b-seed0)", "")


def accuracy() -> dict:
    """short label -> {solved, lost, gained, p, gen, usd, from}: pairs from paired.txt, speed and $ from the runs."""
    out = {}
    for path in ACCURACY_MD:
        for c in md_rows(path):
            out.setdefault(short(c[0]), {}).update(
                gen=float(c[10]), usd=float(c[11]), **{"from": str(path.relative_to(DAY.parent))})
    line = re.compile(r"^(?P<label>.+?): (?P<k>\d+)/164 .* lost (?P<lost>\d+) gained (?P<gained>\d+) "
                      r"McNemar p (?P<p>\S+)$")
    for text in (HERE / "paired.txt").read_text().splitlines():
        m = line.match(text)
        if m and m["p"] != "nan":
            out.setdefault(short(m["label"]), {}).update(solved=int(m["k"]), lost=int(m["lost"]),
                                                         gained=int(m["gained"]), p=float(m["p"]))
    return out


def speeds(folder: Path) -> dict:
    return {short(c[0]): float(c[1]) for c in md_rows(folder / "peers.md")
            if c[1] not in ("", "–", "None") and c[-1] == "ok"}


def main() -> None:
    q = json.loads((HERE / "merged" / "quality_matched.json").read_text())["rows"]
    acc = accuracy()
    passes = [sp for sp in (speeds(HERE / f"speed-{i}") for i in range(1, 10)) if sp.get(BASE)]
    print("| config | KLD median | p99 | same top-1 | weight MB | pass@1 (of 164) | lost / gained | McNemar p "
          f"| gen tok/s (batch 8) | $/1,000 solved | single-stream tok/s, median of {len(passes)} passes "
          "| vs llama.cpp Q4_K_M, median | range |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, ql, al, sl in ROWS:
        r, a = q.get(ql, {}), acc.get(al or "", {})
        tok = [sp[sl] for sp in passes if sl in sp]
        ratio = [sp[sl] / sp[BASE] for sp in passes if sl in sp]
        cells = [name,
                 f"{r['kld_median']:.5f}" if "kld_median" in r else "",
                 f"{r['kld_p99']:.4f}" if "kld_p99" in r else "",
                 f"{r['top1_agreement']:.2%}" if "top1_agreement" in r else "",
                 f"{r['weight_bytes'] / 1e6:,.0f}" if r.get("weight_bytes") else "",
                 f"{a['solved']} ({a['solved'] / 164:.1%})" if "solved" in a else "not run",
                 f"{a['lost']} / {a['gained']}" if "lost" in a else "",
                 f"{a['p']:.3g}" if "p" in a else "",
                 f"{a['gen']:.1f}" if "gen" in a else "", f"{a['usd']:.3f}" if "usd" in a else "",
                 f"{statistics.median(tok):.2f}" if tok else "",
                 f"{statistics.median(ratio):.2f}" if ratio else "",
                 f"{min(ratio):.2f}-{max(ratio):.2f}" if ratio else ""]
        print("| " + " | ".join(cells) + " |")
    print("\nfp32 (session 17, the unpermuted 1.5B: the same function): 87/164 solved. Accuracy runs: "
          + "; ".join(sorted({a["from"] for a in acc.values() if "from" in a})) + ".")


if __name__ == "__main__":
    main()
