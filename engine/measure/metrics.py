"""Machine facts, memory, the bandwidth probe, and turning a generation into a run record."""
from __future__ import annotations

import json
import os
import platform
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from engine.measure.records import RunRecord, percentile


def simd_level() -> str:
    """Best x86 SIMD level this CPU reports (from /proc/cpuinfo flags), or the machine name."""
    try:
        flags = set()
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return platform.machine()
    if {"avx512f", "avx512bw"} <= flags:
        return "avx512" + ("+vnni" if "avx512_vnni" in flags else "")
    if {"avx2", "fma"} <= flags:
        return "avx2+fma" + ("+vnni" if "avx_vnni" in flags else "")
    if "avx" in flags:
        return "avx"
    if "sse4_2" in flags:
        return "sse4.2"
    return platform.machine()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_facts() -> dict:
    if not torch.cuda.is_available():
        return {}
    p = torch.cuda.get_device_properties(0)
    out = {"gpu_name": p.name, "gpu_memory_bytes": p.total_memory,
           "gpu_capability": f"{p.major}.{p.minor}", "cuda_runtime": torch.version.cuda}
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out["gpu_driver"] = pynvml.nvmlSystemGetDriverVersion()
        out["gpu_memory_used_bytes"] = pynvml.nvmlDeviceGetMemoryInfo(h).used
    except Exception as e:  # pynvml missing or no driver access: the rest still stands
        out["pynvml"] = f"unavailable: {type(e).__name__}"
    return out


def machine_facts(device: str = "cpu") -> dict:
    import psutil

    return {
        "device": torch.device(device).type,
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "simd": simd_level(),
        "memory_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        **gpu_facts(),
    }


def library_versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "bitsandbytes", "streamlit", "gguf"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


# ---------------------------------------------------------------- bandwidth

def _probe_file() -> Path:
    from engine.common.paths import cache_dir

    return cache_dir() / "bandwidth.json"


