#!/usr/bin/env bash
# One prepared GPU check for the CUDA kernels (kernels/cuda), for an H100/H200 session.
#
#   OUT=/some/dir bash bench/gpu_kernels.sh            # ~3-5 min incl. the extension build
#   PYTHON=/path/to/python OUT=... bash bench/gpu_kernels.sh
#
# Needs a CUDA build of torch (and nvcc) on the GPU machine; the CPU-only venv of the
# dev box is useless there.  What it does, in one python process:
#   1. builds the CUDA extension through engine/ops/build.py (torch.utils.cpp_extension);
#   2. correctness: every kernel (int8, int4 gs 32/64/128; fp32/fp16/bf16 activations;
#      M = 1..32, odd N/K to hit tails and the non-vector path) against a bf16 reference
#      (relative Frobenius error < 1e-2) and an fp32 reference; the output buffer is
#      filled with NaN before every run, so unwritten outputs fail; also the engine API
#      (3-D input, bias, the M > 32 torch path) and the verifier: ops.verify_drafts (the
#      fused CUDA kernel) vs ops.verify_drafts_torch, with draft probs and deterministic
#      (draft_probs None), and the engine's verify() on CUDA;
#   3. timing with CUDA events, weights rotated through copies > 4x L2 (cold L2):
#      ours (bf16 activations) vs torch bf16 F.linear and bitsandbytes int8 / nf4
#      (if importable) for the 1.5B model's projection shapes at M = 1, 5, 16;
#      the fused verify kernel vs the torch implementation;
#   4. prints markdown tables and writes $OUT/gpu_kernels.{md,json,log}.
# Exit status is non-zero if any correctness check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export SCL_KERNEL_CACHE="${SCL_KERNEL_CACHE:-/tmp/scl_kernel_cache}"
export MAX_JOBS="${MAX_JOBS:-8}"
(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true) \
  > "$OUT/nvidia_smi.txt" 2>&1
"$PY" - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/gpu_kernels.log"
import json, math, os, sys, time, traceback
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
from engine import ops as K  # noqa: E402

OUT = Path(sys.argv[1])
assert torch.cuda.is_available(), "no CUDA device"
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(dev)
print(f"# GPU kernel check on {props.name}, {props.total_memory / 2**30:.0f} GiB, "
      f"sm_{props.major}{props.minor}, torch {torch.__version__}, CUDA {torch.version.cuda}")

t0 = time.time()
ext = K.load_cuda_extension(raise_errors=True)
print(f"- CUDA extension built/loaded in {time.time() - t0:.0f} s; backend_info: {K.backend_info()}")
results = {"device": props.name, "torch": torch.__version__, "checks": [], "timing": [], "verify": []}
failures = []
g = torch.Generator(device="cuda").manual_seed(0)
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def relerr(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ------------------------------------------------------------------ correctness
def check_gemm(fmt, N, Kd, gs, dtname, Ms):
    w = torch.randn(N, Kd, device=dev, generator=g) * 0.05
    if fmt == "int8":
        q, s = K.quantize_int8(w)
        p = K.prepare_int8(q, s)
        wd = K.dequantize_int8(q, s)
    else:
        pk, sc, mn = K.quantize_int4(w, gs)
        p = K.prepare_int4(pk, sc, mn, Kd, gs)
        wd = K.dequantize_int4(pk, sc, mn, Kd)
    dt = DT[dtname]
    stream = torch.cuda.current_stream().cuda_stream
    for M in Ms:
        x = torch.randn(M, Kd, device=dev, generator=g).to(dt)
        bias = torch.randn(N, device=dev, generator=g).to(dt) if M % 2 else None
        out = torch.full((M, N), float("nan"), device=dev, dtype=dt)
        if fmt == "int8":
            ext.int8_gemm(x, p.w, p.scale, bias, Kd, stream, out)
        else:
            ext.int4_gemm(x, p.w, p.sm, bias, Kd, gs, stream, out)
        torch.cuda.synchronize()
        ref16 = x.bfloat16() @ wd.bfloat16().T
        ref32 = x.float() @ wd.T
        if bias is not None:
            ref16 = ref16 + bias.bfloat16()
            ref32 = ref32 + bias.float()
        finite = bool(torch.isfinite(out).all())
        e16, e32 = relerr(out, ref16), relerr(out, ref32)
        ok = finite and e16 < 1e-2 and e32 < 1e-2
        rec = dict(fmt=fmt, N=N, K=Kd, gs=gs, dtype=dtname, M=M, finite=finite, rel_bf16=e16,
                   rel_fp32=e32, ok=ok)
        results["checks"].append(rec)
        if not ok:
            failures.append(rec)
            print("FAIL", rec)


t0 = time.time()
SHAPES = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (130, 1543), (7, 100), (33, 37),
          (64, 4096 + 40)]
