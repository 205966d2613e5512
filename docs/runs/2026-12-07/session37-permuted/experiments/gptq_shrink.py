"""GPTQ's Hessian from 8,192 calibration tokens: damping and shrinkage toward its diagonal, held-out error."""
import os, sys, time
sys.path.insert(0, "/work/main")
import torch
from engine.quant.gptq import gptq_quantize, group_grid, rtn_codes, dequantize_codes
G = "/tmp/grams.pt"
names = ["model.layers.2.mlp.down_proj", "model.layers.14.mlp.down_proj", "model.layers.14.mlp.gate_proj",
         "model.layers.14.self_attn.q_proj", "model.layers.14.self_attn.o_proj", "model.layers.26.mlp.down_proj", "lm_head"]
if not os.path.exists(G):
    from engine.infer.loader import load, load_tokenizer
    from engine.infer.calibrate import calibration_docs
    from engine.measure.eval_text import eval_docs
    P = "/root/.cache/serving-cost-lab/permuted/qwen2.5-coder-1.5b-seed0"
    tok = load_tokenizer(P)
    cal = calibration_docs(tok)
    ev = [list(d.ids) for d in eval_docs(tok, 2048)]
    lm = load(P, "fp32", "cpu")
    m = lm.model
    mods = dict(m.named_modules())
    def grams(docs):
        acc = {n: 0 for n in names}
        cnt = 0
        def hook(mod, inp, n):
            x = inp[0].reshape(-1, inp[0].shape[-1])
            acc[n] = acc[n] + x.T @ x
        hs = [mods[n].register_forward_pre_hook(lambda mod, inp, n=n: hook(mod, inp, n)) for n in names]
        with torch.no_grad():
            for d in docs:
                m(torch.tensor([d]), 0, m.new_cache(1, len(d) + 1))
                cnt += len(d)
        for h in hs: h.remove()
        return {n: acc[n] / cnt for n in names}
    t = time.time()
    torch.save({"cal": grams(cal), "eval": grams(ev), "w": {n: mods[n].weight.data.clone() for n in names}}, G)
    print("grams", round(time.time() - t), flush=True)
    del lm, m, mods
d = torch.load(G)
def err(w, dq, H):
    x = w - dq
    return float(((x @ H) * x).sum() / ((w @ H) * w).sum())
for n in names:
    w, Hc, He = d["w"][n].float(), d["cal"][n], d["eval"][n]
    s2, m2 = group_grid(w, 32, importance=Hc.diagonal())
    res = {"Hdiag grid": dequantize_codes(rtn_codes(w, s2, m2), s2, m2)}
    for lam in (0.0, 0.25, 0.5):
        for damp in (0.01, 0.1):
            H = (1 - lam) * Hc + lam * torch.diag(Hc.diagonal())
            q, sc, mi = gptq_quantize(w, H, 32, damp=damp)
            res[f"shrink {lam} damp {damp}"] = dequantize_codes(q, sc, mi)
    print(n, w.shape[1], " | ".join(f"{k}: {err(w, v, He):.5f}" for k, v in res.items()), flush=True)
