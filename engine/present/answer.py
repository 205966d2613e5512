"""The answer first: one summary row for each results page, from the records (or the plan) the page draws.

Baseline -> recommended, $ per 1M output tokens, the share saved with its interval, tokens/s, quality (KLD, pass@1
where measured) and whether speculation pays. The evidence follows on the page; this row repeats none of it in
other words, and states no figure of its own: every number is a record's (or the planner's) figure.

- Runs (Home, Compare, Reports): the baseline is the unquantized run without a draft (bf16, else fp16, else fp32),
  the recommendation the run with the lowest $/1M output (one stream at its batch size). The saving's interval
  takes the ends of both runs' cost intervals (a dearer recommendation at its worst against a cheaper baseline).
- Load test: $/1M output at the SLO; the baseline is our engine's unquantized configuration without a draft (else
  the dearest feasible one), the recommendation the cheapest feasible.
- Cost (the planner): the savings waterfall's baseline and answer, its band as the interval.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.common.vocab import OUR_SYSTEMS
from engine.present.columns import num as _num

UNQUANTIZED = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Cell:
    label: str
    value: str
    note: str = ""          # one short line under the value (what it is against, its interval)
    help: str = ""


@dataclass
class Answer:
    cells: list[Cell] = field(default_factory=list)
    recommended: str = ""   # the configuration (or plan) the page recommends
    baseline: str = ""      # what it is measured against

    def cell(self, label: str) -> Cell:
        return next(c for c in self.cells if c.label == label)

    @property
    def words(self) -> str:
        return f"{self.recommended} instead of {self.baseline}: " + "; ".join(
            f"{c.label} {c.value}" + (f" ({c.note})" if c.note else "") for c in self.cells)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _rate(x: float | None) -> str:
    """Tokens/s as people read them: 1,646 or 25.9."""
    return "n/a" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _saved(base: float, rec: float, base_lo=None, base_hi=None, rec_lo=None, rec_hi=None) -> tuple[str, str]:
    """(the share saved, its interval or why none)."""
    saved = 1 - rec / base
    if None not in (base_lo, base_hi, rec_lo, rec_hi) and base_lo > 0 and base_hi > 0:
        return _pct(saved), f"95% interval {_pct(1 - rec_hi / base_lo)} to {_pct(1 - rec_lo / base_hi)}"
    return _pct(saved), "no interval (one repetition)"


def _is_draft(r) -> bool:
    return r.get("draft") not in (None, "none", "")


def runs_answer(rows) -> Answer | None:
    """The summary of comparison rows (present.comparison_rows with their intervals), or None without a cost."""
    ours = [r for r in rows if r.get("system") in OUR_SYSTEMS and _num(r.get("usd_per_1m_out"))]
    if not ours:
        return None
    plain = [r for r in ours if not _is_draft(r)]
    base = next((r for p in UNQUANTIZED for r in plain if r.get("precision") == p), None) \
        or max(ours, key=lambda r: r["usd_per_1m_out"])
    best = min(ours, key=lambda r: r["usd_per_1m_out"])
    saved, interval = _saved(base["usd_per_1m_out"], best["usd_per_1m_out"],
                             *(_num(base.get(f"usd_per_1m_out_{e}")) for e in ("lo", "hi")),
                             *(_num(best.get(f"usd_per_1m_out_{e}")) for e in ("lo", "hi")))
    tok = _num(best.get("tok_s"))
    lo, hi = _num(best.get("tok_s_lo")), _num(best.get("tok_s_hi"))
    kl = _num(best.get("quality_loss_kl"))
    spec = [r for r in ours if _num(r.get("speedup")) is not None]
    if spec:
        s = max(spec, key=lambda r: r["speedup"])
        lo_s = _num(s.get("speedup_lo"))
        pays = s["speedup"] > 1 and (lo_s is None or lo_s > 1)
        sp = Cell("Speculation", f"pays {s['speedup']:.2f}x" if pays else f"no: {s['speedup']:.2f}x",
                  s["config"], "the best speedup measured against the same target without a draft"
                  + ("" if lo_s is None else f" (95% interval from {lo_s:.2f}x)"))
    else:
        sp = Cell("Speculation", "—", "not measured: no run with a draft")
    same = best is base
    return Answer([
        Cell("$ per 1M output", f"${best['usd_per_1m_out']:.4g}", f"from ${base['usd_per_1m_out']:.4g}",
             "one stream at the measured batch size, at the sidebar's $/hour"),
        Cell("Saved", "0%" if same else saved, "the baseline is the cheapest" if same else interval),
        Cell("Decode tok/s", _rate(tok),
             "" if lo is None or hi is None else f"95% interval {_rate(lo)} to {_rate(hi)}"),
        Cell("Quality", "—" if kl is None else f"KLD {kl:.3g}",
             "not measured" if kl is None else "mean KL divergence from fp32, nats/token"),
        sp], best["config"], base["config"])


def load_answer(records, costs, crossovers=()) -> Answer | None:
    """The summary of a load test's records: load_cost.costs_at_slo's figures (and crossover_pairs' for
    speculation), each configuration's precision and draft read from its records."""
    from engine.present.load_cost import _facts, configurations

    feas = [c for c in costs if c.feasible]
    if not feas:
        return None
    facts = {name: _facts(recs) for name, recs in configurations(records).items()}
    best = min(feas, key=lambda c: c.usd_per_1m_out)
    plain = [c for c in feas if facts[c.configuration]["system"] in OUR_SYSTEMS and not facts[c.configuration]["draft"]]
    base = next((c for p in UNQUANTIZED for c in plain if facts[c.configuration]["precision"] == p), None) \
        or max(feas, key=lambda c: c.usd_per_1m_out)
    saved = 1 - best.usd_per_1m_out / base.usd_per_1m_out
    spec = [x for x in crossovers if x.kind == "speculation"]
    sp = (Cell("Speculation", "pays until " + (f"{spec[0].stops_paying_at:g}" if spec[0].stops_paying_at is not None
                                                 else "the top"), spec[0].candidate, spec[0].verdict[:200])
          if spec and any(spec[0].leads) else
          Cell("Speculation", "no", spec[0].candidate, spec[0].verdict[:200]) if spec else
          Cell("Speculation", "—", "not measured: no configuration with and without a draft"))
    gp = best.point.goodput_tok_s if best.point else None
    return Answer([
        Cell("$ per 1M output at the SLO", f"${best.usd_per_1m_out:.4g}", f"from ${base.usd_per_1m_out:.4g}",
             "goodput at the highest load that met the SLO, at the sidebar's $/hour"),
        Cell("Saved", _pct(saved), "one load sweep: no interval"),
        Cell("Goodput tok/s", _rate(gp),
             f"at {best.axis} {best.point.load:g}" if best.point and best.point.load is not None else ""),
        Cell("Quality", "—", "a load test measures speed: KLD and pass@1 are on Precision"),
        sp], best.configuration, base.configuration)


