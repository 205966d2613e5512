"""Where the AWQ checkpoint's decode time goes: its unquantized fp32 head against the int4 blocks (one stream)."""
import os, time, torch
from engine.infer.loader import load
folder = os.path.expanduser("~/.cache/serving-cost-lab/awq/qwen2.5-coder-1.5b-g32")
for prec in ("int4-checkpoint-g32",):
    lm = load(folder, prec, "cpu")
    print(prec, "weights MB by part:", {k: round(v / 1e6) for k, v in lm.weights.items()})
    m = lm.model
    cache = m.new_cache(1, 256)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        m(ids, 0, cache)
        tok = torch.tensor([[5]])
        t = time.perf_counter(); n = 32
        for i in range(n):
            m(tok, 4 + i, cache)
        step = (time.perf_counter() - t) / n
        h = m.lm_head.weight
        x = torch.randn(1, h.shape[1])
        t = time.perf_counter()
        for _ in range(n):
            torch.nn.functional.linear(x, h)
        head = (time.perf_counter() - t) / n
    print(f"{prec}: decode step {step * 1e3:.1f} ms, of which the head ({h.dtype}, {tuple(h.shape)}) "
          f"{head * 1e3:.1f} ms = {head / step:.0%}")
