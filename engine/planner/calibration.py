"""What the lab's run records say: bandwidth fractions per (device, precision), prefill FLOP rates,
the decode step's FLOP rate at batch > 1 under load, and measured acceptance rates.

Records arrive as plain dicts (RunRecord.to_dict()); the planner never opens the store itself.
Missing keys are tolerated: a record that cannot be used is listed in `Calibration.skipped` with
the reason, and nothing raises.

Acceptance transfers only between runs with the same target and draft relation: the same target
model and draft kind (and, for a model draft, the same draft model). A run whose draft is its own
target at the same precision accepts every token (1.0) and is ignored.

Load records (kind "load", our server under concurrent requests) give the step time at batch > 1:
see `BatchFit` and `calibrate`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

from engine.common.errors import UserError
from engine.common.fields import L, M, S
from engine.common.record_setup import base_precision, setup_from_record
from engine.common.vocab import PRECISIONS, canonical_model_name
from engine.planner import counts, shapes
from engine.planner.acceptance import acceptance_from_mean_length, relation
from engine.planner.efficiency import FAMILIES
from engine.planner.quality_budget import QualityTable, measured_quality
from engine.planner.shapes import ModelShape, ShapeError

IDENTICAL_DRAFT = ("draft identical to its target (same model and precision): its acceptance of 1.0 says "
                   "nothing about drafting")


@dataclass(frozen=True)
class Fit:
    """Least-squares fit of the effective bandwidth fraction for one precision."""

    precision: str
    mem_bw_frac: float
    n: int
    overhead_s: float
    residuals: tuple[float, ...]      # (measured - fitted) / measured time per token, per record
    run_ids: tuple[str, ...]

    @property
    def rmse_rel(self) -> float:
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals)) if self.residuals else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rmse_rel"] = self.rmse_rel
        return d


@dataclass(frozen=True)
class AcceptanceObs:
    """One speculative run's acceptance, with the target/draft relation it was measured on."""

    model: str
    draft_kind: str
    draft_model: str | None
    acceptance_rate: float
    gamma: float
    mean_acceptance_length: float | None
    run_id: str
    drafted: int = 1                 # draft tokens behind the rate (the weight in averages)
    draft_precision: str | None = None
    precision: str | None = None     # the target's

    @property
    def identical(self) -> bool:
        """Draft = target: a model draft of the same model at the target's precision (None = the
        target's, as SpecConfig reads it), or a self draft at the target's precision."""
        if self.draft_kind not in ("model", "self") or self.precision is None:
            return False
        if self.draft_kind == "model" and not _same_model(self.draft_model, self.model):
            return False
        default = self.precision if self.draft_kind == "model" else "int4"   # the lab's self-draft default
        return (self.draft_precision or default) == self.precision

    @property
    def relation(self) -> str:
        return relation(self.model, self.draft_kind, self.draft_model)

    def matches(self, model: str | None, draft_kind: str | None, draft_model: str | None = None) -> bool:
        """Same target and draft relation. A model draft must be the same draft model (when given)."""
        if self.identical or not _same_model(self.model, model) or self.draft_kind != draft_kind:
            return False
        return draft_kind != "model" or draft_model is None or _same_model(self.draft_model, draft_model)


