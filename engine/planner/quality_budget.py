"""A quality budget: the configurations a plan may use, judged by the quality the lab measured for them.

The budget has two limits, either or both:
- `max_kld`: the KL divergence from the fp32 reference, in nats per token, as the statistic `kld_stat` over the
  eval positions: the mean (llama.cpp's mean KLD, the default), the median (what a typical token loses: a few
  outlier positions, such as a requantized GGUF's first tokens, move the mean but not it) or the 99th percentile
  (the tail); a quality record of `python -m engine quality` or `bench --quality`;
- `max_pass_drop`: points of HumanEval pass@1 lost against the reference's own accuracy run on the same problems,
  100 * (lost - gained) / problems (an accuracy record of `python -m engine accuracy`), with McNemar's p beside it.

A configuration is a precision with its method and group (`int4-awq-g32`): the method sets the quality, the group
the bytes. fp32 is the reference (0 by definition). bf16 and fp16 without a record are taken at the reference's
quality, and the plan says so. Speculative decoding is lossless (the lab's drafts are verified token by token), so
a draft costs no quality and every draft is planned at its target's. A precision whose every configuration misses
the budget, or has no record, stays in the table as a plan that cannot be used, with the reason.

Pure: records arrive as dicts (RunRecord.to_dict()), as for the calibration.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

from engine.common.fields import A, PR, Q
from engine.common.paired import compare
from engine.common.record_setup import setup_from_record, stale_calibration
from engine.common.vocab import FLOAT_PRECISIONS, KLD_STATS, OUR_SYSTEMS, canonical_model_name
from engine.planner.errors import PlanError

__all__ = ["QualityBudget", "Measured", "QualityTable", "Verdict", "measured_quality", "judge"]

REFERENCE = "fp32"
# int4 methods that keep some layers above 4 bits: the planner prices int4 at 4 bits plus scales, so it would
# under-count their bytes; they are excluded by name until it prices their layers
MIXED_METHODS = {"gptq-mixed": "keeps the layers its sensitivity measurement picks at int8",
                 "gguf": "keeps the shipped GGUF's Q6_K/Q8_0 tensors at int8"}
KLD_COMMAND = "python -m engine quality --model {model} --precisions int8,int4-awq-g32,int4-gptq-g32,int4"
PASS_COMMAND = ("python -m engine accuracy --model {model} --precisions fp32,int8,int4-awq-g32,int4 "
                "--subset full")


@dataclass(frozen=True)
class QualityBudget:
    max_kld: float | None = None        # nats/token, of the statistic below
    max_pass_drop: float | None = None  # points of pass@1
    kld_stat: str = "mean"              # one of KLD_STATS

    def __bool__(self) -> bool:
        return self.max_kld is not None or self.max_pass_drop is not None

    def words(self) -> str:
        parts = ([f"KLD {self.kld_stat} <= {self.max_kld:g} nats/token"] if self.max_kld is not None else []) + (
            [f"pass@1 drop <= {self.max_pass_drop:g} points"] if self.max_pass_drop is not None else [])
        return " and ".join(parts)


@dataclass(frozen=True)
class Measured:
    """One configuration's measured quality against the fp32 reference, with the runs it comes from."""

    config: str                      # the precision token: 'int4-awq-g32', 'int8', 'fp32'
    precision: str                   # the base precision the planner prices: 'int4'
    method: str = "rtn"
    group_size: int | None = None
    kld_mean: float | None = None
    kld_median: float | None = None
    kld_p99: float | None = None
    kld_run: str | None = None
    kld_tokens: int | None = None
    pass_drop: float | None = None   # points of pass@1 below the reference (negative: above it)
    problems: int | None = None
    lost: int | None = None
    gained: int | None = None
    p_value: float | None = None
    pass_run: str | None = None
    source: str = "measured"         # or 'the reference' / 'assumed at the reference's quality'

    def kld(self, stat: str = "mean") -> float | None:
        """The KL statistic a budget limits ('mean', 'median' or 'p99'), None where the record lacks it."""
        return getattr(self, f"kld_{stat}")

    def words(self, stat: str = "mean") -> str:
        if self.source != "measured":
            return f"{self.config}: {self.source}"
        parts = []
        if self.kld(stat) is not None:
            parts.append(f"KLD {stat} {self.kld(stat):.5f} on {self.kld_tokens or '?'} tokens (run {self.kld_run})")
        elif self.kld_mean is not None:
            parts.append(f"no KLD {stat} in its record (run {self.kld_run}; KLD mean {self.kld_mean:.5f})")
        if self.pass_drop is not None:
            parts.append(f"pass@1 {-self.pass_drop:+.1f} points (lost {self.lost}, gained {self.gained} of "
                         f"{self.problems}, McNemar p {self.p_value:.2g}; run {self.pass_run})")
        if self.precision in FLOAT_PRECISIONS and (self.kld(stat) is None or self.pass_drop is None):
            parts.append("what is not measured taken at the reference's quality")
        return f"{self.config}: " + ("; ".join(parts) or "no quality record")

    def to_dict(self, stat: str = "mean") -> dict:
        return asdict(self) | {"words": self.words(stat)}