def measure_bandwidth(device: str = "cpu", mb: int = 256, reps: int = 10) -> float:
    """Read bandwidth in GB/s: best of `reps` full reductions over a buffer much larger than cache.

    Best-of, because other processes can only slow a reading down, never speed it up.
    """
    dev = torch.device(device)
    x = torch.ones(mb * (1 << 20) // 4, dtype=torch.float32, device=dev)
    best = float("inf")
    for _ in range(reps + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        x.sum()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def bandwidth_gbs(device: str = "cpu", refresh: bool = False) -> float:
    """Measured once per machine and device, then read from the cache.

    refresh=True measures again and keeps the higher of old and new: a busy machine reads low.
    """
    f = _probe_file()
    key = f"{torch.device(device).type}|{cpu_model()}|{os.cpu_count()}|{gpu_facts().get('gpu_name', '')}"
    data = {}
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        pass
    if not refresh and isinstance(data.get(key), (int, float)):
        return float(data[key])
    gbs = max(measure_bandwidth(device), float(data.get(key) or 0.0))
    data[key] = gbs
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(data, indent=1))
    return gbs


# ---------------------------------------------------------------- memory

class PeakMemory:
    """Peak process RSS sampled in a thread (CPU) or torch.cuda.max_memory_allocated (GPU)."""

    def __init__(self, device: str, interval_s: float = 0.01):
        self.device, self.interval = torch.device(device), interval_s
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        import psutil

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        proc = psutil.Process()
        self.start = self.peak = proc.memory_info().rss

        def run():
            while not self._stop.is_set():
                self.peak = max(self.peak, proc.memory_info().rss)
                self._stop.wait(self.interval)

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        if self.device.type == "cuda":
            self.gpu_peak = torch.cuda.max_memory_allocated()

    def as_dict(self) -> dict:
        # The process peak includes every model loaded so far; the delta is what this run added.
        d = {"peak_rss_bytes": self.peak, "run_rss_delta_bytes": self.peak - self.start}
        if self.device.type == "cuda":
            d["peak_gpu_allocated_bytes"] = getattr(self, "gpu_peak", None)
        return d


# ---------------------------------------------------------------- the record

def decode_bytes_per_step(lm, cache_slots: int, batch: int) -> int:
    """Weight bytes read in one decode step: everything but the embedding table (a lookup reads one row)."""
    w = sum(v for k, v in lm.weights.items() if k != "embedding")
    c = lm.cfg
    kv_per_slot = 2 * c.num_layers * c.num_kv_heads * c.head_dim * torch.finfo(lm.model.compute_dtype).bits // 8
    return w + kv_per_slot * cache_slots * batch


def summarize(lm, res, mem: PeakMemory | None, bw_gbs: float) -> dict:
    """Metrics of one generation (see records.py for the definitions)."""
    n_first = len(res.new_tokens)
    tokens_after_first = res.n_new - n_first
    decode_s = sum(res.step_s)
    tokens_per_step = (tokens_after_first / len(res.step_s)) if res.step_s else 1.0
    per_token_ms = [1000 * s / tokens_per_step for s in res.step_s] if res.step_s else []
    prompt_tok = sum(len(p) for p in res.prompt_tokens)
    longest = max(len(p) for p in res.prompt_tokens)
    mean_ctx = longest + max(len(t) for t in res.new_tokens) / 2
    b = len(res.new_tokens)
    bytes_step = decode_bytes_per_step(lm, int(mean_ctx), b)
    c = lm.cfg
    kv_bytes = 2 * c.num_layers * c.num_kv_heads * c.head_dim * (torch.finfo(lm.model.compute_dtype).bits // 8) * b * (
        longest + max(len(t) for t in res.new_tokens))
    # Batch b emits b tokens per step (times the speculative tokens per step): bytes are shared.
    bytes_per_token = bytes_step / max(tokens_per_step, 1e-9)
    floor_ms = bytes_per_token / (bw_gbs * 1e9) * 1000 if bw_gbs else None
    med = percentile(per_token_ms, 50)
    m = {
        "ttft_s": res.ttft_s,
        "prefill_s": res.prefill_s,
        "prefill_tok_s": prompt_tok / res.prefill_s if res.prefill_s else None,
        "prompt_tokens": prompt_tok,
        "new_tokens": res.n_new,
        "decode_s": decode_s,
        "decode_tok_s": tokens_after_first / decode_s if decode_s else None,
        "tokens_per_step": tokens_per_step,
        "token_latency_ms_median": med,
        "token_latency_ms_p90": percentile(per_token_ms, 90),
        "token_latency_ms_p99": percentile(per_token_ms, 99),
        "total_s": res.total_s,
        "weight_bytes": lm.weight_bytes,
        "weight_breakdown": dict(lm.weights),
        "quantized_layers": dict(lm.quantized) or None,
        "kv_bytes": kv_bytes,
        "mem_bw_gbs": bw_gbs,
        "bytes_per_token": bytes_per_token,
        "bw_floor_ms": floor_ms,
        "bw_efficiency": (floor_ms / (med / b)) if (floor_ms and med) else None,
        "load_s": lm.load_s,
        "spec": res.spec,
    }
    if mem is not None:
        m.update(mem.as_dict())
    return m


def make_record(kind: str, lm, res, mem, bw_gbs, config_extra: dict | None = None, draft_lm=None,
                quality: dict | None = None) -> RunRecord:
    from engine.ops import kernels
    cfg = {
        "model": lm.name,
        "precision": lm.spec.label,
        "quant": lm.spec.to_dict(),
        "device": lm.device,
        "batch_size": len(res.new_tokens),
        "max_new_tokens": None,
        "draft": None,
    }
    cfg.update(config_extra or {})
    metrics = summarize(lm, res, mem, bw_gbs)
    if draft_lm is not None:
        metrics["draft_weight_bytes"] = draft_lm.weight_bytes
    if quality:
        metrics["quality"] = quality
    return RunRecord(
        kind=kind, config=cfg, metrics=metrics, machine=machine_facts(lm.device), versions=library_versions(),
        kernels=kernels.backend_info(),
        output={"texts": res.texts, "new_tokens": res.new_tokens, "trace": res.trace, "finish": res.finish},
    )


@contextmanager
def timer():
    t = {"s": 0.0}
    t0 = time.perf_counter()
    yield t
    t["s"] = time.perf_counter() - t0
