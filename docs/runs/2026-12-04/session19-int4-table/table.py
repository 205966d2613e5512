"""Issue 36's one table for the 1.5B, assembled from the raw outputs it cites (nothing typed in):

- KLD median / p99 / same top-1 and weight MB: merged/quality_matched.json (run.sh: six runs on the same 2,048 tokens
  and the same fp32 reference);
- pass@1 on all 164 HumanEval problems, greedy, paired against the same fp32 outcomes (87/164): paired.txt files
  (paired.py) and, for the runs of 2026-12-02 and session 16, their own tables (paired against fp32 in that run);
- single-stream tok/s and the ratio to llama.cpp's Q4_K_M (the shipped file) within each pass: speed1/, speed2/;
- $ per 1,000 solved: engine.common.formulas.usd_per_thousand_solved at pass 1's single-stream speed, the
  placeholder $0.10/hour, and the tokens that configuration generated on the 164 problems (its accuracy record; for
  the 2026-12-02 and session 16 runs, derived from their tables' own gen tok/s and $/1k solved, three digits each).

    PYTHONPATH=. .venv/bin/python docs/runs/2026-12-04/session19-int4-table/table.py > .../table.md
"""
import json
import re
from pathlib import Path

from engine.common.formulas import usd_per_million_tokens, usd_per_thousand_solved

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent
PRICE = 0.10
ACC_0212 = RUNS.parent / "2026-12-02-accuracy-1p5b" / "accuracy-full.md"
ACC_S16 = RUNS / "session16-1p5b" / "accuracy" / "accuracy-full.md"
PAIRED = [RUNS / "session18-gptq-code-calibration" / "paired.txt", RUNS / "session18-awq-mixed" / "paired.txt",
          HERE / "paired.txt"]
RECORDS = [HERE / "accuracy-records-s17-s18.json", HERE / "accuracy-records-s19.json"]

# (row, quality label, accuracy label, speed label)
ROWS = [
    ("ours int8", "ours int8", "default@int8", "serving-cost-lab int8"),
    ("ours int4 g32, round-to-nearest", "ours int4-g32", "default@int4 g32", "serving-cost-lab int4 g32"),
    ("ours int4 g64, round-to-nearest", "ours int4-g64", "default@int4", "serving-cost-lab int4"),
    ("ours int4 g32, GPTQ", "ours int4-gptq-g32", "default@int4 gptq g32", "serving-cost-lab int4 gptq g32"),
    ("ours int4 g128, GPTQ", "ours int4-gptq-g128", "default@int4 gptq g128", "serving-cost-lab int4 gptq g128"),
    ("ours int4 g32, AWQ", "ours int4-awq-g32", "default@int4 awq g32", "serving-cost-lab int4 awq g32"),
    ("ours int4 g32, GPTQ mixed", "ours int4-gptq-mixed-g32", "default@int4 gptq-mixed g32",
     "serving-cost-lab int4 gptq-mixed g32"),
    ("ours int4-gguf g32 (the shipped file's blocks)", "ours int4-gguf-g32", "default@int4 gguf g32",
     "serving-cost-lab int4 gguf g32"),
    ("llama.cpp Q4_K_M, shipped (the reference's own weights)", "llama.cpp Q4_K_M (shipped: its own weights)",
     "llama-server Q4_K_M", "llama.cpp Q4_K_M"),
    ("llama.cpp Q4_K_M, requantized", "llama.cpp Q4_K_M (requantized from the reference)", None, None),
    ("llama.cpp Q4_K_M + importance matrix", "llama.cpp Q4_K_M-imatrix (quantized from the reference)",
     "llama-server Q4_K_M-imatrix", "llama.cpp Q4_K_M-imatrix"),
    ("llama.cpp IQ4_XS", "llama.cpp IQ4_XS (quantized from the reference)", None, "llama.cpp IQ4_XS"),
    ("llama.cpp IQ4_XS + importance matrix", "llama.cpp IQ4_XS-imatrix (quantized from the reference)",
     "llama-server IQ4_XS-imatrix", "llama.cpp IQ4_XS-imatrix"),
]