@dataclass(frozen=True)
class QualityTable:
    """Per model, each configuration's newest measured quality; the records that could not be used, and why."""

    by_model: Mapping[str, tuple[Measured, ...]] = field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()

    def for_model(self, model: str) -> tuple[Measured, ...]:
        return self.by_model.get(canonical_model_name(model), ())


def _newest_first(records: Iterable[Mapping]) -> list[tuple[str, Mapping]]:
    """(run id, record), newest first by created_at where records carry it (the store's order otherwise)."""
    recs = [(str(r.get("run_id") or f"#{i}"), r) for i, r in enumerate(records or []) if isinstance(r, Mapping)]
    return sorted(recs, key=lambda x: str(x[1].get("created_at") or ""), reverse=True)


def measured_quality(records: Iterable[Mapping]) -> QualityTable:
    """Each of our configurations' newest KLD (on the eval text most of its model's configurations share: KLDs on
    different texts do not compare) and newest pass@1, paired against the newest fp32 accuracy run of the model."""
    kld: dict[str, dict[tuple, tuple]] = {}     # model -> (config, text) -> (kld, tokens, run)
    acc: dict[str, dict[str, tuple]] = {}       # model -> config -> (outcomes, run)
    kinds: dict[str, tuple[str, str, int | None]] = {}
    skipped: list[tuple[str, str]] = []
    for rid, r in _newest_first(records):
        cfg, met = r.get("config") or {}, r.get("metrics") or {}
        q, a = met.get("quality"), met.get("accuracy")
        if not (isinstance(q, Mapping) and q.get(Q.kld_mean) is not None) and not isinstance(a, Mapping):
            continue
        if cfg.get("system") not in OUR_SYSTEMS:
            skipped.append((rid, f"{cfg.get('system')}'s quality: the planner plans the lab's engine"))
            continue
        stale = stale_calibration(cfg)
        if stale:  # another algorithm's codes than the lab's int4 of that name loads now
            skipped.append((rid, f"calibrated by another version ({stale}): measure it again"))
            continue
        s = setup_from_record(cfg)
        model, config = canonical_model_name(s.model), s.precision_token
        kinds[config] = (s.precision, s.method, s.group_size if s.precision == "int4" else None)
        if r.get("kind") == "accuracy" and isinstance(a, Mapping):
            outs = {o[PR.task_id]: bool(o[PR.passed]) for o in a.get(A.outcomes) or []}
            if outs:
                acc.setdefault(model, {}).setdefault(config, (outs, rid))
            else:
                skipped.append((rid, "an accuracy record without per-problem outcomes cannot be paired"))
        elif isinstance(q, Mapping):
            kld.setdefault(model, {}).setdefault((config, q.get(Q.eval_fingerprint)), (
                float(q[Q.kld_mean]), q.get(Q.tokens), rid, q.get(Q.kld_median), q.get(Q.kld_p99)))
    out: dict[str, tuple[Measured, ...]] = {}
    for model in sorted(set(kld) | set(acc)):
        texts: dict = {}
        for (config, text) in kld.get(model, {}):
            texts.setdefault(text, set()).add(config)
        text = max(texts, key=lambda t: len(texts[t])) if texts else None
        for (config, t) in kld.get(model, {}):
            if t != text and config not in texts.get(text, ()):
                skipped.append((kld[model][(config, t)][2], f"{config}: scored on another eval text than the "
                                "model's other configurations"))
        ref = acc.get(model, {}).get(REFERENCE)
        rows = []
        for config in sorted({c for c, t in kld.get(model, {}) if t == text} | set(acc.get(model, {}))):
            prec, method, group = kinds[config]
            row = dict(config=config, precision=prec, method=method, group_size=group)
            k = kld.get(model, {}).get((config, text))
            if k:
                row.update(kld_mean=k[0], kld_tokens=k[1], kld_run=k[2], kld_median=k[3], kld_p99=k[4])
            mine = acc.get(model, {}).get(config)
            if config == REFERENCE and ref:
                row.update(pass_drop=0.0, problems=len(ref[0]), lost=0, gained=0, p_value=1.0, pass_run=ref[1])
            elif mine and ref:
                try:
                    p = compare(ref[0], mine[0])
                except Exception:   # no common problem: UserError from compare
                    skipped.append((mine[1], f"{config}: shares no problem with the fp32 accuracy run {ref[1]}"))
                else:
                    row.update(pass_drop=100.0 * (p.lost - p.gained) / p.problems, problems=p.problems,
                               lost=p.lost, gained=p.gained, p_value=p.p_value, pass_run=mine[1])
            rows.append(Measured(**row))
        out[model] = tuple(rows)
    return QualityTable(out, tuple(skipped))


