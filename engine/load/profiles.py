"""Load profiles and SLOs: what a load point asks of the server, parsed from the CLI and validated.

The rate types are GuideLLM's (shared/reference/metrics.md):
- synchronous: one request at a time;
- concurrent: N requests in flight, each stream sending its next request when the last one ends;
- throughput: every request sent at once (the server's saturation; the sweep's upper end);
- constant: requests sent at a fixed rate, whatever the server is doing;
- poisson: the same mean rate with exponential inter-arrival times (seeded);
- sweep: synchronous, then throughput, then constant rates between the two (see sweep.py).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from engine.common.errors import UserError

KINDS = ("synchronous", "concurrent", "throughput", "constant", "poisson", "sweep")
PROFILE_HELP = ("synchronous, concurrent:N, throughput, constant:RATE, poisson:RATE or sweep[:STEPS] "
                "(RATE in requests/s)")
# SLO names -> the per-request sample they bound (seconds).
SLO_KEYS = {"ttft": "ttft_s", "itl": "itl_s", "e2e": "e2e_s"}
SLO_HELP = "comma-separated NAME=SECONDS with NAME in ttft, itl, e2e (e.g. ttft=2,itl=0.05)"
MAX_CONCURRENCY = 1024
MAX_RATE = 10_000.0


@dataclass(frozen=True)
class Profile:
    """One load point's shape: `streams` for synchronous/concurrent/throughput, `rate` for constant/poisson."""

    kind: str
    streams: int | None = None
    rate: float | None = None
    steps: int | None = None  # sweep only: constant rates between synchronous and throughput
    seed: int = 0

    @property
    def label(self) -> str:
        if self.kind == "concurrent":
            return f"concurrent:{self.streams}"
        if self.kind in ("constant", "poisson"):
            return f"{self.kind}:{self.rate:g}/s"
        if self.kind == "sweep":
            return f"sweep:{self.steps}"
        return self.kind

    def to_dict(self) -> dict:
        return asdict(self)

    def send_times(self, n: int) -> list[float] | None:
        """Seconds after the start at which request i is sent (constant, poisson); None: closed loop."""
        if self.kind == "constant":
            return [i / self.rate for i in range(n)]
        if self.kind == "poisson":
            rng, t, out = random.Random(self.seed), 0.0, []
            for _ in range(n):
                out.append(t)
                t += rng.expovariate(self.rate)
            return out
        return None

    def in_flight(self, n: int) -> int | None:
        """How many requests a closed-loop profile keeps in flight (None for a rate profile)."""
        if self.kind == "synchronous":
            return 1
        if self.kind == "concurrent":
            return self.streams
        if self.kind == "throughput":
            return max(1, n)
        return None