MS = [1, 2, 3, 5, 8, 9, 16, 17, 32]
for (N, Kd) in SHAPES:
    for dtname in ("bf16", "fp16", "fp32"):
        check_gemm("int8", N, Kd, 0, dtname, MS)
        for gs in (32, 64, 128):
            check_gemm("int4", N, Kd, gs, dtname, MS if gs == 64 else [1, 5, 17])
check_gemm("int8", 151936, 1536, 0, "bf16", [1, 5])
check_gemm("int4", 151936, 1536, 128, "bf16", [1, 5])
nchk = len(results["checks"])
worst16 = max(r["rel_bf16"] for r in results["checks"])
worst32 = max(r["rel_fp32"] for r in results["checks"])
print(f"- gemm correctness: {nchk - len(failures)}/{nchk} ok, worst rel err vs bf16 ref {worst16:.2e}, "
      f"vs fp32 ref {worst32:.2e} ({time.time() - t0:.0f} s)")

# engine API on CUDA: 3-D input, bias, dtype, and the M > 32 torch path
try:
    for fmt in ("int8", "int4"):
        w = torch.randn(300, 1000, device=dev, generator=g) * 0.05
        if fmt == "int8":
            q, s = K.quantize_int8(w); p = K.prepare_int8(q, s); wd = K.dequantize_int8(q, s)
            fn = K.int8_linear
        else:
            pk, sc, mn = K.quantize_int4(w, 64); p = K.prepare_int4(pk, sc, mn, 1000, 64)
            wd = K.dequantize_int4(pk, sc, mn, 1000); fn = K.int4_linear
        for shape in ((1, 1, 1000), (2, 3, 1000), (64, 1000)):
            x = torch.randn(*shape, device=dev, generator=g).bfloat16()
            b = torch.randn(300, device=dev, generator=g)
            y = fn(x, p, b)
            ref = x.float() @ wd.T + b
            e = relerr(y, ref)
            ok = y.shape == (*shape[:-1], 300) and y.dtype == torch.bfloat16 and e < 1e-2
            if not ok:
                failures.append(dict(api=fmt, shape=shape, err=e)); print("FAIL api", fmt, shape, e)
    print("- engine API on CUDA ok" if not any("api" in f for f in failures) else "- engine API FAILED")
except Exception:
    traceback.print_exc(); failures.append(dict(api="exception"))

# verification: the CUDA kernel (ops.verify_drafts on CUDA) vs the torch implementation of the same rule
t0 = time.time()
mism = total = 0
for V in (1000, 32000, 151936):
    for gamma in (0, 1, 4, 8):
        for dtname in ("fp32", "bf16"):
            for deterministic in (False, True):
                B = 64
                logits_t = torch.randn(B, gamma + 1, V, device=dev, generator=g) * 3
                tp = torch.softmax(logits_t, -1)
                dp = torch.softmax(logits_t[:, :gamma] + torch.randn(B, gamma, V, device=dev, generator=g), -1)
                toks = (torch.multinomial(dp.reshape(-1, V).float(), 1, generator=g).view(B, gamma)
                        if gamma else torch.zeros(B, 0, dtype=torch.int64, device=dev))
                u = torch.rand(B, gamma + 1, device=dev, generator=g)
                tp, dp = tp.to(DT[dtname]), (None if deterministic else dp.to(DT[dtname]))
                n_k, t_k = K.verify_drafts(tp, dp, toks, u)
                n_r, t_r = K.verify_drafts_torch(tp, dp, toks, u)
                mm = int(((n_k != n_r) | (t_k != t_r)).sum())
                mism += mm; total += B
                results["verify"].append(dict(V=V, gamma=gamma, dtype=dtname, deterministic=deterministic, B=B,
                                              mismatches=mm))
vok = mism == 0
if not vok:
    failures.append(dict(verify_mismatches=mism))
print(f"- verify_drafts: CUDA kernel {total - mism}/{total} identical to the torch implementation "
      f"({time.time() - t0:.0f} s)")
