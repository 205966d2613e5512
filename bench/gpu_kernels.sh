#!/usr/bin/env bash
# One prepared GPU check for the CUDA kernels (kernels/cuda), for an H100/H200 session.
#
#   OUT=/some/dir bash bench/gpu_kernels.sh            # ~6-8 min incl. the extension build
#   PYTHON=/path/to/python OUT=... bash bench/gpu_kernels.sh
#   PART=decode OUT=... bash bench/gpu_kernels.sh      # only part 2 (decode-step kernels, graph; ~3 min)
#
# Needs a CUDA build of torch (and nvcc) on the GPU machine; the CPU-only venv of the
# dev box is useless there.  Part 1 (PART=gemm or all), in one python process:
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
# Part 2 (PART=decode or all), a second process: the decode step's kernels and its CUDA graph
#   5. decode_attention (ragged lengths, GQA 6/7/4/1 query heads per kv head, head_dim 64/128,
#      fp32/fp16/bf16, caches up to 4096 positions, slots permuted, NaN-poisoned output) against
#      a per-sequence fp32 SDPA, on the slot cache and on a paged cache (blocks of 64/128/192
#      positions permuted across the cache through an int32 block table; positions past each
#      length, unmapped blocks and table entries past a sequence's blocks all NaN); rmsnorm_residual
#      against the model's RMSNorm (residual updated in place, the rounding of the activation dtype);
#   6. timings (CUDA events): decode_attention vs torch (a loop of per-sequence SDPA, and one
#      masked SDPA over the whole cache) at B = 1, 8, 32 and 2k positions; paged (64-position
#      blocks, permuted) vs slot cache at B = 8 and 2k positions; rmsnorm_residual vs
#      torch add + RMSNorm;
#   7. the decode step of a random-init 1.5B shape (engine/peers/random_models.py) at bf16 and
#      int4: engine.ops.cuda_graph.decode_step (kernels) and its CUDA-graph replay against the
#      model's eager forward_rows (same logits to bf16 rounding, same argmax), then ms per step
#      of each at B = 1 and 8, and generate() tok/s with KernelConfig.cuda_graph off and on;
#      the same step on a paged cache (engine/infer/paged.py, the K/V in permuted 64-position
#      blocks): eager, and a graph captured before its blocks are moved and its table rewritten
#      in place (the replay must read the new table);
#   8. writes $OUT/gpu_decode.{md,json} (log: gpu_decode.log).
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
PART="${PART:-all}"
rc1=0
rc2=0
if [ "$PART" = all ] || [ "$PART" = gemm ]; then
"$PY" - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/gpu_kernels.log" || rc1=$?
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
fi
if [ "$PART" = all ] || [ "$PART" = decode ]; then
"$PY" - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/gpu_decode.log" || rc2=$?
# Part 2: the decode step's kernels (decode_attention, rmsnorm_residual) and its CUDA graph.
# DRYRUN=1 runs the same code on CPU with tiny shapes and the torch forms (checks this script).
import json, os, statistics, sys, time, traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
from engine import ops  # noqa: E402
from engine.ops import cuda_graph  # noqa: E402

OUT = Path(sys.argv[1])
DRY = os.environ.get("DRYRUN") == "1"
dev = torch.device("cpu" if DRY else "cuda")
if not DRY:
    assert torch.cuda.is_available(), "no CUDA device"
    props = torch.cuda.get_device_properties(dev)
    name = f"{props.name}, sm_{props.major}{props.minor}"
    ext = ops.load_cuda_extension(raise_errors=True)
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
else:
    name, ext, stream = "CPU dry run", None, (lambda: 0)
print(f"# decode-step kernels on {name}, torch {torch.__version__}")
g = torch.Generator(device=dev).manual_seed(0)
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
res = {"device": name, "attention": [], "rmsnorm": [], "timing": [], "step": []}
failures = []


def relerr(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def sync():
    if not DRY:
        torch.cuda.synchronize()


def bench(fn, iters=50):
    """ms per call: CUDA events (wall clock in a dry run), median of 5."""
    fn(); fn(); sync()
    ts = []
    for _ in range(5):
        if DRY:
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            ts.append(1000 * (time.perf_counter() - t) / iters)
        else:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                fn()
            e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / iters)
    return sorted(ts)[2]


