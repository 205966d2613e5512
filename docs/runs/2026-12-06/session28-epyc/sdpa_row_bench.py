import time, torch, torch.nn.functional as F
torch.manual_seed(0)
H, KV, D, m = 14, 2, 64, 257
for dt in (torch.bfloat16, torch.float32):
    q = torch.randn(1, H, 1, D).to(dt); k = torch.randn(1, KV, m, D).to(dt); v = torch.randn(1, KV, m, D).to(dt)
    def sdpa(): return F.scaled_dot_product_attention(q, k, v, scale=0.125, enable_gqa=True)
    def manual():
        g = H // KV
        qf = q.float().reshape(KV, g, D); kf = k[0].float(); vf = v[0].float()
        s = torch.bmm(qf, kf.transpose(1, 2)) * 0.125
        p = torch.softmax(s, dim=-1)
        return torch.bmm(p, vf).reshape(1, H, 1, D).to(dt)
    for f in (sdpa, manual):
        for _ in range(20): f()
        t = time.perf_counter()
        for _ in range(200): f()
        print(dt, f.__name__, f"{(time.perf_counter()-t)/200*1e6:.1f} us")
    print("maxdiff", (sdpa().float() - manual().float()).abs().max().item())
