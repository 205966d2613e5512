"""Short texts the pages show: a run's label in pickers, progress and time left, the machine box, noisy runs."""
from __future__ import annotations

from typing import Mapping, Sequence

from engine.common.fields import M, N


def _noisy(rec) -> bool:
    n = (rec.metrics or {}).get(M.noise)
    return isinstance(n, dict) and n.get(N.noisy) is True


def run_choice_label(rec) -> str:
    w = (rec.config or {}).get("workload")
    return (f"{rec.label}{f' · {w}' if w else ''} · {rec.created_at.replace('T', ' ')[:19]} · {rec.run_id}"
            + (" · ⚠ noisy" if _noisy(rec) else ""))


def noisy_configs(records) -> list:
    """The records the noise guard flagged (the Compare page offers to measure them again)."""
    return [r for r in records if _noisy(r)]


def eta_text(done: int, total: int, eta_s: float | None) -> str:
    if total <= 0:
        return "nothing to run"
    if done >= total:
        return f"{done}/{total} runs done"
    if eta_s is None:
        return f"{done}/{total} runs done, estimating time left after the first run"
    m, s = divmod(int(round(eta_s)), 60)
    left = f"{m} min {s:02d} s" if m else f"{s} s"
    return f"{done}/{total} runs done, about {left} left"


def machine_rows(facts: Mapping, bw_gbs: float | None, gpus: Sequence[Mapping], kernels: Mapping | None) -> list[dict]:
    """Label/value rows for the Home page's hardware box."""
    rows = [("CPU", facts.get("cpu_model")), ("SIMD level", facts.get("simd")),
            ("cores / torch threads", f"{facts.get('cores')} / {facts.get('torch_threads')}"),
            ("memory", f"{(facts.get('memory_bytes') or 0) / 2**30:.1f} GiB"),
            ("measured read bandwidth", f"{bw_gbs:.1f} GB/s" if bw_gbs else "not measured"),
            ("our CPU kernels", (kernels or {}).get("cpu", "unknown"))]
    if gpus:
        for g in gpus:
            rows.append((f"GPU {g['index']}", f"{g['name']}, {g['memory_GB']} GB, driver {g['driver']}"))
    elif facts.get("gpu_name"):
        rows.append(("GPU", facts["gpu_name"]))
    else:
        rows.append(("GPU", "none detected (runs use the CPU)"))
    rows.append(("OS", facts.get("os")))
    return [{"what": k, "value": "" if v is None else str(v)} for k, v in rows]
