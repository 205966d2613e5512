import torch, sys
sys.path.insert(0, "/work/main")
from engine.quant.gptq import gptq_quantize, group_grid, rtn_codes, dequantize_codes
def layer(seed=0, N=96, K=256, T=2048):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(K, K, generator=g) / K ** 0.5
    scale = torch.exp(torch.randn(K, generator=g))
    W = torch.randn(N, K, generator=g) * 0.05
    X = (torch.randn(T, K, generator=g) @ mix) * scale
    Xe = (torch.randn(4096, K, generator=g) @ mix) * scale
    return W, X, Xe
for K, T in ((256, 2048), (512, 256), (1024, 512)):
    W, X, Xe = layer(K=K, T=T)
    H = X.T @ X / T
    err = lambda Wq, Z: float(((Z @ (W - Wq).T) ** 2).mean())
    s, m = group_grid(W, 32, H.diagonal()); sg = dequantize_codes(rtn_codes(W, s, m), s, m)
    out = {"grid": sg}
    for sh, dp in ((0.0, 0.01), (0.25, 0.1)):
        q, s2, m2 = gptq_quantize(W, H, 32, damp=dp, shrink=sh); out[f"gptq {sh}/{dp}"] = dequantize_codes(q, s2, m2)
    print(K, T, {k: (round(err(v, X), 5), round(err(v, Xe), 5)) for k, v in out.items()})
from engine.ops.formats import dequantize_int4, quantize_int4
sys.path.insert(0, "/work/main")
from tests.test_calibrated import _held_out_layer
for K, T in ((256, 2048), (512, 256)):
    W, X, Xe = _held_out_layer(K, T)
    print(K, T, "rtn", float(((Xe @ (W - dequantize_int4(*quantize_int4(W, 32), K)).T) ** 2).mean()))
