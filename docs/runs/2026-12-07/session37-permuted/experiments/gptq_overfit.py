"""Is GPTQ overfitting its 8,192 calibration tokens? Per linear: output error on calibration vs held-out eval inputs."""
import sys, time
sys.path.insert(0, "/work/main")
import torch
from engine.infer.loader import load, load_tokenizer
from engine.infer.calibrate import calibration_docs
from engine.measure.eval_text import eval_docs
from engine.quant.gptq import gptq_quantize, group_grid, rtn_codes, dequantize_codes
P = "/root/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0"
tok = load_tokenizer(P)
cal = calibration_docs(tok)
ev = [list(d.ids) for d in eval_docs(tok, 2048)]
lm = load(P, "fp32", "cpu")
m = lm.model
names = ["model.layers.2.mlp.down_proj", "model.layers.14.mlp.down_proj", "model.layers.14.mlp.gate_proj",
         "model.layers.14.self_attn.q_proj", "model.layers.26.mlp.down_proj", "lm_head"]
mods = dict(m.named_modules())
def grams(docs):
    acc = {n: 0 for n in names}
    cnt = 0
    hs = [mods[n].register_forward_pre_hook(lambda mod, inp, n=n: acc.__setitem__(n, acc[n] + (lambda x: x.T @ x)(inp[0].reshape(-1, inp[0].shape[-1]).double()))) for n in names]
    with torch.no_grad():
        for d in docs:
            t = torch.tensor([d])
            m(t, 0, m.new_cache(1, len(d) + 1))
            cnt += len(d)
    for h in hs: h.remove()
    return {n: (acc[n] / cnt).float() for n in names}
t = time.time(); Hc = grams(cal); He = grams(ev); print("grams", round(time.time() - t), flush=True)
def err(w, dq, H):
    d = w - dq
    return float(((d @ H) * d).sum() / ((w @ H) * w).sum())
for n in names:
    w = mods[n].weight.data.float()
    s, mn = group_grid(w, 32)  # RTN-searched grid, unweighted
    rtn = dequantize_codes(rtn_codes(w, s, mn), s, mn)
    s2, m2 = group_grid(w, 32, importance=Hc[n].diagonal())
    rtnw = dequantize_codes(rtn_codes(w, s2, m2), s2, m2)
    res = {"rtn-search": rtn, "rtn-search-Hdiag": rtnw}
    for damp in (0.01, 0.1):
        q, sc, mi = gptq_quantize(w, Hc[n], 32, damp=damp)
        res[f"gptq damp {damp}"] = dequantize_codes(q, sc, mi)
    print(n, " | ".join(f"{k}: cal {err(w, v, Hc[n]):.5f} eval {err(w, v, He[n]):.5f}" for k, v in res.items()), flush=True)
