"""A day policy: which configuration serves each hour of a day of traffic, when changing it pays.

The options are the feasible plans on one GPU kind (precision, speculation, TP; under a quality budget only
those within it, each labelled by its measured configuration). Each hour, option c runs n = ceil(rate /
capacity) replicas (within the autoscaler's bounds) and costs n x TP x $/GPU-hour. Changing configuration is a
scale-up of the new one: its replicas are billed from the hour's start and serve after `scale_up_min` (a model
load), while the previous hour's fleet keeps serving for those minutes, billed too: the switch cost. Speculation
on or off at the same precision and TP is no switch (the draft stays loaded; the server picks its depth per
step). The policy minimises the day's cost (hourly costs plus switch costs, the day repeating: hour 0 follows
hour 23) by dynamic programming over the options; one configuration all day is one of the policies it weighs,
so the policy never costs more than the best single configuration, autoscaled the same way (traffic.fleet_day).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.common.formulas import HOURS_PER_MONTH
from engine.planner.errors import PlanError
from engine.planner.traffic import HOURS, Autoscale, check_profile, day_for_plan, fleet_day


@dataclass(frozen=True)
class Option:
    """One configuration the policy may run: a feasible plan's capacity and price."""

    label: str
    tp: int
    capacity: float          # req/s per replica at the SLOs
    usd_per_gpu_hr: float
    loaded: str              # what a switch must load: precision (and measured configuration) at a TP

    def replicas(self, rate: float, a: Autoscale) -> int:
        n = math.ceil(rate / self.capacity * (1 - 1e-12))
        return max(a.min_replicas, n if a.max_replicas is None else min(a.max_replicas, n))

    def hour_usd(self, rate: float, a: Autoscale) -> float:
        return self.replicas(rate, a) * self.tp * self.usd_per_gpu_hr


def options(plans) -> list[Option]:
    """The feasible plans as options, one per label (the planner's order)."""
    out: dict[str, Option] = {}
    for p in plans:
        if p.feasible and p.max_rate_per_replica:
            out.setdefault(p.label, Option(p.label, p.tp, p.max_rate_per_replica, p.usd_per_hr / p.gpus_total,
                                           f"{p.config or p.precision} at TP {p.tp}"))
    return list(out.values())


@dataclass
class DayPolicy:
    """The configuration and replicas per hour, its cost against the best single configuration's."""

    gpu: str
    rates: list[float]
    hours: list[str]                 # the configuration serving each hour
    replicas: list[int]
    hourly_usd: list[float]
    switches: list[dict] = field(default_factory=list)   # hour, from, to, usd
    missed_minutes: list[float] = field(default_factory=list)
    single: dict = field(default_factory=dict)           # the best single configuration's FleetDay.to_dict()
    scale_up_min: float = 5.0
    notes: list[str] = field(default_factory=list)

    @property
    def switch_usd_per_day(self) -> float:
        return sum(s["usd"] for s in self.switches)

    @property
    def usd_per_day(self) -> float:
        return sum(self.hourly_usd) + self.switch_usd_per_day

    @property
    def single_usd_per_day(self) -> float:
        return self.single["auto_usd_per_month"] * HOURS / HOURS_PER_MONTH

    @property
    def saving_usd_per_day(self) -> float:
        return self.single_usd_per_day - self.usd_per_day

    @property
    def runs(self) -> dict[str, list[int]]:
        """Each configuration the policy uses, and its hours."""
        out: dict[str, list[int]] = {}
        for h, c in enumerate(self.hours):
            out.setdefault(c, []).append(h)
        return out

    @property
    def headline(self) -> str:
        single = self.single["plan"]
        if self.saving_usd_per_day <= 1e-6 * max(self.single_usd_per_day, 1.0):
            return (f"one configuration all day is cheapest: {single} autoscaled, ${self.single_usd_per_day:,.2f}/day; "
                    "changing configuration by hour saves nothing here")
        pct = 100 * self.saving_usd_per_day / self.single_usd_per_day
        uses = "; ".join(f"{c} {_spans(hs)}" for c, hs in self.runs.items())
        return (f"changing configuration by hour costs ${self.usd_per_day:,.2f}/day against "
                f"${self.single_usd_per_day:,.2f} for the best single configuration ({single}, autoscaled): "
                f"${self.saving_usd_per_day:,.2f}/day "
                f"({pct:.1f}%) less, switches included (${self.switch_usd_per_day:,.2f}/day); {uses}")

    def rows(self) -> list[dict]:
        return [{"hour": h, "rate": r, "configuration": c, "replicas": n, "usd": u, "slo_missed_min": m}
                for h, (r, c, n, u, m) in enumerate(zip(self.rates, self.hours, self.replicas, self.hourly_usd,
                                                        self.missed_minutes))]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(usd_per_day=self.usd_per_day, single_usd_per_day=self.single_usd_per_day,
                 saving_usd_per_day=self.saving_usd_per_day, switch_usd_per_day=self.switch_usd_per_day,
                 runs=self.runs, headline=self.headline, rows=self.rows())
        return d