# the engine's verifier on CUDA (sampling and greedy) runs without error and agrees with the torch rule
try:
    from engine.infer.sampling import SamplingParams
    from engine.infer.verify import verify
    B, gamma, V = 4, 4, 151936
    tp = torch.softmax(torch.randn(B, gamma + 1, V, device=dev, generator=g) * 3, -1)
    dp = torch.softmax(torch.randn(B, gamma, V, device=dev, generator=g) * 3, -1)
    toks = torch.multinomial(dp.reshape(-1, V), 1, generator=g).view(B, gamma)
    for q in (dp, None):
        a, nx = verify(tp, q, toks, SamplingParams(temperature=1.0, seed=1),
                       torch.Generator(device="cuda").manual_seed(1))
        u = torch.rand((B, gamma + 1), generator=torch.Generator(device="cuda").manual_seed(1), device=dev)
        a_r, nx_r = K.verify_drafts_torch(tp, q, toks, u)
        if not (torch.equal(a, a_r) and torch.equal(nx, nx_r)):
            failures.append(dict(engine_verify="differs from the torch rule", deterministic=q is None))
    verify(tp, None, toks, SamplingParams(), None)
    print("- engine verify() on CUDA ok" if not any("engine_verify" in f for f in failures)
          else "- engine verify() on CUDA FAILED")
except Exception:
    traceback.print_exc(); failures.append(dict(engine_verify="exception"))


# ------------------------------------------------------------------ timing
def bench(fn, argsets, iters=None):
    """ms per call, cycling through argsets (cold L2), CUDA events, median of 5."""
    for a in argsets[:2]:
        fn(*a)
    torch.cuda.synchronize()
    n = len(argsets)
    iters = iters or max(n, 50)
    ts = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(iters):
            fn(*argsets[i % n])
        e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / iters)
    ts.sort()
    return ts[2]


l2 = getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20
FLUSH = max(4 * l2, 256 * 2**20)
x = torch.empty(2**29, dtype=torch.bfloat16, device=dev).uniform_()   # 1 GiB
bw_read = 2**30 / (bench(lambda t: t.sum(), [(x,)], 20) / 1e3) / 1e9
y = torch.empty_like(x)
bw_copy = 2 * 2**30 / (bench(lambda a, b: b.copy_(a), [(x, y)], 20) / 1e3) / 1e9
del x, y
print(f"- measured HBM bandwidth: read (sum) {bw_read:.0f} GB/s, copy (r+w) {bw_copy:.0f} GB/s")
results["bw_read_gbps"], results["bw_copy_gbps"] = bw_read, bw_copy

try:
    import bitsandbytes as bnb  # noqa: F401
    have_bnb = True
except Exception as e:  # noqa: BLE001
    have_bnb = False
    print(f"- bitsandbytes not importable ({type(e).__name__}); skipping its columns")

TSHAPES = [("q/o_proj", 1536, 1536), ("k/v_proj", 256, 1536), ("gate/up", 8960, 1536),
           ("down", 1536, 8960), ("lm_head", 151936, 1536), ("4096^2", 4096, 4096)]
