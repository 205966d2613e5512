"""The GPU catalog: datasheet figures and reference prices from data/gpus.csv, plus user overrides.

The shipped CSV is never written. A user's edits (a price from their contract, a GPU we don't
ship) live elsewhere (the lead's SQLite store) and are merged on top at load time by
`load_gpus(overrides)`. The "this machine" row is a placeholder until a measured probe fills it.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Iterable, Mapping

from engine.common.formulas import HOURS_PER_MONTH
from engine.common.paths import DATA

GPUS_PATH = DATA / "gpus.csv"
THIS_MACHINE = "this machine"

# Numeric fields, and whether 0/empty means "not supported" (None) rather than an error.
_NUM_FIELDS = ("memory_gb", "mem_bw_tbs", "fp32_tflops", "fp16_tflops", "bf16_tflops", "fp8_tflops",
               "fp4_tflops", "int8_tops", "interconnect_gbs", "max_gpus_per_node", "price_usd_per_hr",
               "price_low_usd_per_hr", "price_high_usd_per_hr")
_OPTIONAL_NUM = ("bf16_tflops", "fp8_tflops", "fp4_tflops", "int8_tops", "price_low_usd_per_hr",
                 "price_high_usd_per_hr")
_REQUIRED_FOR_NEW = ("memory_gb", "mem_bw_tbs", "fp16_tflops", "price_usd_per_hr")


class CatalogError(ValueError):
    """Bad GPU rows or overrides. `problems` is a list of (field, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


GPU_KINDS = ("gpu", "consumer")  # accelerators; "gpu" alone are planned when no GPU is named


@dataclass(frozen=True)
class GPU:
    """One accelerator (or this machine's CPU) as the planner sees it.

    memory_gb is read as GiB (NVIDIA's HBM capacities are binary: 80 GB = 81920 MiB).
    TFLOPS are dense (no 2:4 sparsity). None means the precision has no hardware support.
    """

    name: str
    # gpu | consumer | cpu. A consumer card (RTX 4090) is planned only when named: GeForce drivers are not
    # licensed for data-center use, so "every GPU" means the data-center ones.
    kind: str = "gpu"
    memory_gb: float = 0.0
    mem_bw_tbs: float = 0.0
    fp32_tflops: float = 0.0
    fp16_tflops: float = 0.0
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    fp4_tflops: float | None = None         # NVFP4/MXFP4 tensor cores (Blackwell); None on older GPUs
    int8_tops: float | None = None
    interconnect: str = ""
    interconnect_gbs: float = 0.0           # per-GPU bidirectional figure of the datasheet
    max_gpus_per_node: int = 8
    price_usd_per_hr: float = 0.0
    price_low_usd_per_hr: float | None = None
    price_high_usd_per_hr: float | None = None
    price_source: str = ""
    price_date: str = ""
    spec_source: str = ""
    notes: str = ""
    # Architecture generation (Ampere, Ada, Hopper, Blackwell, CDNA3, Turing; cpu): the fitted
    # bandwidth efficiencies are per generation (planner.fit); "" = unknown, the fit extrapolates.
    generation: str = ""
    placeholder: bool = False               # figures are not measured/datasheet values
    origin: str = "shipped"                 # shipped | override | user | probe
    overridden: tuple[str, ...] = field(default_factory=tuple)

    @property
    def nvlink(self) -> bool:
        return "nvlink" in self.interconnect.lower()

    @property
    def price_spread(self) -> float | None:
        """high/low price ratio across providers (None when only one price is known)."""
        lo, hi = self.price_low_usd_per_hr, self.price_high_usd_per_hr
        if lo and hi and lo > 0:
            return hi / lo
        return None

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak for a compute dtype: fp32 | fp16 | bf16 | fp8 | fp4 | int8 (None = unsupported)."""
        return {"fp32": self.fp32_tflops, "fp16": self.fp16_tflops, "bf16": self.bf16_tflops,
                "fp8": self.fp8_tflops, "fp4": self.fp4_tflops, "int8": self.int8_tops}[dtype]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["overridden"] = list(self.overridden)
        d["price_spread"] = self.price_spread
        return d


def _num(name: str, raw, problems: list, row: str) -> float | None:
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return None
    try:
        v = float(raw)
    except (TypeError, ValueError):
        problems.append((f"{row}.{name}", f"'{raw}' is not a number"))
        return None
    if math.isnan(v) or math.isinf(v):
        problems.append((f"{row}.{name}", f"{raw} is not a finite number"))
        return None
    if v < 0:
        problems.append((f"{row}.{name}", f"{v:g} is negative"))
        return None
    return v


def _blank(v) -> bool:
    return v is None or (isinstance(v, str) and v.strip() == "")


def _coerce(d: Mapping, row: str, problems: list) -> dict:
    """Typed field values from a CSV row or an override dict; bad cells go to `problems`."""
    out = {}
    known = {f.name for f in fields(GPU)} - {"name", "origin", "overridden"}
    for k, v in d.items():
        if k == "remove":
            continue
        if k not in known:
            problems.append((f"{row}.{k}", f"unknown field; known: {', '.join(sorted(known))}"))
            continue
        if k in _NUM_FIELDS:
            if _blank(v):
                if k in _OPTIONAL_NUM:
                    out[k] = None
                else:
                    problems.append((f"{row}.{k}", "empty; give a number"))
                continue
            x = _num(k, v, problems, row)
            if x is None:
                continue
            if k in ("bf16_tflops", "fp8_tflops", "fp4_tflops", "int8_tops") and x == 0:
                x = None          # 0 = the hardware has no such support
            out[k] = int(x) if k == "max_gpus_per_node" else x
        elif k == "placeholder":
            out[k] = v.strip().lower() in ("1", "true", "yes") if isinstance(v, str) else bool(v)
        else:
            out[k] = "" if v is None else str(v)
    return out


def read_csv(path: str | Path | None = None) -> list[GPU]:
    """The shipped rows, validated (CatalogError lists every bad cell)."""
    p = Path(path) if path else GPUS_PATH
    problems: list[tuple[str, str]] = []
    gpus = []
    with open(p, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            name = (r.get("name") or "").strip()
            if not name:
                problems.append((f"line {i}.name", "empty"))
                continue
            d = _coerce({k: v for k, v in r.items() if k and k != "name"}, name, problems)
            d["name"] = name
            if d.get("kind") == "cpu":
                d["placeholder"] = True
            gpus.append(GPU(**d))
    if problems:
        raise CatalogError(problems)
    return gpus


def normalize_name(name: str) -> str:
    return "".join(ch for ch in (name or "").lower() if ch.isalnum())


def find_gpu(name: str, gpus: Mapping[str, GPU]) -> GPU | None:
    """Case/space/dash-insensitive lookup ('h100-sxm' finds 'H100 SXM'); None if unknown."""
    if name in gpus:
        return gpus[name]
    n = normalize_name(name)
    for k, g in gpus.items():
        if normalize_name(k) == n:
            return g
    return None


def load_gpus(overrides: list[dict] | None = None, probe: Mapping | None = None,
              path: str | Path | None = None) -> dict[str, GPU]:
    """The catalog: shipped CSV, then user overrides, then the measured probe. {name: GPU}.

    Override format (a list of dicts, applied in order; the store saves exactly this):
      {"name": "H100 SXM", "price_usd_per_hr": 2.49, "price_source": "our contract",
       "price_date": "2026-12-01"}
          changes fields of a shipped GPU (any column of data/gpus.csv; name matched loosely).
      {"name": "RTX 4090 (our rack)", "memory_gb": 24, "mem_bw_tbs": 1.008, "fp16_tflops": 165.2,
       "bf16_tflops": 165.2, "fp8_tflops": 330.3, "price_usd_per_hr": 0.34, "generation": "Ada", ...}
          adds a GPU; memory_gb, mem_bw_tbs, fp16_tflops and price_usd_per_hr are required
          (without a generation its plans use extrapolated efficiencies).
      {"name": "T4", "remove": true}
          hides a GPU from planning.
    Numbers must be finite and >= 0; empty or 0 for bf16/fp8/int8 means "not supported".
    Every bad entry is reported together in one CatalogError(problems).

    probe: measured figures of this machine, e.g. {"mem_bw_gbs": 18.2, "memory_gb": 31.3,
    "fp32_tflops": 0.9}; fills the "this machine" row and clears its placeholder flag for what it
    measured (memory from psutil is used when the probe has none).
    """
    gpus = {g.name: g for g in read_csv(path)}
    problems: list[tuple[str, str]] = []
    for i, ov in enumerate(overrides or []):
        if not isinstance(ov, Mapping):
            problems.append((f"overrides[{i}]", f"must be a dict, got {type(ov).__name__}"))
            continue
        name = str(ov.get("name") or "").strip()
        if not name:
            problems.append((f"overrides[{i}].name", "missing: say which GPU this changes or adds"))
            continue
        cur = find_gpu(name, gpus)
        if ov.get("remove"):
            if cur is None:
                problems.append((f"overrides[{i}].name", f"cannot remove unknown GPU '{name}'"))
            else:
                del gpus[cur.name]
            continue
        before = len(problems)
        d = _coerce({k: v for k, v in ov.items() if k != "name"}, name, problems)
        if len(problems) > before:
            continue
        if cur is None:
            missing = [k for k in _REQUIRED_FOR_NEW if k not in d]
            if missing:
                problems.append((f"overrides[{i}]", f"new GPU '{name}' needs {', '.join(missing)}"))
                continue
            d.setdefault("bf16_tflops", d.get("fp16_tflops"))
            g = GPU(name=name, origin="user", overridden=tuple(sorted(d)), **d)
        else:
            g = replace(cur, origin="override", overridden=tuple(sorted(set(cur.overridden) | set(d))), **d)
        if g.kind in GPU_KINDS:
            for k in ("memory_gb", "mem_bw_tbs", "fp16_tflops"):
                if not getattr(g, k) > 0:
                    problems.append((f"overrides[{i}].{k}", f"must be > 0 for GPU '{name}'"))
        gpus.pop(cur.name if cur else name, None)
        gpus[g.name] = g
    if problems:
        raise CatalogError(problems)
    if THIS_MACHINE in gpus:
        gpus[THIS_MACHINE] = apply_probe(gpus[THIS_MACHINE], probe)
    return gpus


def apply_probe(g: GPU, probe: Mapping | None) -> GPU:
    """Fill this machine's row from a measured probe (and psutil for memory)."""
    probe = dict(probe or {})
    upd: dict = {}
    measured = []
    bw = probe.get("mem_bw_gbs")
    if isinstance(bw, (int, float)) and math.isfinite(bw) and bw > 0:
        upd["mem_bw_tbs"] = bw / 1000.0
        measured.append(f"read bandwidth {bw:.1f} GB/s")
    mem = probe.get("memory_gb")
    if not (isinstance(mem, (int, float)) and mem > 0):
        try:
            import psutil
            mem = psutil.virtual_memory().total / 2**30
        except Exception:
            mem = None
    if mem:
        upd["memory_gb"] = float(mem)
        measured.append(f"memory {mem:.1f} GiB")
    for k in ("fp32_tflops", "fp16_tflops", "bf16_tflops"):
        v = probe.get(k)
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            upd[k] = float(v)
            measured.append(f"{k} {v:g}")
    if not upd:
        return g
    placeholder = "mem_bw_tbs" not in upd
    src = "measured on this machine: " + ", ".join(measured)
    if placeholder:
        src += "; read bandwidth is still a PLACEHOLDER (run the lab's bandwidth probe)"
    return replace(g, origin="probe", placeholder=placeholder, spec_source=src, **upd)


def probe_from_records(records: Iterable[Mapping]) -> dict:
    """A probe dict from the lab's CPU run records: median measured read bandwidth."""
    bws = []
    for r in records or []:
        try:
            if (r.get("machine") or {}).get("device", "cpu") != "cpu":
                continue
            bw = (r.get("metrics") or {}).get("mem_bw_gbs")
        except AttributeError:
            continue
        if isinstance(bw, (int, float)) and math.isfinite(bw) and bw > 0:
            bws.append(float(bw))
    if not bws:
        return {}
    bws.sort()
    return {"mem_bw_gbs": bws[len(bws) // 2]}


def price_table(gpus: Mapping[str, GPU]) -> list[dict]:
    """Rows for the UI: reference price, provider spread, $/month for one GPU, with sources."""
    rows = []
    for g in gpus.values():
        rows.append({"gpu": g.name, "usd_per_hr": g.price_usd_per_hr, "low": g.price_low_usd_per_hr,
                     "high": g.price_high_usd_per_hr, "spread": g.price_spread,
                     "usd_per_month": g.price_usd_per_hr * HOURS_PER_MONTH, "source": g.price_source,
                     "date": g.price_date, "origin": g.origin})
    return rows