def _spans(hours: list[int]) -> str:
    """[0, 1, 2, 7] -> '0:00-2:59, 7:00-7:59'."""
    out, start = [], None
    for i, h in enumerate(hours):
        if start is None:
            start = h
        if i + 1 == len(hours) or hours[i + 1] != h + 1:
            out.append(f"{start}:00-{h}:59")
            start = None
    return ", ".join(out)


def _switch_usd(prev: Option, prev_rate: float, new: Option, a: Autoscale) -> float:
    """The previous hour's fleet kept serving while the new configuration loads; 0 when nothing loads."""
    if prev.loaded == new.loaded:
        return 0.0
    return prev.hour_usd(prev_rate, a) * a.scale_up_min / 60.0


def day_policy(plans, rates: list[float], autoscale: Autoscale = Autoscale(), gpu: str = "") -> DayPolicy:
    """The cheapest configuration per hour for `rates` among the feasible `plans` (one GPU kind): see the module
    docstring. PlanError when no plan is feasible."""
    rates = check_profile(rates)
    a = autoscale.validate()
    opts = options(plans)
    if not opts:
        raise PlanError("plans", "no configuration meets the SLOs (and the quality budget): nothing to schedule")
    k = len(opts)
    hour = [[o.hour_usd(r, a) for o in opts] for r in rates]
    # switch[h][i][j]: from option i in hour h-1 to option j in hour h (hour 0's from hour 23)
    switch = [[[_switch_usd(opts[i], rates[h - 1], opts[j], a) for j in range(k)] for i in range(k)]
              for h in range(HOURS)]
    best_cost, best_path = math.inf, [0] * HOURS
    for start in range(k):   # the day repeats: fix hour 0's option, close the cycle at the end
        cost = [math.inf] * k
        cost[start] = hour[0][start]
        back: list[list[int]] = []
        for h in range(1, HOURS):
            arg = [min(range(k), key=lambda i: cost[i] + switch[h][i][j]) for j in range(k)]
            cost = [cost[arg[j]] + switch[h][arg[j]][j] + hour[h][j] for j in range(k)]
            back.append(arg)
        for j in range(k):
            total = cost[j] + switch[0][j][start]
            if total < best_cost - 1e-9:
                path = [j]
                for arg in reversed(back):
                    path.append(arg[path[-1]])
                best_cost, best_path = total, path[::-1]
    chosen = [opts[i] for i in best_path]
    switches, missed = [], []
    for h in range(HOURS):
        prev, cur = chosen[h - 1], chosen[h]
        n_prev, n = prev.replicas(rates[h - 1], a), cur.replicas(rates[h], a)
        usd = _switch_usd(prev, rates[h - 1], cur, a)
        if usd:
            switches.append({"hour": h, "from": prev.label, "to": cur.label, "usd": usd})
        short = 0.0
        if rates[h] > n * cur.capacity:
            short = 60.0
        elif prev.loaded != cur.loaded and rates[h] > n_prev * prev.capacity:
            short = float(a.scale_up_min)   # the old fleet carries the hour until the new one serves
        elif prev.loaded == cur.loaded and n > n_prev and rates[h] > n_prev * prev.capacity:
            short = float(a.scale_up_min)
        missed.append(short)
    singles = [fleet_day(rates, o.capacity, o.tp, o.usd_per_gpu_hr, a, o.label) for o in opts]
    single = min(singles, key=lambda d: d.auto_usd_per_month)
    return DayPolicy(gpu, rates, [o.label for o in chosen], [o.replicas(r, a) for o, r in zip(chosen, rates)],
                     [o.hour_usd(r, a) for o, r in zip(chosen, rates)], switches, missed, single.to_dict(),
                     float(a.scale_up_min),
                     [f"{len(opts)} configurations weighed on {gpu or 'the GPU'}; a switch loads the new configuration "
                      f"for {a.scale_up_min:g} min while the previous fleet keeps serving (billed); speculation on "
                      "or off at the same precision and TP is no switch"])


def plan_day(res, best, rates: list[float], autoscale: Autoscale = Autoscale()):
    """(the best plan's day, peak-sized against autoscaled; the day policy over the feasible plans on its GPU): what
    the CLI and the Cost page show for a day of traffic."""
    return (day_for_plan(best, rates, autoscale),
            day_policy([p for p in res.plans if p.gpu == best.gpu], rates, autoscale, best.gpu))
