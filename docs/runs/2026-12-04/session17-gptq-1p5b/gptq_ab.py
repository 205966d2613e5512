"""GPTQ calibration before and after session 17's speed-ups, in one run on one machine: two decoder layers of the
1.5B's shape (hidden 1536, MLP 8960, 12 heads, 2 KV heads; random weights, built offline with transformers), the
same 16 documents of 512 random token ids (8,192 calibration positions, the default), torch's threads as set.

    .venv/bin/python gptq_ab.py <checkout before> <checkout after> [more checkouts...]

Each checkout runs in a fresh process, in the order given, then again in reverse (the host drifts); prints the
seconds of engine.infer.calibrate.calibrate and the relative output error it found for each linear, whose
agreement shows the two compute the same thing.
"""
import json
import os
import subprocess
import sys

FOLDER = "/tmp/gptq-ab-qwen1p5-shape"
CHILD = r'''
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from engine.infer.model import build_model
from engine.infer import calibrate as C
from engine.quant import make_spec
model = build_model(sys.argv[2])
g = torch.Generator().manual_seed(0)
docs = [torch.randint(0, 2048, (512,), generator=g).tolist() for _ in range(16)]
t0 = time.perf_counter()
codes, errors, _ = C.calibrate(model, make_spec("int4-gptq-g32"), docs)
print(json.dumps({"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads(), "errors": errors}))
'''


def build() -> None:
    if os.path.exists(f"{FOLDER}/config.json"):
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", hidden_size=1536, intermediate_size=8960, num_attention_heads=12,
                               num_key_value_heads=2, num_hidden_layers=2, vocab_size=2048,
                               max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(FOLDER)


def main() -> None:
    build()
    trees = sys.argv[1:]
    out = {}
    for tree in trees + trees[::-1]:
        p = subprocess.run([sys.executable, "-c", CHILD, tree, FOLDER], capture_output=True, text=True, check=True)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        out.setdefault(tree, []).append(r)
        print(f"{tree}: {r['seconds']:.1f} s ({r['threads']} threads)", flush=True)
    first = trees[0]
    for tree in trees[1:]:
        a, b = out[first][0]["errors"], out[tree][0]["errors"]
        worst = max(abs(a[k] - b[k]) / a[k] for k in a)
        mean = lambda t: sum(r["seconds"] for r in out[t]) / len(out[t])  # noqa: E731
        print(f"{tree} against {first}: {mean(first) / mean(tree):.2f}x faster (mean of {len(out[tree])} each); "
              f"relative output errors agree within {worst:.2%} (largest relative difference of {len(a)} linears)")


if __name__ == "__main__":
    main()