@dataclass(frozen=True)
class BatchFit:
    """The decode step against batch size, from load records of the lab's server on this machine.

    points: (batch, step seconds, run id) with batch = the mean sequences in flight (Little's law,
    capped at the server's slots) and step = the median inter-token latency of a request less the
    prefills of other requests it shared its decode with, at the lab's measured prefill rate
    (`_LoadPoint.decode_step`: the queueing models add those prefills back). decode_tflops = median over points at
    batch > 1 of batch * FLOPs per token / (step - fixed overhead): the FLOP rate the step reached,
    the roofline's compute side for batched decode. t(B) = intercept + slope * B is the least-squares
    line through the points (None with fewer than two distinct batches); where that line does not rise
    (or leaves no weights term), it passes through the batch-1 point at the batched rate instead (`anchored`)."""

    device: str
    precision: str
    model: str
    decode_tflops: float
    points: tuple[tuple[float, float, str], ...]
    intercept_s: float | None = None
    slope_s: float | None = None
    flops_per_token: float | None = None    # mean over the points (matmuls + attention at their context)
    overhead_s: float = 0.0                 # the kernel family's fixed step cost, taken off the intercept
    anchored: bool = False                  # the points' own line did not rise: through the batch-1 point at the rate

    @property
    def line(self) -> tuple[float, float] | None:
        """(seconds per step for the weights, seconds per sequence) of the fitted line, the family's
        overhead taken off the intercept; None unless both are positive (a line that says nothing)."""
        if self.slope_s is None or self.intercept_s is None or not self.flops_per_token:
            return None
        weights = self.intercept_s - self.overhead_s
        return (weights, self.slope_s) if weights > 0 and self.slope_s > 0 else None

    @property
    def n(self) -> int:
        return sum(1 for b, _, _ in self.points if b > BATCHED)

    def step_s(self, batch: float) -> float | None:
        """The fitted step time at `batch` (None without a line)."""
        if self.slope_s is None or self.intercept_s is None:
            return None
        return self.intercept_s + self.slope_s * batch

    def words(self) -> str:
        line = (f"; step {self.intercept_s * 1e3:.1f} ms + {self.slope_s * 1e3:.1f} ms per sequence"
                if self.slope_s is not None and self.intercept_s is not None else "")
        if line and self.anchored:
            line += (" (the points' own line did not rise: through the batch-1 point, else their mean, at their "
                     "batched rate)")
        return (f"batched decode {self.decode_tflops:.3g} TFLOP/s measured under load ({self.n} load point(s) of "
                f"{self.model}, batch up to {max(b for b, _, _ in self.points):.1f}{line})")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(n=self.n, words=self.words())
        return d


BATCHED = 1.5  # a point whose mean in-flight count is above this ran at batch > 1