def attn_ref(q, k, v, slots, lens):
    """per sequence, fp32: softmax(q k^T / sqrt(D)) v over its own positions (GQA)."""
    B, H, D = q.shape
    out = torch.empty(B, H, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        L = int(lens[b])
        ks, vs = k[int(slots[b]), :, :L].float(), v[int(slots[b]), :, :L].float()
        out[b] = F.scaled_dot_product_attention(q[b].float()[None, :, None], ks[None], vs[None],
                                                enable_gqa=True)[0, :, 0]
    return out


def paged_from_slots(ks, vs, slots, lens, bs, poison):
    """A slot-layout cache [S, KV, cap, D] as a paged one: blocks [S*nb + 3, KV, bs, D] in a random
    order and an int32 table [S, nb]. Poisoned (NaN on the GPU): positions >= lens[b] of the batch's
    slots (in ks/vs too: the reference slices them off), the 3 unmapped blocks, and the table
    entries past a sequence's last block (pointed at an unmapped block)."""
    S, KV, cap, D = ks.shape
    for b in range(slots.numel()):
        ks[int(slots[b]), :, int(lens[b]):] = poison
        vs[int(slots[b]), :, int(lens[b]):] = poison
    nb = -(-cap // bs)
    n = S * nb + 3
    perm = torch.randperm(n, device=dev, generator=g)
    table = perm[:S * nb].view(S, nb).to(torch.int32).contiguous()
    out = []
    for x in (ks, vs):
        x = F.pad(x, (0, 0, 0, nb * bs - cap), value=poison)
        blocks = torch.full((n, KV, bs, D), poison, dtype=x.dtype, device=dev)
        blocks[table.view(-1).long()] = x.view(S, KV, nb, bs, D).transpose(1, 2).reshape(S * nb, KV, bs, D)
        out.append(blocks)
    for b in range(slots.numel()):
        table[int(slots[b]), -(-int(lens[b]) // bs):] = int(perm[-1])
    return out[0], out[1], table


def attn_masked(q, k, v, slots, lens):
    ks, vs = k[slots], v[slots]
    keep = torch.arange(k.shape[2], device=q.device)[None] < lens[:, None]
    return F.scaled_dot_product_attention(q[:, :, None], ks, vs, attn_mask=keep[:, None, None],
                                          enable_gqa=True)[:, :, 0]


# ------------------------------------------------------------ 5. correctness
t0 = time.time()
SHAPES = [(12, 2, 128), (14, 2, 64), (32, 8, 128), (8, 8, 64)] if not DRY else [(4, 2, 64)]
CASES = [(1, 64), (3, 1000), (8, 4096), (32, 512)] if not DRY else [(3, 40)]
if ext is not None:
    for H, KV, D in SHAPES:
        for dtn, dt in DT.items():
            for B, cap in CASES:
                S = B + 2
                k = torch.randn(S, KV, cap, D, device=dev, generator=g).to(dt)
                v = torch.randn(S, KV, cap, D, device=dev, generator=g).to(dt)
                q = (torch.randn(B, H, D, device=dev, generator=g) * 2).to(dt)
                slots = torch.randperm(S, device=dev, generator=g)[:B].contiguous()
                lens = torch.randint(1, cap + 1, (B,), device=dev, generator=g)
                lens[0] = cap
                lens[-1] = 1 if B > 1 else lens[-1]
                out = torch.full_like(q, float("nan"))
                ext.decode_attention(q, k, v, slots, lens, D ** -0.5, stream(), out)
                sync()
                ref = attn_ref(q, k, v, slots, lens)
                e = relerr(out, ref)
                ok = bool(torch.isfinite(out).all()) and e < (1e-4 if dtn == "fp32" else 2e-2)
                rec = dict(H=H, KV=KV, D=D, dtype=dtn, B=B, cap=cap, rel_err=e, ok=ok)
                res["attention"].append(rec)
                if not ok:
                    failures.append(rec); print("FAIL attention", rec)
    from engine.infer.model import RMSNorm
    for dtn, dt in DT.items():
        for rows, n in ((1, 896), (7, 1536), (64, 4096)):
            norm = RMSNorm(n, 1e-6).to(dev)
            with torch.no_grad():
                norm.weight.copy_(torch.rand(n, device=dev, generator=g) + 0.5)
            norm = norm.to(dt)
            r0 = (torch.randn(rows, n, device=dev, generator=g) * 3).to(dt)
            x = torch.randn(rows, n, device=dev, generator=g).to(dt)
            want_r = r0 + x
            want = norm(want_r)
            r = r0.clone()
            out = torch.full_like(r, float("nan"))
            ext.rmsnorm_residual(x, r, norm.weight, 1e-6, stream(), out)
            sync()
            e_r, e = relerr(r, want_r), relerr(out, want)
            only = norm(r0)
            r2 = r0.clone()
            o2 = ext.rmsnorm_residual(None, r2, norm.weight, 1e-6, stream())
            e2 = relerr(o2, only)
            tol = 1e-5 if dtn == "fp32" else 1e-2
            ok = e_r == 0.0 and e < tol and e2 < tol and torch.equal(r2, r0)
            rec = dict(dtype=dtn, rows=rows, n=n, residual_err=e_r, out_err=e, norm_only_err=e2, ok=ok)
            res["rmsnorm"].append(rec)
            if not ok:
                failures.append(rec); print("FAIL rmsnorm", rec)
# the paged layout: the kernel (on the GPU) or, in a dry run, the torch form in engine/ops/cuda_graph.py
POISON = 7.0 if DRY else float("nan")   # the torch form's masked SDPA multiplies masked values by 0
paged_attn = ((lambda q, kb, vb, slots, lens, table, out: ext.decode_attention(
                  q, kb, vb, slots, lens, q.shape[-1] ** -0.5, stream(), out, table))
              if ext is not None else
              (lambda q, kb, vb, slots, lens, table, out: out.copy_(cuda_graph._attention(
                  None, q, kb, vb, slots, lens, q.shape[-1] ** -0.5, table))))
BSIZES = (64, 128, 192)
for si, (H, KV, D) in enumerate(SHAPES):
    for dtn, dt in DT.items():
        for ci, (B, cap) in enumerate(CASES):
            bs = BSIZES[(si + ci) % len(BSIZES)]
            S = B + 2
            k = torch.randn(S, KV, cap, D, device=dev, generator=g).to(dt)
            v = torch.randn(S, KV, cap, D, device=dev, generator=g).to(dt)
            q = (torch.randn(B, H, D, device=dev, generator=g) * 2).to(dt)
            slots = torch.randperm(S, device=dev, generator=g)[:B].contiguous()
            lens = torch.randint(1, cap + 1, (B,), device=dev, generator=g)
            lens[0] = cap
            lens[-1] = 1 if B > 1 else lens[-1]
            if B > 2:
                lens[1] = min(cap, bs)   # exactly one full block
            kb, vb, table = paged_from_slots(k, v, slots, lens, bs, POISON)
            out = torch.full_like(q, float("nan"))
            paged_attn(q, kb, vb, slots, lens, table, out)
            sync()
            ref = attn_ref(q, k, v, slots, lens)
            e = relerr(out, ref)
            ok = bool(torch.isfinite(out).all()) and e < (1e-4 if dtn == "fp32" else 2e-2)
            rec = dict(layout="paged", block=bs, H=H, KV=KV, D=D, dtype=dtn, B=B, cap=cap, rel_err=e, ok=ok)
            res["attention"].append(rec)
            if not ok:
                failures.append(rec); print("FAIL attention", rec)
paged_recs = [r for r in res["attention"] if r.get("layout") == "paged"]
print(f"- decode_attention, paged cache ({'kernel' if ext is not None else 'torch form, dry run'}): "
      f"{sum(r['ok'] for r in paged_recs)}/{len(paged_recs)} ok, worst rel err "
      f"{max(r['rel_err'] for r in paged_recs):.2e}")
if ext is not None:
    na = len(res["attention"]); nr = len(res["rmsnorm"])
    print(f"- decode_attention: {sum(r['ok'] for r in res['attention'])}/{na} ok, worst rel err "
          f"{max(r['rel_err'] for r in res['attention']):.2e}; rmsnorm_residual: "
          f"{sum(r['ok'] for r in res['rmsnorm'])}/{nr} ok ({time.time() - t0:.0f} s)")

# ------------------------------------------------------------ 6. kernel timings
if ext is not None:
    H, KV, D = 12, 2, 128
    for B in (1, 8, 32):
        cap = 2048
        k = torch.randn(B, KV, cap, D, device=dev, generator=g).bfloat16()
        v = torch.randn(B, KV, cap, D, device=dev, generator=g).bfloat16()
        q = torch.randn(B, H, D, device=dev, generator=g).bfloat16()
        slots = torch.arange(B, device=dev)
        lens = torch.full((B,), cap, device=dev)
        ours = bench(lambda: ext.decode_attention(q, k, v, slots, lens, D ** -0.5, stream()))
        loop = bench(lambda: [F.scaled_dot_product_attention(q[b][None, :, None], k[b][None], v[b][None],
                                                             enable_gqa=True) for b in range(B)], 20)
        masked = bench(lambda: attn_masked(q, k, v, slots, lens), 20)
        kv_bytes = 2 * B * KV * cap * D * 2
        res["timing"].append(dict(kernel="decode_attention", B=B, positions=cap, ours_us=ours * 1e3,
                                  torch_loop_us=loop * 1e3, torch_masked_us=masked * 1e3,
                                  ours_gbps=kv_bytes / (ours / 1e3) / 1e9))
        if B == 8:   # the same K/V in 64-position blocks permuted across a paged cache
            kb, vb, table = paged_from_slots(k, v, slots, lens, 64, 0.0)
            paged = bench(lambda: ext.decode_attention(q, kb, vb, slots, lens, D ** -0.5, stream(), None, table))
            res["timing"].append(dict(kernel="decode_attention_paged", B=B, positions=cap, block=64,
                                      ours_us=paged * 1e3, slot_us=ours * 1e3,
                                      ours_gbps=kv_bytes / (paged / 1e3) / 1e9))
            del kb, vb
    for rows, n in ((1, 1536), (8, 1536), (32, 4096)):
        from engine.infer.model import RMSNorm
        norm = RMSNorm(n, 1e-6).to(dev).bfloat16()
        r = torch.randn(rows, n, device=dev, generator=g).bfloat16()
        x = torch.randn(rows, n, device=dev, generator=g).bfloat16()
        ours = bench(lambda: ext.rmsnorm_residual(x, r, norm.weight, 1e-6, stream()), 200)
        ref = bench(lambda: norm(r + x), 200)
        res["timing"].append(dict(kernel="rmsnorm_residual", rows=rows, n=n, ours_us=ours * 1e3, torch_us=ref * 1e3))

# ------------------------------------------------------------ 7. the decode step and its graph
from engine.infer.generate import generate  # noqa: E402
from engine.infer.loader import load, make_spec  # noqa: E402
from engine.infer.model import Rows  # noqa: E402
from engine.infer.paged import PagedKVCache  # noqa: E402


def fill_paged(pc, base, gen):
    """pc (a PagedKVCache) holds the slot cache base's K/V, in blocks of a random order (in place)."""
    L, S, KV, cap, D = base.k.shape
    nb, bs = pc.max_blocks, pc.block_size
    assert nb * bs == cap and S <= pc.slots
    perm = torch.randperm(pc.num_blocks, generator=gen)[:S * nb].view(S, nb)
    pc.k.zero_(); pc.v.zero_()
    pc.table[:S] = perm.to(device=pc.table.device, dtype=torch.int32)
    idx = perm.reshape(-1).to(pc.k.device)
    for src, dst in ((base.k, pc.k), (base.v, pc.v)):
        dst[:, idx] = src.view(L, S, KV, nb, bs, D).transpose(2, 3).reshape(L, S * nb, KV, bs, D)

shape = "qwen2.5-coder-1.5b"
if DRY:
    import tests.tiny as tiny  # noqa: E402
try:
    if DRY:
        lms = {"fp32": tiny.tiny_model(0, vocab=64, layers=2, hidden=256)}
        lms["fp32"].model.cfg.head_dim = 64
    else:
        from engine.peers.random_models import random_model_folder
        folder = random_model_folder(shape)
        lms = {p: load(str(folder), make_spec(p), "cuda") for p in ("bf16", "int4")}
    for prec, lm in lms.items():
        m = lm.model
        V = m.cfg.vocab_size
        for B in (1, 8):
            cap = 512
            base = m.new_cache(B, cap)
            gen = torch.Generator(device="cpu").manual_seed(B)
            ids = torch.randint(2, V, (B, 100), generator=gen).to(dev)
            with torch.inference_mode(), ops.using(cuda_graph=False):
                for b in range(B):
                    m.forward_rows(ids[b], Rows.of([(b, 0, 100)], dev), base, logits_at=torch.tensor([99], device=dev))
            toks = torch.randint(2, V, (B,), generator=gen).to(dev)
            pos = torch.full((B,), 100, device=dev) - torch.arange(B, device=dev) % 3   # ragged positions
            slots = torch.arange(B, device=dev)
            rows = Rows.of([(b, int(pos[b]), 1) for b in range(B)], dev)
            caches = [type(base).__new__(type(base)) for _ in range(3)]
            for c in caches:
                torch.nn.Module.__init__(c)
                c.register_buffer("k", base.k.clone(), persistent=False)
                c.register_buffer("v", base.v.clone(), persistent=False)
                c.slots, c.capacity = base.slots, base.capacity
            with torch.inference_mode(), ops.using(cuda_graph=False, fused=False):
                ref = m.forward_rows(toks, rows, caches[0])
                eager = cuda_graph.decode_step(m, toks, slots, pos, caches[1], use_kernels=not DRY)
                step = {"precision": prec, "B": B, "eager_err": relerr(eager, ref),
                        "eager_same_argmax": float((eager.argmax(-1) == ref.argmax(-1)).float().mean())}
                if not DRY:
                    gd = cuda_graph.GraphedDecode(m, caches[2], B)
                    graphed = gd(toks, slots, pos)
                    step.update(graph_err=relerr(graphed, ref),
                                graph_same_argmax=float((graphed.argmax(-1) == ref.argmax(-1)).float().mean()),
                                graph_vs_eager_err=relerr(graphed, eager))
                    step["ms_forward_rows"] = bench(lambda: m.forward_rows(toks, rows, caches[0]), 20)
                    step["ms_decode_step"] = bench(lambda: cuda_graph.decode_step(m, toks, slots, pos, caches[1]), 20)
                    step["ms_graph"] = bench(lambda: gd(toks, slots, pos), 50)
                    step["graph_speedup"] = step["ms_forward_rows"] / step["ms_graph"]
                # the paged cache: the same K/V in permuted blocks, read through the block table
                pcs = [PagedKVCache(m.cfg, B, cap, B * cap // 64 + 4, 64, base.k.dtype, dev) for _ in range(2)]
                fill_paged(pcs[0], base, gen)
                eager_p = cuda_graph.decode_step(m, toks, slots, pos, pcs[0], use_kernels=not DRY)
                step.update(paged_eager_err=relerr(eager_p, ref),
                            paged_same_argmax=float((eager_p.argmax(-1) == ref.argmax(-1)).float().mean()))
                if not DRY:
                    fill_paged(pcs[1], base, gen)
                    gdp = cuda_graph.GraphedDecode(m, pcs[1], B)
                    fill_paged(pcs[1], base, gen)   # new blocks, table rewritten in place after the capture
                    graphed_p = gdp(toks, slots, pos)
                    step.update(paged_graph_err=relerr(graphed_p, ref),
                                paged_graph_same_argmax=float((graphed_p.argmax(-1) == ref.argmax(-1)).float().mean()))
                    step["ms_graph_paged"] = bench(lambda: gdp(toks, slots, pos), 50)
            ok = step["eager_err"] < 3e-2 and step.get("graph_err", 0.0) < 3e-2 and step["eager_same_argmax"] >= 0.99
            ok = (ok and step["paged_eager_err"] < 3e-2 and step.get("paged_graph_err", 0.0) < 3e-2
                  and step["paged_same_argmax"] >= 0.99)
            step["ok"] = ok
            res["step"].append(step)
            print(f"- decode step {prec} B={B}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                          for k, v in step.items()))
            if not ok:
                failures.append(step)
        if not DRY:
            tok_s = {}
            for on in (False, True):
                with ops.using(cuda_graph=on):
                    r = generate(lm, ["def fibonacci(n):"], 64, stop_at_eos=False)
                tok_s[on] = 1 / statistics.median(r.step_s)   # median: the first step captures the graph
            res["step"].append({"precision": prec, "generate_tok_s_eager": tok_s[False],
                                "generate_tok_s_graph": tok_s[True], "speedup": tok_s[True] / tok_s[False],
                                "fused_info": ops.fused_info()})
            print(f"- generate {prec}: {tok_s[False]:.1f} tok/s eager, {tok_s[True]:.1f} with the CUDA graph")
        del lm, m
        if not DRY:
            torch.cuda.empty_cache()
except Exception:
    traceback.print_exc()
    failures.append({"step": "exception", "trace": traceback.format_exc()[-2000:]})

lines = [f"# Decode-step kernels on {name}", ""]
for lay in ("slot", "paged"):
    recs = [r for r in res["attention"] if r.get("layout", "slot") == lay]
    if recs:
        lines.append(f"- decode_attention, {lay} cache: {sum(r['ok'] for r in recs)}/{len(recs)} checks ok "
                     f"(worst rel err {max(r['rel_err'] for r in recs):.2e} vs a per-sequence fp32 SDPA)")
if res["rmsnorm"]:
    lines.append(f"- rmsnorm_residual: {sum(r['ok'] for r in res['rmsnorm'])}/{len(res['rmsnorm'])} checks ok")
lines += ["", "| kernel | shape | ours us | torch us | note |", "|---|---|---|---|---|"]
for t in res["timing"]:
    if t["kernel"] == "decode_attention_paged":
        lines.append(f"| decode_attention, paged | B={t['B']}, {t['positions']} positions in permuted blocks of "
                     f"{t['block']}, 12/2 heads, d128, bf16 | {t['ours_us']:.1f} | slot cache (ours) "
                     f"{t['slot_us']:.1f} | {t['ours_gbps']:.0f} GB/s of K/V, {t['ours_us'] / t['slot_us']:.2f}x "
                     f"the slot layout |")
    elif t["kernel"] == "decode_attention":
        lines.append(f"| decode_attention | B={t['B']}, {t['positions']} positions, 12/2 heads, d128, bf16 | "
                     f"{t['ours_us']:.1f} | loop {t['torch_loop_us']:.1f}, masked {t['torch_masked_us']:.1f} | "
                     f"{t['ours_gbps']:.0f} GB/s of K/V |")
    else:
        lines.append(f"| rmsnorm_residual | {t['rows']} x {t['n']}, bf16 | {t['ours_us']:.1f} | {t['torch_us']:.1f} | |")
lines += ["", "| step | B | eager err | graph err | forward_rows ms | decode_step ms | graph ms | speedup | "
          "paged eager err | paged graph err | paged graph ms |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
for s in res["step"]:
    if "B" in s:
        lines.append(f"| {s['precision']} | {s['B']} | {s['eager_err']:.2e} | {s.get('graph_err', float('nan')):.2e} | "
                     f"{s.get('ms_forward_rows', float('nan')):.2f} | {s.get('ms_decode_step', float('nan')):.2f} | "
                     f"{s.get('ms_graph', float('nan')):.2f} | {s.get('graph_speedup', float('nan')):.2f}x | "
                     f"{s.get('paged_eager_err', float('nan')):.2e} | {s.get('paged_graph_err', float('nan')):.2e} | "
                     f"{s.get('ms_graph_paged', float('nan')):.2f} |")
    else:
        lines.append(f"| generate() {s['precision']} | 1 | | | {1000 / s['generate_tok_s_eager']:.2f} | | "
                     f"{1000 / s['generate_tok_s_graph']:.2f} | {s['speedup']:.2f}x | | | |")
text = "\n".join(lines)
print(text)
(OUT / "gpu_decode.md").write_text(text + "\n")
(OUT / "gpu_decode.json").write_text(json.dumps(dict(res, failures=failures), indent=1, default=str))
if failures:
    print(f"\n{len(failures)} FAILURES (see gpu_decode.json)")
    sys.exit(1)
print("\nALL DECODE CHECKS PASSED")
PYEOF
fi
exit $(( rc1 > rc2 ? rc1 : rc2 ))