def md_rows(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in path.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| config") and "---" not in line]


def accuracy() -> dict:
    """label -> {solved, lost, gained, p, tokens}."""
    out = {}
    for path in (ACC_0212, ACC_S16):
        for c in md_rows(path):
            label = re.sub(r" b=\d+$", "", c[0]).replace(" (qwen2.5-coder-1.5b)", "")
            solved = int(c[1].split("/")[0])
            tok_s, usd = float(c[10]), float(c[11])
            tokens = usd * solved / 1000 * 1e6 / usd_per_million_tokens(tok_s, PRICE)  # the formula inverted
            out[label] = {"solved": solved, "lost": None if c[4] == "reference" else int(c[4]),
                          "gained": None if c[4] == "reference" else int(c[5]),
                          "p": None if c[4] == "reference" else float(c[6]), "tokens": tokens,
                          "from": str(path.relative_to(RUNS.parent))}
    line = re.compile(r"^(?P<label>.+?): (?P<k>\d+)/164 .* lost (?P<lost>\d+) gained (?P<gained>\d+) "
                      r"McNemar p (?P<p>\S+)$")
    for path in PAIRED:
        for text in (path.read_text().splitlines() if path.exists() else []):
            m = line.match(text)
            if m and m["p"] != "nan":
                out[m["label"]] = {"solved": int(m["k"]), "lost": int(m["lost"]), "gained": int(m["gained"]),
                                   "p": float(m["p"]), "from": str(path.relative_to(RUNS.parent))}
    for path in RECORDS:
        for r in (json.loads(path.read_text()) if path.exists() else []):
            label = re.sub(r" b=\d+$", "", r["label"])
            if label in out and out[label]["solved"] == r["solved"]:  # the run the pairs came from
                out[label]["tokens"] = r["new_tokens"]
    return out


def speeds(folder: Path) -> dict:
    rows = md_rows(folder / "peers.md")
    return {c[0]: float(c[1]) for c in rows if c[1] not in ("", "–", "None") and c[-1] == "ok"}


def main() -> None:
    q = json.loads((HERE / "merged" / "quality_matched.json").read_text())["rows"]
    acc = accuracy()
    s1, s2 = speeds(HERE / "speed1"), speeds(HERE / "speed2")
    base1, base2 = s1.get("llama.cpp Q4_K_M"), s2.get("llama.cpp Q4_K_M")
    print("| config | KLD median | p99 | same top-1 | weight MB | pass@1 (of 164) | lost / gained | McNemar p "
          "| tok/s, pass 1 | vs llama.cpp Q4_K_M | tok/s, pass 2 | vs llama.cpp Q4_K_M | $/1,000 solved |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, ql, al, sl in ROWS:
        r, a = q.get(ql, {}), acc.get(al or "", {})
        t1, t2 = s1.get(sl or ""), s2.get(sl or "")
        usd = (usd_per_thousand_solved(t1, round(a["tokens"]), a["solved"], PRICE)
               if t1 and a.get("tokens") else None)
        cells = [name,
                 f"{r['kld_median']:.5f}" if "kld_median" in r else "",
                 f"{r['kld_p99']:.4f}" if "kld_p99" in r else "",
                 f"{r['top1_agreement']:.2%}" if "top1_agreement" in r else "",
                 f"{r['weight_bytes'] / 1e6:,.0f}" if r.get("weight_bytes") else "",
                 f"{a['solved']} ({a['solved'] / 164:.1%})" if a else "not run",
                 f"{a['lost']} / {a['gained']}" if a.get("lost") is not None else "",
                 f"{a['p']:.3g}" if a.get("p") is not None else "",
                 f"{t1:.2f}" if t1 else "", f"{t1 / base1:.2f}" if t1 and base1 else "",
                 f"{t2:.2f}" if t2 else "", f"{t2 / base2:.2f}" if t2 and base2 else "",
                 f"{usd:.4f}" if usd else ""]
        print("| " + " | ".join(cells) + " |")
    print("\nfp32 (the reference, the shipped Q4_K_M dequantized): 87/164 solved. Sources: "
          + "; ".join(sorted({a["from"] for a in acc.values()})) + ".")


if __name__ == "__main__":
    main()