@dataclass(frozen=True)
class Verdict:
    """What the budget allows for one model: per precision the configuration a plan uses, or why none."""

    budget: QualityBudget
    model: str
    picks: Mapping[str, Measured] = field(default_factory=dict)       # precision -> the configuration planned
    excluded: Mapping[str, str] = field(default_factory=dict)         # precision -> why no configuration
    misses: tuple[tuple[Measured, str], ...] = ()                     # every configuration that missed, and how
    runs: tuple[str, ...] = ()

    def pick(self, precision: str) -> Measured | None:
        return self.picks.get(precision)

    def closest(self) -> Measured | None:
        """The measured quantized configuration nearest the budget (smallest excess), when none meets it."""
        def excess(m: Measured) -> float:
            e = 0.0
            k = m.kld(self.budget.kld_stat)
            if self.budget.max_kld is not None:
                e += (k - self.budget.max_kld) / max(self.budget.max_kld, 1e-12) if k is not None else float("inf")
            if self.budget.max_pass_drop is not None:
                e += max(0.0, (m.pass_drop - self.budget.max_pass_drop) / max(self.budget.max_pass_drop, 1.0)) \
                    if m.pass_drop is not None else float("inf")
            return e
        quant = [m for m, _ in self.misses if m.precision not in FLOAT_PRECISIONS]
        return min(quant, key=excess) if quant else None

    def notes(self, precisions: Iterable[str] | None = None) -> list[str]:
        """The budget, the records, and per precision (those asked, default all) what it allows or why not."""
        asked = set(precisions) if precisions is not None else set(self.picks) | set(self.excluded)
        out = [f"quality budget {self.budget.words()} against the fp32 reference of {self.model} (the lab's records: "
               f"{', '.join(self.runs) or 'none'}); speculation is lossless, so each draft plans at its target's "
               "quality"]
        stat = self.budget.kld_stat
        out += [f"within budget: {m.words(stat)}" for p, m in self.picks.items() if p in asked]
        out += [f"excluded: {p}: {why}" for p, why in self.excluded.items() if p in asked]
        if not any(m.precision not in FLOAT_PRECISIONS for p, m in self.picks.items() if p in asked):
            c = self.closest()
            out.append(f"no measured quantized configuration meets {self.budget.words()}"
                       + (f"; the closest is {c.words(stat)}" if c else ""))
        return out

    def to_dict(self) -> dict:
        c = self.closest()
        stat = self.budget.kld_stat
        return {"budget": asdict(self.budget), "words": self.budget.words(), "model": self.model,
                "picks": {p: m.to_dict(stat) for p, m in self.picks.items()}, "excluded": dict(self.excluded),
                "runs": list(self.runs), "closest": c.to_dict(stat) if c else None}


