"""frontier.json (frontier.py) and policy.json (policy.py) as one markdown table beside llama.cpp's rows of the same
2,048 tokens, then kinds.json (kinds.py): what each kind of linear at int8 buys against all-int4 GPTQ g32.

llama.cpp's bytes per token: its GGUF's tensors but token_embd (a lookup reads one row; output.weight is a tensor of
its own in this GGUF). Quality-matched: KLD median and p99 no higher, same top-1 no lower than the row named.
Usage (repository root): .venv/bin/python docs/runs/2026-12-07/session41-g128/frontier_table.py
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from engine.quant.gguf_file import read_gguf  # noqa: E402

HERE = Path(__file__).parent
S40 = ROOT / "docs/runs/2026-12-07/session40-offgrid-table/merged/quality_matched.json"
LLAMA = {"llama.cpp Q4_K_M (requantized from the reference)": "model-Q4_K_M.gguf",
         "llama.cpp Q4_K_M-imatrix (quantized from the reference)": "model-Q4_K_M-imatrix.gguf"}


def gguf_bytes_per_token(path: Path) -> int:
    g = read_gguf(path)
    return sum(t.data.nbytes for name, t in g.tensors.items() if name != "token_embd.weight")


def matched(r: dict, t: dict) -> bool:
    return (r["kld_median"] <= t["kld_median"] and r["kld_p99"] <= t["kld_p99"]
            and r["top1_agreement"] >= t["top1_agreement"])


def main() -> None:
    s40 = json.loads(S40.read_text())
    folder = Path(s40["gguf"]["Q4_K_M"]).parent
    targets = {k: s40["rows"][k] | {"bytes_per_token": gguf_bytes_per_token(folder / f)} for k, f in LLAMA.items()}
    q4 = targets["llama.cpp Q4_K_M (requantized from the reference)"]
    im = targets["llama.cpp Q4_K_M-imatrix (quantized from the reference)"]
    print("| config | int8 budget | int8 linears | KLD median | p99 | same top-1 | MB per token | Q4_K_M's bytes / "
          "these | matched: Q4_K_M | Q4_K_M + matrix |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | :---: |")
    for k, t in targets.items():
        print(f"| {k} (session 40's run) | | | {t['kld_median']:.5f} | {t['kld_p99']:.4f} | {t['top1_agreement']:.2%} "
              f"| {t['bytes_per_token'] / 1e6:,.0f} | {q4['bytes_per_token'] / t['bytes_per_token']:.2f} | | |")
    yes = {True: "yes", False: "no"}
    rows = json.loads((HERE / "frontier.json").read_text()) + json.loads((HERE / "policy.json").read_text())
    for r in rows:
        print(f"| ours {r['precision']} | {r['budget']:.2f} | {(r['calibration'] or {}).get('int8_linears', 0)} | "
              f"{r['kld_median']:.5f} | {r['kld_p99']:.4f} | {r['top1_agreement']:.2%} | "
              f"{r['bytes_per_token'] / 1e6:,.0f} | {q4['bytes_per_token'] / r['bytes_per_token']:.2f} | "
              f"{yes[matched(r, q4)]} | {yes[matched(r, im)]} |")
    base = next(r for r in rows if r["group_size"] == 32 and r["budget"] == 0 and "kinds" not in r["precision"])
    print()
    print("| at int8 (the rest GPTQ g32) | extra MB per token | KLD median | change per 100 MB | p99 "
          "| change per 100 MB "
          "| same top-1 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| none | 0 | {base['kld_median']:.5f} | | {base['kld_p99']:.4f} | | {base['top1_agreement']:.2%} |")
    for r in json.loads((HERE / "kinds.json").read_text()):
        mb = (r["bytes_per_token"] - base["bytes_per_token"]) / 1e6
        print(f"| every {r['int8_kind']} | {mb:,.0f} | {r['kld_median']:.5f} | "
              f"{100 * (r['kld_median'] - base['kld_median']) / mb:+.5f} | {r['kld_p99']:.4f} | "
              f"{100 * (r['kld_p99'] - base['kld_p99']) / mb:+.4f} | {r['top1_agreement']:.2%} |")


if __name__ == "__main__":
    main()