def plan_answer(sv: dict) -> Answer | None:
    """The summary of the planner's savings answer (planner.savings.Savings.to_dict())."""
    steps = sv.get("steps") or []
    if not steps or not steps[0].get("plan"):
        return None
    base, last = steps[0], steps[-1]
    band = ""
    lo, hi, b = sv.get("saving_low_usd_per_month"), sv.get("saving_high_usd_per_month"), base.get("usd_per_month")
    if lo is not None and hi is not None and b:
        band = f"band {_pct(lo / b)} to {_pct(hi / b)}"
    spec = steps[-1] if steps[-1]["step"] == "+ speculation" else None
    quality = next((s["quality"][:160] for s in steps if s["step"] == "+ quantization" and s.get("quality")), None)
    per_1m = last.get("usd_per_1m_output")
    return Answer([
        Cell("$ per 1M output", "n/a" if per_1m is None else f"${per_1m:.4g}",
             "" if base.get("usd_per_1m_output") is None else f"from ${base['usd_per_1m_output']:.4g}"),
        Cell("Saved", f"{sv.get('saving_pct', 0):.0f}%", band or "no band"),
        Cell("$ per month", f"${last['usd_per_month']:,.0f}" if last.get("usd_per_month") is not None else "n/a",
             f"{last.get('gpus') or '?'} GPU(s)"),
        Cell("Quality", "budgeted" if quality else "—", quality or "not budgeted: plan with a KLD or pass@1 budget"),
        Cell("Speculation", "pays" if spec and spec["taken"] else "no",
             "" if spec is None else spec["cause"][:160])], last["plan"], base["plan"])