def _miss(m: Measured, b: QualityBudget) -> str | None:
    """How `m` misses the budget (a limit it exceeds, or a measure it lacks), or None when it meets it. An
    unquantized precision lacking a measure is taken at the reference's for it (Verdict's notes say so)."""
    why = []
    unquantized = m.precision in FLOAT_PRECISIONS
    k = m.kld(b.kld_stat)
    if b.max_kld is not None:
        if k is None:
            why += [] if unquantized else ["no KLD record" if m.kld_mean is None else
                                           f"its KLD record (run {m.kld_run}) lacks the {b.kld_stat}"]
        elif k > b.max_kld:
            why.append(f"KLD {b.kld_stat} {k:.5f} > {b.max_kld:g} (run {m.kld_run})")
    if b.max_pass_drop is not None:
        if m.pass_drop is None:
            why += [] if unquantized else ["no accuracy record paired with the fp32 one"]
        elif m.pass_drop > b.max_pass_drop:
            why.append(f"pass@1 drop {m.pass_drop:.1f} points > {b.max_pass_drop:g} (run {m.pass_run})")
    if not why and m.method in MIXED_METHODS:
        return f"{MIXED_METHODS[m.method]}: the planner prices int4 at 4 bits, so its bytes would be under-counted"
    return "; ".join(why) or None


def judge(table: QualityTable | None, model: str, budget: QualityBudget, precisions: Iterable[str]) -> Verdict:
    """Per precision, the configuration a plan within `budget` uses (for int4, the one with the fewest bytes: the
    largest group, then the lowest KLD), or why none can. Raises PlanError, naming the budget's field and the
    command that measures it, when the lab holds no record of that measure for the model."""
    name = canonical_model_name(model)
    rows = table.for_model(name) if table is not None else ()
    problems = []
    if budget.kld_stat not in KLD_STATS:  # Workload.validate refuses it first; a direct caller here
        raise PlanError([("kld_stat", f"unknown KLD statistic {budget.kld_stat!r}: one of {', '.join(KLD_STATS)}")])
    if budget.max_kld is not None and not any(m.kld_mean is not None for m in rows):
        problems.append(("max_kld", f"no quality (KLD) record of {name} in the lab's runs: measure them with "
                         f"`{KLD_COMMAND.format(model=name)}` (the model's folder or hub id where it is not in the "
                         "lab's catalog)"))
    if budget.max_pass_drop is not None and not any(m.pass_drop is not None for m in rows):
        problems.append(("max_pass_drop", f"no accuracy records of {name} paired with an fp32 one in the lab's runs: "
                         f"measure them with `{PASS_COMMAND.format(model=name)}` (the model's folder or hub id "
                         "where it is not in the lab's catalog)"))
    if problems:
        raise PlanError(problems)
    picks: dict[str, Measured] = {}
    excluded: dict[str, str] = {}
    misses: list[tuple[Measured, str]] = []
    for p in dict.fromkeys(precisions):
        mine = [m for m in rows if m.precision == p]
        ok = []
        for m in mine:
            why = _miss(m, budget)
            if why is None:
                ok.append(m)
            else:
                misses.append((m, why))
        if p == REFERENCE and not any(m.config == REFERENCE for m in ok):
            ok.append(Measured(REFERENCE, REFERENCE, source="the reference (KLD 0, pass@1 drop 0 by definition)"))
        elif p in FLOAT_PRECISIONS and not mine:
            ok.append(Measured(p, p, source="no record: taken at the reference's quality (16-bit floats of its "
                               "weights; measure it with `python -m engine quality`)"))
        if ok:
            picks[p] = max(ok, key=lambda m: (m.group_size or 0, -(m.kld(budget.kld_stat) or 0.0)))
        else:
            excluded[p] = ("; ".join(f"{m.config}: {why}" for m, why in misses if m.precision == p)
                           or "no quality record of this precision")
    runs = tuple(dict.fromkeys(r for m in rows for r in (m.kld_run, m.pass_run) if r))
    return Verdict(budget, name, picks, excluded, tuple(misses), runs)
