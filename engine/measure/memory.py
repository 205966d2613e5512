"""Peak memory during a run: process RSS sampled in a thread, or CUDA's peak allocation."""
from __future__ import annotations

import threading

import torch


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
