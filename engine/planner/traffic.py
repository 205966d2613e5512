"""A day of traffic: an hourly rate profile, and the fleet that serves it, sized for the
peak or autoscaled.

A profile is 24 request rates (req/s), one per hour of the day: a CSV the user uploads (`from_csv`),
or a named shape (`shape`: flat, business-hours, diurnal with a peak-to-trough ratio, bursty).
`fleet_day` takes one deployment's capacity per replica at the SLOs (the planner's `max_rate`, as
`evaluate_plan` computes it) and compares:

- peak-sized: ceil(peak / capacity) replicas all day;
- autoscaled: each hour ceil(rate / capacity) replicas, within [min, max]. A replica added for an hour
  is billed from the hour's start but serves only after the scale-up delay, so an hour whose rate
  exceeds what the replicas already up can carry misses the SLO for those minutes (reported by hour).
  Replicas leave at the end of an hour whose successor needs fewer.

GPU-hours per day = sum over hours of replicas x GPUs per replica; $/month = GPU-hours per day x price x
the planner's days per month (HOURS_PER_MONTH / 24).
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field

from engine.common.formulas import HOURS_PER_MONTH
from engine.planner.errors import PlanError

HOURS = 24
SHAPES = ("flat", "business-hours", "diurnal", "bursty")
MAX_CSV_BYTES = 100_000


def _check_rate(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise PlanError(where, f"must be a finite rate >= 0 requests/s, got {v!r}: fix that hour's rate")
    return float(v)


def check_profile(rates, where: str = "profile") -> list[float]:
    """24 finite, non-negative rates, at least one above 0; PlanError naming the hour otherwise."""
    if not isinstance(rates, (list, tuple)) or len(rates) != HOURS:
        n = len(rates) if isinstance(rates, (list, tuple)) else type(rates).__name__
        raise PlanError(where, f"needs {HOURS} hourly rates (hours 0-23), got {n}")
    out = [_check_rate(r, f"{where}[hour {h}]") for h, r in enumerate(rates)]
    if max(out) <= 0:
        raise PlanError(where, "every hour's rate is 0: give the requests/s of at least one hour")
    return out


def shape(name: str, peak: float, peak_to_trough: float = 4.0) -> list[float]:
    """A named day, its busiest hour at `peak` req/s:
    flat: the peak all day; business-hours: the peak 9:00-17:59, a tenth of it otherwise; diurnal: a
    cosine from the trough at 4:00 to the peak at 16:00, peak / trough = `peak_to_trough`; bursty: a
    fifth of the peak, with the peak at 10:00 and 15:00 and half of it at 20:00."""
    _check_rate(peak, "peak")
    if peak <= 0:
        raise PlanError("peak", f"must be > 0 requests/s, got {peak!r}")
    if name == "flat":
        return [float(peak)] * HOURS
    if name == "business-hours":
        return [peak if 9 <= h <= 17 else peak / 10 for h in range(HOURS)]
    if name == "diurnal":
        if isinstance(peak_to_trough, bool) or not isinstance(peak_to_trough, (int, float)) \
                or not math.isfinite(peak_to_trough) or peak_to_trough < 1:
            raise PlanError("peak_to_trough", f"must be a number >= 1, got {peak_to_trough!r}")
        trough = peak / peak_to_trough
        return [trough + (peak - trough) * (1 - math.cos(2 * math.pi * ((h - 4) % 24) / 24)) / 2 for h in range(HOURS)]
    if name == "bursty":
        burst = {10: peak, 15: peak, 20: peak / 2}
        return [burst.get(h, peak / 5) for h in range(HOURS)]
    raise PlanError("shape", f"unknown traffic shape '{name}'; use one of: {', '.join(SHAPES)}")


def from_csv(data) -> list[float]:
    """An uploaded CSV: a header `hour,rate` (rate in requests/s) and one row per hour 0-23, any order.
    PlanError naming the row and the fix for anything else."""
    if isinstance(data, (bytes, bytearray)):
        if len(data) > MAX_CSV_BYTES:
            raise PlanError("profile", f"the file is {len(data):,} bytes: a day of hourly rates is under "
                            f"{MAX_CSV_BYTES:,}")
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError:
            raise PlanError("profile", "the file is not UTF-8 text: upload a CSV with columns hour,rate") from None
    if not isinstance(data, str) or not data.strip():
        raise PlanError("profile", "the file is empty: upload a CSV with columns hour,rate")
    if "\x00" in data:
        raise PlanError("profile", "the file is not a CSV (it holds binary data): upload a CSV with columns hour,rate")
    rows = list(csv.reader(io.StringIO(data)))
    head = [c.strip().lower() for c in rows[0]] if rows else []
    if head[:2] != ["hour", "rate"]:
        raise PlanError("profile", f"row 1 is {','.join(rows[0])[:60]!r}: the first row must be the header hour,rate")
    rates: dict[int, float] = {}
    for i, r in enumerate(rows[1:], start=2):
        if not r or all(not c.strip() for c in r):
            continue
        if len(r) < 2:
            raise PlanError(f"profile row {i}", f"{','.join(r)[:60]!r} has no rate: write hour,rate")
        try:
            h, v = int(r[0].strip()), float(r[1].strip())
        except ValueError:
            raise PlanError(f"profile row {i}", f"{','.join(r)[:60]!r} is not an hour (0-23) and a rate in "
                            "requests/s") from None
        if not 0 <= h < HOURS:
            raise PlanError(f"profile row {i}", f"hour {h} is not 0-23")
        if h in rates:
            raise PlanError(f"profile row {i}", f"hour {h} appears twice: give each hour once")
        rates[h] = _check_rate(v, f"profile row {i}")
    missing = [h for h in range(HOURS) if h not in rates]
    if missing:
        raise PlanError("profile", f"hours {', '.join(map(str, missing[:8]))}{'...' if len(missing) > 8 else ''} "
                        f"have no rate: give all {HOURS} hours (0-23), one row each")
    return check_profile([rates[h] for h in range(HOURS)])


@dataclass(frozen=True)
class Autoscale:
    """The autoscaler: replicas between min_replicas and max_replicas (None: no ceiling), each taking
    scale_up_min minutes from the decision to serving."""

    min_replicas: int = 1
    max_replicas: int | None = None
    scale_up_min: float = 5.0

    def validate(self) -> "Autoscale":
        probs = []
        if isinstance(self.min_replicas, bool) or not isinstance(self.min_replicas, int) or self.min_replicas < 0:
            probs.append(("min_replicas", f"must be a whole number >= 0, got {self.min_replicas!r}"))
        if self.max_replicas is not None and (isinstance(self.max_replicas, bool)
                                              or not isinstance(self.max_replicas, int) or self.max_replicas < 1
                                              or (isinstance(self.min_replicas, int)
                                                  and self.max_replicas < self.min_replicas)):
            probs.append(("max_replicas",
                          f"must be a whole number >= 1 and >= min_replicas, got {self.max_replicas!r}"))
        s = self.scale_up_min
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 <= s <= 60:
            probs.append(("scale_up_min", f"must be 0 to 60 minutes, got {s!r}"))
        if probs:
            raise PlanError(probs)
        return self


@dataclass
class FleetDay:
    """One deployment over a day: replicas per hour, peak-sized against autoscaled."""

    plan: str                      # the deployment (Plan.label)
    gpus_per_replica: int
    capacity_per_replica: float    # req/s at the SLOs
    usd_per_gpu_hr: float
    rates: list[float]
    peak_replicas: int
    auto_replicas: list[int]
    missed_minutes: list[float] = field(default_factory=list)  # per hour: minutes the autoscaled fleet is short
    notes: list[str] = field(default_factory=list)

    @property
    def peak_gpu_hours(self) -> float:
        return self.peak_replicas * self.gpus_per_replica * HOURS

    @property
    def auto_gpu_hours(self) -> float:
        return sum(self.auto_replicas) * self.gpus_per_replica

    @property
    def peak_usd_per_month(self) -> float:
        return self.peak_gpu_hours * self.usd_per_gpu_hr * HOURS_PER_MONTH / HOURS

    @property
    def auto_usd_per_month(self) -> float:
        return self.auto_gpu_hours * self.usd_per_gpu_hr * HOURS_PER_MONTH / HOURS

    @property
    def missed_hours(self) -> list[int]:
        return [h for h, m in enumerate(self.missed_minutes) if m > 0]

    def rows(self) -> list[dict]:
        return [{"hour": h, "rate": r, "peak_replicas": self.peak_replicas, "auto_replicas": a,
                 "auto_capacity": a * self.capacity_per_replica, "slo_missed_min": m}
                for h, (r, a, m) in enumerate(zip(self.rates, self.auto_replicas, self.missed_minutes))]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(peak_gpu_hours=self.peak_gpu_hours, auto_gpu_hours=self.auto_gpu_hours,
                 peak_usd_per_month=self.peak_usd_per_month, auto_usd_per_month=self.auto_usd_per_month,
                 missed_hours=self.missed_hours, rows=self.rows())
        return d


def fleet_day(rates: list[float], capacity_per_replica: float, gpus_per_replica: int, usd_per_gpu_hr: float,
              autoscale: Autoscale = Autoscale(), plan: str = "") -> FleetDay:
    """The day's fleet for one deployment: see the module docstring."""
    rates = check_profile(rates)
    autoscale = autoscale.validate()
    if not (isinstance(capacity_per_replica, (int, float)) and capacity_per_replica > 0):
        raise PlanError("capacity_per_replica", f"must be > 0 req/s, got {capacity_per_replica!r}")
    need = [math.ceil(r / capacity_per_replica * (1 - 1e-12)) for r in rates]
    peak = max(1, max(need))
    lo, hi = autoscale.min_replicas, autoscale.max_replicas
    auto = [max(lo, n if hi is None else min(hi, n)) for n in need]
    notes = []
    if hi is not None and peak > hi:
        notes.append(f"the peak needs {peak} replicas, the autoscaler stops at {hi}: hours above it miss the SLO "
                     "all hour")
    missed = []
    for h, (r, a) in enumerate(zip(rates, auto)):
        before = auto[h - 1]  # the day repeats: hour 0 follows hour 23
        short = 0.0
        if r > a * capacity_per_replica:
            short = 60.0  # capped below the need: short all hour
        elif a > before and r > before * capacity_per_replica:
            short = float(autoscale.scale_up_min)  # the replicas already up carry it only after the new ones serve
        missed.append(short)
    return FleetDay(plan, gpus_per_replica, capacity_per_replica, usd_per_gpu_hr, rates, peak, auto, missed, notes)


def day_for_plan(p, rates: list[float], autoscale: Autoscale = Autoscale()) -> FleetDay:
    """The day's fleet for a feasible Plan: its capacity per replica at the SLOs (which does not depend on
    the rate planned for), its GPUs per replica (TP) and its price per GPU-hour."""
    if not p.feasible or not p.max_rate_per_replica:
        raise PlanError("plan", f"{p.label} cannot serve this workload: {'; '.join(p.reasons)[:200]}")
    return fleet_day(rates, p.max_rate_per_replica, p.tp, p.usd_per_hr / p.gpus_total, autoscale, p.label)