rows = []
for name, N, Kd in TSHAPES:
    w = torch.randn(N, Kd, device=dev, generator=g) * 0.02
    q, s = K.quantize_int8(w); p8 = K.prepare_int8(q, s); del q
    pk, sc, mn = K.quantize_int4(w, 128); p4 = K.prepare_int4(pk, sc, mn, Kd, 128); del pk
    wb = w.bfloat16()
    cands = {}
    ncp = lambda nb: max(1, min(64, math.ceil(FLUSH / nb)))  # noqa: E731
    c8 = [p8] + [K.PreparedInt8(p8.N, p8.K, p8.layout, p8.w.clone(), p8.scale.clone())
                 for _ in range(ncp(p8.nbytes()) - 1)]
    c4 = [p4] + [K.PreparedInt4(p4.N, p4.K, p4.group_size, p4.layout, p4.w.clone(), p4.sm.clone())
                 for _ in range(ncp(p4.nbytes()) - 1)]
    cb = [wb] + [wb.clone() for _ in range(ncp(wb.numel() * 2) - 1)]
    cands["int8"] = (K.int8_linear, c8, p8.nbytes())
    cands["int4_g128"] = (K.int4_linear, c4, p4.nbytes())
    cands["torch_bf16"] = (torch.nn.functional.linear, cb, wb.numel() * 2)
    if have_bnb:
        try:
            mods = []
            for _ in range(ncp(N * Kd)):
                m = bnb.nn.Linear8bitLt(Kd, N, bias=False, has_fp16_weights=False, threshold=0.0)
                m.weight = bnb.nn.Int8Params(w.cpu().half(), requires_grad=False, has_fp16_weights=False)
                mods.append(m.to(dev))
            cands["bnb_int8"] = (lambda xx, m: m(xx), mods, N * Kd + 4 * N)
        except Exception as e:  # noqa: BLE001
            print(f"  bnb int8 failed on {name}: {type(e).__name__}: {e}")
        try:
            mods = []
            for _ in range(ncp(N * Kd // 2)):
                m = bnb.nn.Linear4bit(Kd, N, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
                m.weight = bnb.nn.Params4bit(w.cpu().bfloat16(), requires_grad=False, quant_type="nf4")
                mods.append(m.to(dev))
            cands["bnb_nf4"] = (lambda xx, m: m(xx), mods, N * Kd // 2 + N * Kd // 64 * 4)
        except Exception as e:  # noqa: BLE001
            print(f"  bnb nf4 failed on {name}: {type(e).__name__}: {e}")
    for M in (1, 5, 16):
        xx = torch.randn(M, Kd, device=dev, generator=g).bfloat16()
        row = dict(shape=name, N=N, K=Kd, M=M)
        for meth, (fn, cps, nb) in cands.items():
            try:
                with torch.no_grad():
                    ms = bench(fn, [(xx, c) for c in cps])
                row[meth + "_us"] = ms * 1e3
                row[meth + "_gbps"] = nb / (ms / 1e3) / 1e9
            except Exception as e:  # noqa: BLE001
                print(f"  {meth} failed on {name} M={M}: {type(e).__name__}: {e}")
        rows.append(row)
    del c8, c4, cb, cands, w, wb
    torch.cuda.empty_cache()
results["timing"] = rows

meths = ["int8", "int4_g128", "torch_bf16", "bnb_int8", "bnb_nf4"]
meths = [m for m in meths if any(m + "_us" in r for r in rows)]
lines = ["| shape | M | " + " | ".join(f"{m} us (GB/s)" for m in meths) + " |",
         "|" + "---|" * (len(meths) + 2)]
for r in rows:
    cells = [f"{r[m + '_us']:.1f} ({r[m + '_gbps']:.0f})" if m + "_us" in r else "-" for m in meths]
    lines.append(f"| {r['shape']} ({r['N']}x{r['K']}) | {r['M']} | " + " | ".join(cells) + " |")
table = "\n".join(lines)

# verification timing: batch 1, gamma 4, V 151936
V, gamma = 151936, 4
tp = torch.softmax(torch.randn(1, gamma + 1, V, device=dev, generator=g), -1)
dp = torch.softmax(torch.randn(1, gamma, V, device=dev, generator=g), -1)
toks = torch.multinomial(dp[0], 1, generator=g).view(1, gamma)
u = torch.rand(1, gamma + 1, device=dev, generator=g)
k_ms = bench(lambda: K.verify_drafts(tp, dp, toks, u), [()], 200)
r_ms = bench(lambda: K.verify_drafts_torch(tp, dp, toks, u), [()], 50)
vline = (f"verify_drafts (gamma={gamma}, V={V}, batch 1): CUDA kernel {k_ms * 1e3:.1f} us, "
         f"torch implementation {r_ms * 1e3:.1f} us (the engine uses the kernel on CUDA; keep it only if faster)")
results["verify_timing"] = dict(kernel_us=k_ms * 1e3, torch_us=r_ms * 1e3)

md = [f"# GPU kernels on {props.name}", "",
      f"- correctness: {nchk - sum(1 for f in failures if 'fmt' in f)}/{nchk} gemm checks ok "
      f"(worst rel err vs bf16 ref {worst16:.2e}, vs fp32 ref {worst32:.2e}); verify kernel "
      f"{total - mism}/{total} identical to the torch implementation",
      f"- HBM read bandwidth (sum of 1 GiB bf16): {bw_read:.0f} GB/s; copy: {bw_copy:.0f} GB/s",
      f"- bf16 activations, weights rotated over >= {FLUSH / 2**20:.0f} MB (cold L2), CUDA events, median of 5",
      "", table, "", vline]
text = "\n".join(md)
print(text)
(OUT / "gpu_kernels.md").write_text(text + "\n")
(OUT / "gpu_kernels.json").write_text(json.dumps(dict(results, failures=failures), indent=1, default=str))
if failures:
    print(f"\n{len(failures)} FAILURES (see gpu_kernels.json)")
    sys.exit(1)
print("\nALL CHECKS PASSED")
PYEOF
