"""Benchmark the weight-only quantized CPU kernels (and the dense bf16/fp32 one) on the 1.5B model's projection shapes.

    .venv/bin/python bench/kernel_speed.py            # full run (~2 min on 2 cores)
    .venv/bin/python bench/kernel_speed.py --quick    # fewer reps / shapes subset for smoke runs
    .venv/bin/python bench/kernel_speed.py --json out.json --isa avx2 --threads 1

For each shape (N, K) and M in {1, 5, 16}: our int8 and int4 kernels (engine.ops), our dense bf16 and fp32
kernel against torch's bf16 F.linear (ops.dense_linear, --no-dense skips them),
fp32 torch matmul (MKL), torch.ops.aten._weight_int8pack_mm and dynamic int8 quantization
(torch.ao.quantization.quantize_dynamic, fbgemm) when available.  Reports time, achieved
GB/s = weight bytes read / time, the fraction of the machine's read bandwidth measured in
the same run (sum over a 1 GiB fp32 tensor, same thread count), and the M=5/M=1 and
M=16/M=1 cost ratios.

Cold-cache methodology: a decode step streams the whole model, so weights are never in
cache.  Every method cycles through enough copies of the weight that the working set
exceeds --flush-mb (default 768 MB, above this host's 260 MB L3), so each call reads
its weights from DRAM.  Every call is timed individually and a cell reports the min
(default; --stat median) -- with other processes on the 2 cores, a call whose OpenMP thread
got descheduled stalls for a whole scheduler slice.  The bandwidth reference is measured
the same way before and after every shape and the best value is used.
Weights are random (quantized values drawn directly) -- timing does not depend on values.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import ops  # noqa: E402

SHAPES = [  # name, N, K  (Qwen2.5-1.5B-style projections; q/o and k/v and gate/up share shapes)
    ("q_proj/o_proj", 1536, 1536),
    ("k_proj/v_proj", 256, 1536),
    ("gate/up_proj", 8960, 1536),
    ("down_proj", 1536, 8960),
    ("lm_head", 151936, 1536),
    ("4096x4096", 4096, 4096),
]
# per decoder layer: q, k, v, o, gate, up, down;  28 layers + lm_head
LAYER_COUNTS = {"q_proj/o_proj": 2, "k_proj/v_proj": 2, "gate/up_proj": 2, "down_proj": 1}
N_LAYERS = 28


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_BW_BUF: list = []


def measure_bandwidth(reps: int = 16) -> float:
    """Read bandwidth (GB/s): torch sum over 256 MiB fp32 slices of a 1 GiB buffer, taken
    in rotation so each slice is cold (the other 768 MiB evict it from the 260 MB L3);
    fastest of `reps` (other processes only slow a call down)."""
    if not _BW_BUF:
        _BW_BUF.append(torch.ones(256 * 2**20).view(4, -1))
    x = _BW_BUF[0]
    for i in range(4):
        x[i].sum()
    best = float("inf")
    for i in range(reps):
        t = time.perf_counter()
        x[i % 4].sum()
        best = min(best, time.perf_counter() - t)
    return x[0].numel() * 4 / best / 1e9


STAT = {"min": min, "median": statistics.median}


def time_fn(fn, args_list, est_s: float, rounds: int, target_s: float, stat: str = "min") -> float:
    """Time per call: min (default) or median over individually timed calls.

    Calls cycle through args_list (weight copies) with a cursor, so a copy is touched
    again only after all the others: cold weights as long as the copies together exceed
    the last-level cache.  Every call is timed on its own: when other processes share the
    2 cores, a call whose thread was descheduled (an OpenMP barrier then waits a whole
    4-8 ms scheduler slice) is an outlier, and the min over many cold calls is the
    uncontended cost.  Runs about rounds * target_s per measurement (>= 5 calls; slow
    calls: >= 3).
    """
    n = len(args_list)
    cur = 0
    for _ in range(min(n, 2)):
        fn(*args_list[cur % n])
        cur += 1
    times = []
    budget = rounds * target_s
    t_start = time.perf_counter()
    while True:
        t = time.perf_counter()
        fn(*args_list[cur % n])
        dt = time.perf_counter() - t
        cur += 1
        times.append(dt)
        if len(times) >= 3 and (dt > target_s or (time.perf_counter() - t_start >= budget and len(times) >= 5)):
            break
    return STAT[stat](times)


def n_copies(nbytes: int, flush: int, cap: int = 4000) -> int:
    return max(1, min(cap, -(-flush // max(nbytes, 1))))


def clone_prepared(p):
    if isinstance(p, ops.PreparedInt8):
        return ops.PreparedInt8(p.N, p.K, p.layout, p.w.clone(), p.scale.clone())
    return ops.PreparedInt4(p.N, p.K, p.group_size, p.layout, p.w.clone(), p.sm.clone())


def random_int8(N, K, g):
    q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    s = torch.rand(N, generator=g) * 1e-3 + 1e-4
    return q, s


def random_int4(N, K, gs, g):
    G = -(-K // gs)
    packed = torch.randint(0, 256, (N, G * gs // 2), dtype=torch.uint8, generator=g)
    scales = (torch.rand(N, G, generator=g) * 1e-3 + 1e-4).to(torch.float16)
    mins = (-torch.rand(N, G, generator=g) * 1e-2).to(torch.float16)
    return packed, scales, mins


def bench_shape(name, N, K, Ms, args, g):
    flush = args.flush_mb * 2**20
    rows = []
    est_bw = args.bw * 1e9

    def record(method, M, sec, nbytes):
        rows.append(dict(shape=name, N=N, K=K, M=M, method=method, us=sec * 1e6,
                         weight_bytes=nbytes, gbps=nbytes / sec / 1e9,
                         frac_bw=nbytes / sec / 1e9 / args.bw))

    xs = {M: torch.randn(M, K, generator=g) for M in Ms}

    # ---- ours: int8 / int4
    q, s = random_int8(N, K, g)
    p8 = ops.prepare_int8(q, s)
    del q
    packed, sc, mn = random_int4(N, K, args.gs, g)
    p4 = ops.prepare_int4(packed, sc, mn, K, args.gs)
    del packed
    ext = ops.load_cpu_extension()
    # int8 activations: AVX-512 VNNI, AVX2 vpmaddubsw or the scalar reference, by ISA
    q8 = args.act_int8 and ext is not None

    for method, p, fn, settings in (("int8", p8, ops.int8_linear, {}),
                                    ("int4", p4, ops.int4_linear, {"act_int8": False}),
                                    ("int4_q8", p4, ops.int4_linear, {"act_int8": True})):
        if method == "int4_q8" and not q8:
            continue
        nb = p.nbytes()
        cps = [p] + [clone_prepared(p) for _ in range(n_copies(nb, flush) - 1)]
        with ops.using(**settings):  # int4_q8: the same kernels with int8 activations
            for M in Ms:
                sec = time_fn(fn, [(xs[M], c) for c in cps], nb / est_bw, args.rounds, args.target_s, args.stat)
                record(method, M, sec, nb)
        del cps
    del p8, p4

    # ---- dense weights: our bf16/fp32 kernel (ops.dense_linear, the weight's own [N, K] layout) and torch's
    # bf16 F.linear (fp32's is fp32_mkl below)
    if args.dense:
        for dt, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            w = (torch.randn(N, K, generator=g) * 0.02).to(dt)
            nb = w.numel() * w.element_size()
            cps = [w] + [w.clone() for _ in range(n_copies(nb, flush) - 1)]
            for M in Ms:
                x = xs[M].to(dt)
                with ops.using(dense_m=min(M, ops.config.KERNEL_MAX_M)):
                    sec = time_fn(ops.dense_linear, [(x, c) for c in cps], nb / est_bw, args.rounds, args.target_s,
                                  args.stat)
                record(f"{tag}_dense", M, sec, nb)
                if tag == "bf16" and not args.no_baselines:
                    sec = time_fn(torch.nn.functional.linear, [(x, c) for c in cps], nb / est_bw, args.rounds,
                                  args.target_s, args.stat)
                    record("bf16_torch", M, sec, nb)
            del cps, w

    # ---- torch baselines
    if not args.no_baselines:
        w = torch.randn(N, K, generator=g) * 0.02
        nb = w.numel() * 4
        cps = [w] + [w.clone() for _ in range(n_copies(nb, flush) - 1)]
        for M in Ms:
            sec = time_fn(torch.nn.functional.linear, [(xs[M], c) for c in cps], nb / est_bw,
                          args.rounds, args.target_s, args.stat)
            record("fp32_mkl", M, sec, nb)
        del cps

        try:
            qi, si = random_int8(N, K, g)
            op = torch.ops.aten._weight_int8pack_mm
            op(xs[Ms[0]], qi, si)
            nb = qi.numel() + si.numel() * 4
            cps = [(qi, si)] + [(qi.clone(), si.clone()) for _ in range(n_copies(nb, flush) - 1)]
            for M in Ms:
                sec = time_fn(op, [(xs[M], a, b) for a, b in cps], nb / est_bw, args.rounds, args.target_s, args.stat)
                record("aten_int8pack_mm", M, sec, nb)
            del cps, qi
        except Exception as e:  # noqa: BLE001
            print(f"# _weight_int8pack_mm unavailable: {e}", file=sys.stderr)

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lin = torch.nn.Linear(K, N, bias=False)
                with torch.no_grad():
                    lin.weight.copy_(w)
                mods = []
                nb = N * K + N * 4
                for _ in range(n_copies(nb, flush, cap=60 if args.quick else 120)):
                    mods.append(torch.ao.quantization.quantize_dynamic(
                        torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8))
                del lin
                with torch.no_grad():
                    for M in Ms:
                        sec = time_fn(lambda x, m: m(x), [(xs[M], m) for m in mods], nb / est_bw,
                                      args.rounds, args.target_s, args.stat)
                        record("dynamic_int8", M, sec, nb)
                del mods
        except Exception as e:  # noqa: BLE001
            print(f"# quantize_dynamic unavailable: {e}", file=sys.stderr)
        del w
    return rows


def fmt_table(rows, Ms, bw):
    by = {(r["shape"], r["M"], r["method"]): r for r in rows}
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    methods = [m for m in ("int4_q8", "bf16_dense", "bf16_torch", "fp32_dense", "fp32_mkl", "aten_int8pack_mm",
                           "dynamic_int8")
               if any(r["method"] == m for r in rows)]
    out = []
    hdr = ["shape (N x K)", "M", "int8 us", "int8 GB/s", "int8 %BW", "int4 us", "int4 GB/s", "int4 %BW"]
    hdr += [f"{m} us" for m in methods]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    for sh in shapes:
        for M in Ms:
            r8, r4 = by.get((sh, M, "int8")), by.get((sh, M, "int4"))
            if r8 is None:
                continue
            cells = [f"{sh} ({r8['N']}x{r8['K']})", str(M),
                     f"{r8['us']:.1f}", f"{r8['gbps']:.1f}", f"{100 * r8['frac_bw']:.0f}%",
                     f"{r4['us']:.1f}", f"{r4['gbps']:.1f}", f"{100 * r4['frac_bw']:.0f}%"]
            for m in methods:
                rb = by.get((sh, M, m))
                cells.append(f"{rb['us']:.1f}" if rb else "-")
            out.append("| " + " | ".join(cells) + " |")
    # cost ratios
    out.append("")
    hdr = ["shape", "int8 M=5/M=1", "int8 M=16/M=1", "int4 M=5/M=1", "int4 M=16/M=1",
           "int4_q8 M=5/M=1", "int4_q8 M=16/M=1", "fp32 M=1 / int8 M=1", "fp32 M=1 / int4 M=1"]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    for sh in shapes:
        def ratio(meth, a, b, sh=sh):
            ra, rb = by.get((sh, a, meth)), by.get((sh, b, meth))
            return f"{ra['us'] / rb['us']:.2f}" if ra and rb else "-"

        def speed(meth, sh=sh):
            rf, rq = by.get((sh, 1, "fp32_mkl")), by.get((sh, 1, meth))
            return f"{rf['us'] / rq['us']:.1f}x" if rf and rq else "-"
        out.append(f"| {sh} | {ratio('int8', 5, 1)} | {ratio('int8', 16, 1)} | {ratio('int4', 5, 1)} | "
                   f"{ratio('int4', 16, 1)} | {ratio('int4_q8', 5, 1)} | {ratio('int4_q8', 16, 1)} | "
                   f"{speed('int8')} | {speed('int4')} |")
    # model-level estimate
    if all((sh, 1, "int8") in by for sh in list(LAYER_COUNTS) + ["lm_head"]):
        out.append("")
        out.append(f"Projection-only time per decode step, {N_LAYERS} layers + lm_head "
                   "(sum of the rows above; attention, norms and python overhead excluded):")
        out.append("")
        out.append("| method | M=" + " | M=".join(str(M) for M in Ms) + " |")
        out.append("|" + "---|" * (len(Ms) + 1))
        for meth in ("int8", "int4", "int4_q8", "bf16_dense", "bf16_torch", "fp32_dense", "fp32_mkl"):
            cells = []
            for M in Ms:
                try:
                    t = sum(N_LAYERS * c * by[(sh, M, meth)]["us"] for sh, c in LAYER_COUNTS.items())
                    t += by[("lm_head", M, meth)]["us"]
                    cells.append(f"{t / 1e3:.1f} ms")
                except KeyError:
                    cells.append("-")
            out.append(f"| {meth} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _run_bw(run) -> str:
    return f"{max(run['meta'].get('bw_points', [run['meta']['bw_gbps']])):.1f}"


def merge(paths):
    """Best-of-N: merge JSON outputs of several runs (same code, same options).

    Interference from other processes only ever adds time or removes bandwidth, so per
    cell the minimum time over runs, and as the reference the maximum bandwidth observed
    in any run (the conservative choice for the %BW column), estimate the quiet machine.
    """
    runs = [json.loads(Path(p).read_text()) for p in paths]
    bw = max(max(r["meta"].get("bw_points", [r["meta"]["bw_gbps"]])) for r in runs)
    best: dict = {}
    for r in runs:
        for row in r["results"]:
            key = (row["shape"], row["M"], row["method"])
            if key not in best or row["us"] < best[key]["us"]:
                best[key] = dict(row)
    rows = list(best.values())
    for row in rows:
        row["frac_bw"] = row["gbps"] / bw
    Ms = sorted({row["M"] for row in rows})
    print(f"# Kernel benchmark, best of {len(runs)} runs: "
          + ", ".join(f"`{r['meta']['cmd'].strip()}`" for r in runs))
    print()
    m0 = runs[0]["meta"]
    print(f"- CPU: {m0['cpu']}, torch {m0['torch']}, threads={m0['threads']}, kernels: {m0['backend'].get('cpu')}")
    print(f"- read bandwidth reference: **{bw:.1f} GB/s** = the highest of all bandwidth points of all "
          f"runs (per-run maxima: {', '.join(_run_bw(r) for r in runs)} GB/s)")
    print("- per cell: the minimum time over the runs (other processes only add time)")
    print()
    print(fmt_table(rows, Ms, bw))
    return rows


def act_kl(models, tokens: int, json_path=None):
    """What int8 activations cost in quality: int4 with fp32 and with int8 activations, each against
    the fp32 model (llama.cpp-style KL statistics, engine.measure.quality), same text and tokens."""
    from engine.infer.loader import load, make_spec
    from engine.measure import quality
    from engine.measure.eval_text import eval_docs
    from engine.present import format_rows

    rows = []
    for name in models:
        lm = load(name, make_spec("int4"), "cpu")
        docs = eval_docs(lm.tokenizer, tokens)
        for act in (False, True):
            with ops.using(act_int8=act):
                t0 = time.time()
                q = quality.evaluate(lm, tokens, docs=docs)
                kern = ops.backend_info()["int4_activations"]
            keys = ("kld_mean", "kld_mean_err", "kld_median", "kld_p95", "kld_p99", "kld_max", "top1_agreement",
                    "perplexity", "ref_perplexity", "ppl_ratio")
            rows.append({"model": lm.label, "activations": kern, "tokens": q.get("tokens"),
                         **{k: q.get(k) for k in keys}, "s": round(time.time() - t0)})
            print(rows[-1], flush=True)
        del lm
    print(format_rows(rows, "md"))
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1, default=str))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer reps and rounds (smoke run)")
    ap.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--isa", choices=["scalar", "avx2", "avx512"], help="cap the kernel ISA (ops.configure(isa=...))")
    ap.add_argument("--gs", type=int, default=64, choices=[32, 64, 128], help="int4 group size")
    ap.add_argument("--m", default="1,5,16", help="comma-separated M values")
    ap.add_argument("--shapes", default="", help="comma-separated subset of shape names (substring match)")
    ap.add_argument("--no-baselines", action="store_true", help="only our kernels")
    ap.add_argument("--no-dense", dest="dense", action="store_false",
                    help="skip the dense bf16/fp32 kernel columns (bf16_dense, bf16_torch, fp32_dense)")
    ap.add_argument("--no-act-int8", dest="act_int8", action="store_false",
                    help="skip the int4 x int8-activation column")
    ap.add_argument("--act-kl", metavar="MODELS", default="",
                    help="do not time kernels: KL against fp32 of int4 with fp32 vs int8 activations "
                         "(engine.measure.quality) for these models, e.g. default-draft,default")
    ap.add_argument("--kl-tokens", type=int, default=2048, help="scored tokens for --act-kl")
    ap.add_argument("--flush-mb", type=int, default=768, help="working set per measurement (MB)")
    ap.add_argument("--rounds", type=int, default=None, help="time budget per cell in units of ~80 ms")
    ap.add_argument("--stat", choices=["min", "median"], default="min",
                    help="statistic over rounds (min is robust to other processes)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="do not measure: print the best-of-N table of earlier --json outputs")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge)
    if args.act_kl:
        return act_kl([m.strip() for m in args.act_kl.split(",") if m.strip()], args.kl_tokens, args.json)

    if args.isa:
        ops.configure(isa=args.isa)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.target_s = 0.03 if args.quick else 0.08
    Ms = [int(m) for m in args.m.split(",")]
    shapes = SHAPES
    if args.shapes:
        keys = [s.strip() for s in args.shapes.split(",") if s.strip()]
        shapes = [s for s in SHAPES if any(k in s[0] for k in keys)]

    t0 = time.time()
    ops.load_cpu_extension(raise_errors=False)
    info = ops.backend_info()
    args.bw = measure_bandwidth()
    g = torch.Generator().manual_seed(0)
    rows = []
    bws = [args.bw]
    for name, N, K in shapes:
        rows += bench_shape(name, N, K, Ms, args, g)
        bws.append(measure_bandwidth(8))
    _BW_BUF.clear()
    # The reference is the best bandwidth seen during the whole run (measured before and
    # after every shape): other processes only lower it, so this keeps fractions honest.
    args.bw = max(bws)
    for r in rows:
        r["frac_bw"] = r["gbps"] / args.bw
    elapsed = time.time() - t0

    cmd = "python bench/kernel_speed.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"# Kernel benchmark: `{cmd.strip()}`")
    print()
    print(f"- CPU: {cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
          f"threads={torch.get_num_threads()}")
    print(f"- kernels: cpu={info['cpu']} (best={info.get('cpu_best', '-')}) {info.get('cpu_reason', '')}")
    print(f"- measured read bandwidth (torch sum over cold 256 MiB fp32 slices, same threads; best of "
          f"{len(bws)} points through the run): **{args.bw:.1f} GB/s** "
          f"(points: {', '.join(f'{b:.1f}' for b in bws)})")
    print("- int8/int4: our kernels, fp32 activations.  int4_q8: act_int8 (SCL_KERNEL_ACT) "
          f"(activations quantized to int8 per 32-k block, {info.get('int4_q8_kernel', '')}).  "
          "bf16_dense / fp32_dense: "
          f"our dense kernel (ops.dense_linear, {info.get('dense_kernel', '')}).  bf16_torch: torch bf16 F.linear.  "
          "fp32_mkl: torch F.linear.  "
          "aten_int8pack_mm: torch.ops.aten._weight_int8pack_mm.  dynamic_int8: quantize_dynamic (fbgemm; "
          "at most 120 weight copies, so small shapes partly hit the L3 cache)")
    print(f"- int4 group size {args.gs}; cold weights (working set >= {args.flush_mb} MB per measurement); "
          f"{args.stat} of individually timed calls (~{args.rounds * args.target_s:.1f} s per cell); "
          f"GB/s = weight+scale bytes / time")
    print()
    print(fmt_table(rows, Ms, args.bw))
    print()
    print(f"(run took {elapsed:.0f} s)")
    if args.json:
        meta = dict(cmd=cmd, cpu=cpu_model(), threads=torch.get_num_threads(), torch=torch.__version__,
                    backend=info, bw_gbps=args.bw, bw_points=bws, gs=args.gs, flush_mb=args.flush_mb,
                    rounds=args.rounds, quick=args.quick, elapsed_s=elapsed)
        Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