def _same_model(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and canonical_model_name(a) == canonical_model_name(b)


@dataclass(frozen=True)
class Calibration:
    """What the lab's records say: bandwidth fractions per (device, precision) and acceptance rates."""

    fits: Mapping[tuple[str, str], Fit] = field(default_factory=dict)      # (device, precision) -> Fit
    acceptance: tuple[AcceptanceObs, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()                               # (run_id, reason)
    machine_bw_gbs: float | None = None
    # (device, precision) -> median prefill FLOP rate the lab achieved (TFLOP/s), from ttft records
    prefill_tflops: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # (device, precision) -> the decode step against batch size, from load records
    batch: Mapping[tuple[str, str], BatchFit] = field(default_factory=dict)
    # per model, each configuration's measured KLD and pass@1 against the fp32 reference (a quality budget's input)
    quality: QualityTable = field(default_factory=QualityTable)

    def fit_for(self, device: str, precision: str) -> Fit | None:
        return self.fits.get((device, precision))

    def decode_line_for(self, device: str, precision: str) -> BatchFit | None:
        """The measured decode step against batch (a load-record line that says something), or None."""
        bf = self.batch.get((device, precision))
        return bf if bf is not None and bf.line is not None else None

    def prefill_for(self, device: str, precision: str) -> tuple[float, str] | None:
        """(TFLOP/s, where it comes from) of prefill as the lab measured it (bench records' prefill, else
        load records' time to first token at concurrency 1); None when it measured neither."""
        pf = self.prefill_tflops.get((device, precision))
        if pf:
            return pf, f"prefill {pf:.3g} TFLOP/s measured"
        return None

    def compute_for(self, device: str, precision: str) -> tuple[float, str] | None:
        """(TFLOP/s the lab's steps reached, where it comes from) for the roofline's compute side:
        batched decode under load where load records give it (what sets capacity when many requests
        share a step), else prefill; None when the lab measured neither."""
        bf = self.batch.get((device, precision))
        if bf is not None:
            return bf.decode_tflops, bf.words()
        pf = self.prefill_tflops.get((device, precision))
        return (pf, f"prefill {pf:.3g} TFLOP/s measured") if pf else None

    def acceptance_for(self, model: str | None = None, draft_kind: str | None = None,
                       draft_model: str | None = None) -> tuple[float, float, int, str] | None:
        """Mean measured acceptance (a, gamma, n, description) over the runs with the same target and
        draft relation (weighted by drafted tokens); None when the lab has none (never a borrowed one)."""
        t = [o for o in self.acceptance if o.matches(model, draft_kind, draft_model)]
        if not t:
            return None
        wsum = sum(o.drafted for o in t)
        a = sum(o.acceptance_rate * o.drafted for o in t) / wsum
        g = sum(o.gamma * o.drafted for o in t) / wsum
        kinds = sorted({o.relation for o in t})
        return a, g, len(t), f"measured by the lab ({len(t)} run(s): {', '.join(kinds)})"

    def why_no_acceptance(self, model: str | None, draft_kind: str | None, draft_model: str | None = None) -> str:
        """Why acceptance_for found nothing, in words, for the plan's explanation."""
        others = sorted({o.relation for o in self.acceptance if not o.identical})
        ignored = sum(1 for _, r in self.skipped if r == IDENTICAL_DRAFT) + sum(o.identical for o in self.acceptance)
        parts = []
        if others:
            parts.append(f"the lab measured {', '.join(others)}: acceptance transfers only to the same target "
                         "and draft")
        if ignored:
            parts.append(f"{ignored} run(s) whose draft was the target itself ignored")
        return "; ".join(parts) or "the lab's records hold no speculative run"

    def draft_precision_for(self, model: str | None, draft_kind: str | None) -> str | None:
        """The draft precision the lab measured most for this target and draft kind."""
        ps = [o.draft_precision for o in self.acceptance if o.matches(model, draft_kind) and o.draft_precision]
        return max(set(ps), key=ps.count) if ps else None

    def to_dict(self) -> dict:
        return {"fits": [{"device": d, **f.to_dict()} for (d, _), f in self.fits.items()],
                "prefill_tflops": [{"device": d, "precision": p, "tflops": v}
                                   for (d, p), v in self.prefill_tflops.items()],
                "acceptance": [asdict(o) for o in self.acceptance],
                "batch": [bf.to_dict() for bf in self.batch.values()],
                "skipped": [{"run_id": r, "reason": w} for r, w in self.skipped],
                "machine_bw_gbs": self.machine_bw_gbs,
                "quality": {m: [q.to_dict() for q in rows] for m, rows in self.quality.by_model.items()}}


def _get(d, *keys, default=None):
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return default
        d = d[k]
    return d


def _finite_pos(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def record_precision(cfg: Mapping) -> str:
    """The precision of a record's config: config.quant.precision, else config.precision without
    the label's group suffix ('int4-g64' -> 'int4')."""
    return base_precision(_get(cfg, "quant", "precision") or cfg.get("precision") or "")


def _model_name(name, models: Mapping[str, ModelShape]) -> str:
    """A record's model as the catalog names it (a hub id or alias resolves), else its canonical name."""
    try:
        return shapes.get_model(str(name), models).name
    except ShapeError:
        return canonical_model_name(str(name))


def record_bytes_per_token(rec: Mapping, models: Mapping[str, ModelShape] | None = None) -> float | None:
    """Bytes a decode token reads, from a run record: metrics.bytes_per_token if present, else
    weight_bytes (or computed from the model shape) + KV bytes read (half the allocated cache,
    the mean over a run that fills it)."""
    m = rec.get("metrics") or {}
    bpt = m.get(M.bytes_per_token)
    if _finite_pos(bpt):
        return float(bpt)
    wb = m.get(M.weight_bytes)
    if not _finite_pos(wb):
        try:
            shape = shapes.get_model(_get(rec, "config", "model") or "", models)
        except ShapeError:
            return None
        cfg = rec.get("config") or {}
        base = "fp32" if _get(rec, "machine", "device", default="cpu") == "cpu" else None
        try:  # the quantization options as the record's setup states them, whichever schema stored it
            setup = setup_from_record(cfg)
            wb = counts.decode_read_bytes(shape, record_precision(cfg), 1, bool(setup.quantize_embeddings),
                                          bool(setup.quantize_head), int(setup.group_size), base_dtype=base)
        except (ShapeError, UserError, TypeError, ValueError):
            return None
    kv = m.get(M.kv_bytes)
    batch = _get(rec, "config", "batch_size", default=1) or 1
    kv_read = 0.5 * float(kv) / batch if _finite_pos(kv) else 0.0
    return float(wb) + kv_read


def _acceptance_obs(rec: Mapping, rid: str, models) -> AcceptanceObs | str:
    """The acceptance a speculative record measured, or why it has none usable."""
    cfg, spec = rec.get("config") or {}, (rec.get("metrics") or {}).get(M.spec)
    a = spec.get(S.acceptance_rate)
    g = spec.get(S.gamma) or spec.get(S.mean_gamma) or _get(cfg, "draft", "gamma")
    mal = spec.get(S.mean_acceptance_length)
    if not _finite_pos(a) and _finite_pos(mal) and _finite_pos(g):
        a = acceptance_from_mean_length(float(mal), float(g))
    if not (isinstance(a, (int, float)) and 0 <= a <= 1 and _finite_pos(g)):
        return "speculative record without a usable acceptance_rate/gamma"
    dm, dp = _get(cfg, "draft", "model"), _get(cfg, "draft", "precision")
    drafted = spec.get(S.drafted)
    obs = AcceptanceObs(_model_name(cfg.get("model") or "?", models),
                        str(spec.get(S.draft_kind) or _get(cfg, "draft", "kind") or "model"),
                        _model_name(dm, models) if dm else None, float(a), float(g),
                        float(mal) if _finite_pos(mal) else None, rid,
                        int(drafted) if _finite_pos(drafted) else 1,
                        base_precision(dp) if dp else None, record_precision(cfg) or None)
    return IDENTICAL_DRAFT if obs.identical else obs


def calibrate(records: Iterable[Mapping], fit_overhead: bool = False, overhead_s: float = 0.0,
              models: Mapping[str, ModelShape] | None = None) -> Calibration:
    """Fit the effective bandwidth fraction per (device, precision) from the lab's run records.

    Model: seconds per token t_i = x_i / (f * BW_i) + c, with x_i the bytes a token reads and BW_i
    the machine's measured read bandwidth. Least squares through the origin gives 1/f =
    sum(z*y)/sum(z^2), z = x/BW, y = t - c; with fit_overhead (and >= 3 records of different sizes)
    c is fitted too (clamped >= 0). Residuals are relative errors of the fitted time per token.
    Speculative records are not used for bandwidth (drafting is in their time) but give acceptance
    rates. Records missing what a fit needs are listed in `skipped` with the reason; nothing raises.

    Load records of the lab's server without a draft give, per (device, precision), the decode
    step against batch size (`BatchFit`): its FLOP rate at batch > 1 replaces the prefill rate as
    the compute side of plans on that device (`Calibration.compute_for`), and the plan's efficiency
    term says so. Other servers' load records, and speculative ones, are skipped with the reason
    (a speculative one with server counters still gives its acceptance).
    """
    models = models if models is not None else shapes.load_models()
    records = list(records or [])
    groups: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    prefill: dict[tuple[str, str], list[float]] = {}
    acc: list[AcceptanceObs] = []
    loads: dict[tuple[str, str, str, int], list[tuple[_LoadPoint, str]]] = {}
    skipped: list[tuple[str, str]] = []
    bws: list[float] = []
    for i, rec in enumerate(records or []):
        if not isinstance(rec, Mapping):
            skipped.append((f"#{i}", "not a record dict"))
            continue
        rid = str(rec.get("run_id") or f"#{i}")
        cfg, met = rec.get("config") or {}, rec.get("metrics") or {}
        device = str(_get(rec, "machine", "device") or cfg.get("device") or "cpu")
        device = "cuda" if device.startswith("cuda") else device
        prec = record_precision(cfg)
        if rec.get("kind") in ("quality", "accuracy"):
            continue  # no speed to fit: measured_quality reads them (a quality budget's input)
        if rec.get("kind") == "load" and not isinstance(met.get(M.spec), Mapping):
            pt = _load_point(rec, models)
            if isinstance(pt, str):
                skipped.append((rid, pt))
            else:
                loads.setdefault((device, prec, pt.model, pt.layers), []).append((pt, rid))
                pf = _load_prefill_tflops(rec, pt, models)
                if pf:
                    prefill.setdefault((device, prec), []).append(pf)
            continue
        if isinstance(met.get(M.spec), Mapping):
            obs = _acceptance_obs(rec, rid, models)
            if isinstance(obs, str):
                skipped.append((rid, obs))
            else:
                acc.append(obs)
            continue
        if prec not in PRECISIONS:
            skipped.append((rid, f"unknown precision '{prec}'"))
            continue
        tok_s, bw = met.get(M.decode_tok_s), met.get(M.mem_bw_gbs)
        if not _finite_pos(tok_s):
            skipped.append((rid, "no decode_tok_s"))
            continue
        if not _finite_pos(bw):
            skipped.append((rid, "no mem_bw_gbs (the machine's measured read bandwidth)"))
            continue
        pf = _record_prefill_tflops(rec, models)
        if pf:
            prefill.setdefault((device, prec), []).append(pf)
        x = record_bytes_per_token(rec, models)
        if x is None:
            skipped.append((rid, "cannot tell bytes per token (no bytes_per_token/weight_bytes, unknown model)"))
            continue
        if device == "cpu":
            bws.append(float(bw))
        groups.setdefault((device, prec), []).append((x / (bw * 1e9), 1.0 / tok_s, rid))
    fits = {}
    for key, pts in groups.items():
        z = [p[0] for p in pts]
        t = [p[1] for p in pts]
        c = overhead_s
        if fit_overhead and len(pts) >= 3 and max(z) > 1.05 * min(z):
            n = len(pts)
            zm, tm = sum(z) / n, sum(t) / n
            szz = sum((a - zm) ** 2 for a in z)
            slope = sum((a - zm) * (b - tm) for a, b in zip(z, t)) / szz
            c = max(0.0, tm - slope * zm)
        y = [b - c for b in t]
        szz = sum(a * a for a in z)
        inv_f = sum(a * b for a, b in zip(z, y)) / szz
        if inv_f <= 0:
            continue
        f = 1.0 / inv_f
        res = tuple((b - (a / f + c)) / b for a, b in zip(z, t))
        fits[key] = Fit(key[1], f, len(pts), c, res, tuple(p[2] for p in pts))
    bws.sort()
    pf_med = {k: sorted(v)[len(v) // 2] for k, v in prefill.items()}
    batch: dict[tuple[str, str], BatchFit] = {}
    for (dev, prec, model, layers), got in loads.items():
        pf = pf_med.get((dev, prec))
        shape = shapes.get_model(model, models)
        pts = [(pt.batch, pt.decode_step(counts.prefill_flops(shape, pt.prompt) / (pf * 1e12) if pf else 0.0),
                rid, pt.flops) for pt, rid in got]
        bf = _batch_fit(dev, prec, model, layers, pts)
        if bf is None:
            skipped += [(p[2], "load point at batch 1 only: nothing to say about batch > 1") for p in pts]
        elif (dev, prec) not in batch or bf.n > batch[(dev, prec)].n:  # one model per precision: the best measured
            batch[(dev, prec)] = bf
    return Calibration(fits, tuple(acc), tuple(skipped), bws[len(bws) // 2] if bws else None, pf_med, batch,
                       measured_quality(records))


LAB_SERVER = "serving-cost-lab"


@dataclass(frozen=True)
class _LoadPoint:
    """What one load record of the lab's server says about its decode step."""

    batch: float            # mean sequences in flight, capped at the server's slots
    itl_s: float            # median inter-token latency of a request
    flops: float            # FLOPs per decode token at the point's mean context
    model: str
    layers: int
    streams: int | None     # closed loop: the concurrency; None for timed arrivals
    request_s: float        # completed requests per second
    prompt: int             # mean prompt tokens of a request
    output: int             # mean output tokens of a request

    def decode_step(self, prefill_s: float) -> float:
        """The decode step alone: the inter-token latency less the prefills of other requests that ran
        while this one decoded, spread over its tokens. Closed loop: each of the other c - 1 users is
        replaced about once per request, so (c - 1) prefills over O - 1 tokens. Timed arrivals: a
        share rate * prefill of the time goes to prefills (the open-loop model's 1 - rho, inverted)."""
        if prefill_s <= 0:
            return self.itl_s
        if self.streams is not None:
            shared = (min(self.streams, max(1, round(self.batch))) - 1) * prefill_s / max(1, self.output - 1)
            return max(self.itl_s - shared, 0.2 * self.itl_s)
        return self.itl_s * max(1.0 - self.request_s * prefill_s, 0.2)


def _load_point(rec: Mapping, models) -> _LoadPoint | str:
    """What a load record of the lab's own server says about its decode step, or why it says nothing."""
    cfg, m = rec.get("config") or {}, _get(rec, "metrics", M.load) or {}
    if cfg.get("system") != LAB_SERVER:
        return f"load record of {cfg.get('system') or 'an unknown server'}: its kernels say nothing about the lab's"
    if cfg.get("draft"):
        return "speculative load record: its steps verify drafts (acceptance comes from its server counters)"
    step, inflight = m.get(L.itl_s_p50), m.get(L.concurrency_mean)
    if not (_finite_pos(step) and _finite_pos(inflight)):
        return "load record without itl_s_p50 and concurrency_mean"
    try:
        shape = shapes.get_model(cfg.get("model") or "", models)
    except ShapeError:
        return f"unknown model '{cfg.get('model')}'"
    slots = _get(cfg, "server", "slots")
    batch = min(float(inflight), float(slots)) if _finite_pos(slots) else float(inflight)
    w = cfg.get("workload") or {}
    n = w.get("requests") or 0
    ctx = ((w.get("prompt_tokens_total") or 0) + 0.5 * (w.get("requested_output_tokens_total") or 0)) / n if n else 0
    flops = counts.flops_per_token(shape, ctx)  # the roofline's formula (sliding windows and MLA included)
    prof = cfg.get("profile") or {}
    streams = int(prof["streams"]) if prof.get("kind") == "concurrent" and prof.get("streams") else None
    return _LoadPoint(batch, float(step), flops, shape.name, shape.layers, streams, float(m.get(L.request_s) or 0.0),
                      round((w.get("prompt_tokens_total") or 0) / n) if n else 0,
                      round((w.get("requested_output_tokens_total") or 0) / n) if n else 0)


def _load_prefill_tflops(rec: Mapping, pt: "_LoadPoint", models) -> float | None:
    """Prefill FLOP rate of a load point at concurrency 1 (no other request shares its prefill):
    prefill FLOPs of the mean prompt over the median time to first token; None at higher concurrency."""
    ttft = (_get(rec, "metrics", M.load) or {}).get(L.ttft_s_p50)
    if pt.batch > BATCHED or not _finite_pos(ttft) or pt.prompt < 1:
        return None
    return counts.prefill_flops(shapes.get_model(pt.model, models), pt.prompt) / float(ttft) / 1e12


def _batch_fit(dev: str, prec: str, model: str, layers: int, pts) -> BatchFit | None:
    fam = FAMILIES["cpu" if dev == "cpu" else "lab-cuda"]
    over = (fam.step_overhead_ms + fam.per_layer_overhead_ms * layers) / 1e3
    rates = sorted(b * f / max(t - over, 1e-9) / 1e12 for b, t, _, f in pts if b > BATCHED)
    if not rates:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    flops, rate = sum(p[3] for p in pts) / len(pts), rates[len(rates) // 2]
    a = slope = None
    anchored = False
    if len({round(x, 3) for x in xs}) >= 2:
        xm, ym = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - xm) * (y - ym) for x, y in zip(xs, ys)) / sum((x - xm) ** 2 for x in xs)
        a = ym - slope * xm
        if slope <= 0 or a <= over:
            # A step cannot cost less at a larger batch. Where the prefills taken out of the points
            # (decode_step) are most of their latency, noise of +-20% can tip the line flat or down
            # (CI, 2026-12-07: 13.6 / 17.0 / 10.0 ms at batch 1 / 3.9 / 7.7). The line then passes
            # through the batch-1 point (nothing taken out of it), else the mean point, and rises at
            # the points' batched FLOP rate: never a fallback to an unmeasured default.
            x0, y0 = min(zip(xs, ys)) if min(xs) <= BATCHED else (xm, ym)
            slope = flops / (rate * 1e12)
            a, anchored = y0 - slope * x0, True
    return BatchFit(dev, prec, model, rate, tuple((b, t, r) for b, t, r, _ in sorted(pts)), a, slope, flops, over,
                    anchored)


def _record_prefill_tflops(rec: Mapping, models) -> float | None:
    """Prefill FLOP rate a record achieved: batch * prefill_flops(prompt per sequence) / prefill_s."""
    m, cfg = rec.get("metrics") or {}, rec.get("config") or {}
    ps, pt = m.get(M.prefill_s), m.get(M.prompt_tokens)
    if not (_finite_pos(ps) and _finite_pos(pt)):
        return None
    try:
        shape = shapes.get_model(cfg.get("model") or "", models)
    except ShapeError:
        return None
    batch = cfg.get("batch_size") or 1
    per_seq = max(1, int(round(pt / batch)))
    return batch * counts.prefill_flops(shape, per_seq) / ps / 1e12