def parse_profile(spec: str, seed: int = 0) -> Profile:
    """'concurrent:4' -> Profile('concurrent', streams=4); a clear error for anything else."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError("the load profile is empty", f"use {PROFILE_HELP}")
    kind, _, arg = spec.strip().lower().partition(":")
    kind, arg = kind.strip(), arg.strip()
    if kind not in KINDS:
        raise UserError(f"unknown load profile '{kind}'", f"use {PROFILE_HELP}")
    if kind in ("synchronous", "throughput"):
        if arg:
            raise UserError(f"the {kind} profile takes no value (got '{arg}')", f"write just '{kind}'")
        return Profile(kind, streams=1 if kind == "synchronous" else None, seed=seed)
    if kind == "concurrent":
        n = _number(arg, kind, int)
        if not 1 <= n <= MAX_CONCURRENCY:
            raise UserError(f"concurrency {n} is out of range", f"use concurrent:1 to concurrent:{MAX_CONCURRENCY}")
        return Profile(kind, streams=n, seed=seed)
    if kind == "sweep":
        steps = _number(arg, kind, int) if arg else 4
        if not 1 <= steps <= 20:
            raise UserError(f"a sweep of {steps} rates is out of range", "use sweep:1 to sweep:20")
        return Profile(kind, steps=steps, seed=seed)
    r = _number(arg, kind, float)
    if not (math.isfinite(r) and 0 < r <= MAX_RATE):
        raise UserError(f"rate {arg} requests/s is out of range", f"use {kind}:RATE with 0 < RATE <= {MAX_RATE:g}")
    return Profile(kind, rate=r, seed=seed)


def _number(arg: str, kind: str, typ):
    example = {"concurrent": "concurrent:4", "sweep": "sweep:4"}.get(kind, f"{kind}:2.5")
    if not arg:
        raise UserError(f"the {kind} profile needs a value", f"write it as {example}")
    try:
        return typ(arg)
    except ValueError:
        raise UserError(f"'{arg}' in the {kind} profile is not a {'whole ' if typ is int else ''}number",
                        f"write it as {example}") from None


@dataclass(frozen=True)
class SLO:
    """Per-request latency bounds in seconds (None: not bounded). A request meets the SLO when every bound holds."""

    ttft: float | None = None
    itl: float | None = None
    e2e: float | None = None
    attainment: float = 0.9  # a load point meets the SLO when this share of its requests does (p90-style)

    def to_dict(self) -> dict:
        return asdict(self)

    def bounds(self) -> dict[str, float]:
        """Sample field -> bound, for the bounds that are set."""
        return {SLO_KEYS[k]: v for k, v in (("ttft", self.ttft), ("itl", self.itl), ("e2e", self.e2e))
                if v is not None}

    def met_by(self, sample: dict) -> bool:
        """A completed request met every bound (a failed request meets none)."""
        if not sample.get("ok"):
            return False
        for key, bound in self.bounds().items():
            v = sample.get(key)
            if key == "itl_s" and v is None:
                continue  # a one-token answer has no gap to bound
            if v is None or v > bound:
                return False
        return True

    @property
    def label(self) -> str:
        b = [f"{k}<={v:g}s" for k, v in (("ttft", self.ttft), ("itl", self.itl), ("e2e", self.e2e)) if v is not None]
        return ",".join(b) or "none"


def parse_slo(spec: str | None, attainment: float = 0.9) -> SLO:
    """'ttft=2,itl=0.05' -> SLO(ttft=2.0, itl=0.05); empty or None -> no bounds."""
    if not 0 < attainment <= 1:
        raise UserError(f"SLO attainment {attainment} is out of range", "use a share in (0, 1], e.g. 0.9")
    vals: dict[str, float] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        name, eq, v = part.partition("=")
        name = name.strip().lower()
        if not eq or name not in SLO_KEYS:
            raise UserError(f"SLO term '{part.strip()}' is not understood", f"write the SLO as {SLO_HELP}")
        if name in vals:
            raise UserError(f"the SLO names {name} twice", "give each bound once")
        try:
            x = float(v)
        except ValueError:
            raise UserError(f"SLO {name}={v.strip()} is not a number of seconds", f"write it as {name}=2") from None
        if not (math.isfinite(x) and x > 0):
            raise UserError(f"SLO {name}={v.strip()} must be a positive number of seconds", f"write it as {name}=2")
        vals[name] = x
    return SLO(**vals, attainment=attainment)


@dataclass
class Limits:
    """Bounds on one load point: every loop the client runs stops by itself."""

    requests: int = 32
    max_seconds: float = 600.0  # the whole point; requests not yet sent are not sent after this
    request_timeout_s: float = 300.0
    warmup: int = 0  # requests sent (and dropped) before the measured window

    def validate(self) -> "Limits":
        if not isinstance(self.requests, int) or not 1 <= self.requests <= 100_000:
            raise UserError(f"{self.requests} requests is out of range", "use 1 to 100000 requests")
        if not 0 < self.max_seconds <= 86_400:
            raise UserError(f"max seconds {self.max_seconds} is out of range", "use 1 to 86400 seconds")
        if not 0 < self.request_timeout_s <= 3600:
            raise UserError(f"request timeout {self.request_timeout_s} s is out of range", "use 1 to 3600 seconds")
        if not isinstance(self.warmup, int) or not 0 <= self.warmup <= 1000:
            raise UserError(f"{self.warmup} warm-up requests is out of range", "use 0 to 1000")
        return self
