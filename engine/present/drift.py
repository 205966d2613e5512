"""Drift canaries: a run whose speed, acceptance or quality moved beyond the interval of the stored run of the
same setup on the same machine, and what changed between the two.

Same setup: the model, precision (with its group), draft (kind, model, precision, gamma), batch size, workload,
tokens per answer and sampling; the quantization method is left out, so a run that changed only its method is
compared and the change named. Same machine: the device, CPU model and cores (and the GPU, where there is one).
The earlier run is the newest stored one before this run. A figure has moved when this run's value lies outside
the earlier run's 95% interval (metrics.intervals: decode tok/s over repetitions, acceptance over prompts; KLD
mean +/- 1.96 standard errors); a figure without an interval on the earlier run is not judged. What changed:
the lab's commit, library versions, machine facts (SIMD, threads, memory, OS), the method and the kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.common import fields as F
from engine.common.fields import M, Q
from engine.common.paired import Z95
from engine.common.record_setup import calibration_of, setup_from_record
from engine.common.vocab import canonical_model_name
from engine.present.columns import _interval, num

KINDS = ("bench", "generate", "playground", "quality")
# (what the flag calls it, the metric's path in the record, its unit)
WATCHED = (("decode tok/s", M.decode_tok_s, "tok/s"), ("acceptance", f"{M.spec}.acceptance_rate", ""),
           ("KLD mean", f"quality.{Q.kld_mean}", "nats/token"))
RUN_FIELDS = ("batch_size", "max_new_tokens", "workload", "sampling", "chat", "prompt")
MACHINE_FIELDS = ("device", "cpu_model", "cores", "gpu_name")


@dataclass
class Drift:
    """One run's figure outside the interval of the earlier run of its setup on its machine."""

    run_id: str
    label: str
    metric: str
    value: float
    before: float
    interval: tuple[float, float]
    before_run: str
    before_at: str
    changed: list[str] = field(default_factory=list)

    @property
    def words(self) -> str:
        d = 100 * (self.value - self.before) / self.before if self.before else float("nan")
        what = "; ".join(self.changed) if self.changed else "nothing recorded changed (the machine's load?)"
        return (f"{self.label}: {self.metric} {self.value:.4g} is outside the 95% interval [{self.interval[0]:.4g}, "
                f"{self.interval[1]:.4g}] of run {self.before_run} ({self.before_at[:16]}, {self.before:.4g}; "
                f"{d:+.1f}%). What changed: {what}")


def _run_field(rec, k):
    c = rec.config or {}
    rc = c.get("run_config") if isinstance(c.get("run_config"), dict) else {}
    return c.get(k, rc.get(k))


def setup_key(rec) -> tuple | None:
    """What makes two runs the same setup (the method left out, so a change of method is named), or None for a
    record the canaries do not watch."""
    if rec.kind not in KINDS:
        return None
    try:
        s = setup_from_record(rec.config or {})
    except Exception:
        return None
    draft = (s.draft, canonical_model_name(s.draft_model) if s.draft == "model" else None,
             s.draft_precision if s.draft in ("model", "self") else None, s.gamma if s.speculative else None,
             s.spec_policy if s.speculative else None)
    run = tuple(repr(_run_field(rec, k)) for k in RUN_FIELDS)
    return (rec.kind == "quality", canonical_model_name(s.model), s.precision,
            s.group_size if s.precision == "int4" else None, draft, run)


def machine_key(rec) -> tuple:
    m = rec.machine or {}
    return tuple(repr(m.get(k)) for k in MACHINE_FIELDS)


def interval(rec, path: str) -> tuple[float, float] | None:
    """The 95% interval of the figure at `path` in the record (columns' reading of metrics.intervals; KLD mean
    +/- 1.96 standard errors), or None."""
    iv = _interval(path)(rec, None)
    if iv is None and path == f"quality.{Q.kld_mean}":
        v, err = _value(rec, path), _value(rec, f"quality.{Q.kld_mean_err}")
        if v is not None and err is not None:
            return v - Z95 * err, v + Z95 * err
    return iv


def _value(rec, path: str) -> float | None:
    return num(F.get(rec.metrics or {}, path))


def changes(before, after) -> list[str]:
    """What differs between two runs' records: the lab's commit, libraries, machine facts, method, kernels."""
    out = []
    vb, va = before.versions or {}, after.versions or {}
    for k in sorted(set(vb) | set(va)):
        if vb.get(k) != va.get(k):
            out.append(f"{'the lab commit' if k == 'lab' else k} {vb.get(k)} -> {va.get(k)}")
    mb, ma = before.machine or {}, after.machine or {}
    for k in sorted(set(mb) | set(ma)):
        if k not in MACHINE_FIELDS and mb.get(k) != ma.get(k):
            out.append(f"machine {k} {mb.get(k)} -> {ma.get(k)}")
    sb, sa = setup_from_record(before.config or {}), setup_from_record(after.config or {})
    if sb.method != sa.method:
        out.append(f"precision method {sb.method} -> {sa.method}")
    calb, cala = calibration_of(before.config), calibration_of(after.config)
    (vb, cb), (va, ca) = (calb.get("version"), calb.get("codes")), (cala.get("version"), cala.get("codes"))
    if vb != va and sb.method == sa.method:
        out.append(f"calibration {sb.method} version {vb or 'not recorded'} -> {va or 'not recorded'}")
    elif cb != ca and cb and ca:  # the same version and key, calibrated under other float rounding
        out.append(f"calibration {sb.method} codes {cb} -> {ca}")
    kb, ka = _run_field(before, "kernel_settings"), _run_field(after, "kernel_settings")
    if kb != ka and kb is not None and ka is not None:
        diff = sorted(k for k in set(kb) | set(ka) if kb.get(k) != ka.get(k))
        out.append("kernel settings " + ", ".join(f"{k} {kb.get(k)} -> {ka.get(k)}" for k in diff))
    kern_b, kern_a = before.kernels or {}, after.kernels or {}
    pb, pa = kern_b.get("path"), kern_a.get("path")
    if pb != pa and pb and pa:
        out.append(f"kernel path {pb} -> {pa}")
    if "int4_activations" in kern_b and "int4_activations" in kern_a:  # both name their CPU kernels' activations
        # int8 weights took fp32 activations until the key existed (session 39)
        ab, aa = kern_b.get("int8_activations", "fp32"), kern_a.get("int8_activations", "fp32")
        if ab != aa:
            out.append(f"int8 weights' activations {ab} -> {aa}")
    return out


def drifts(shown, stored) -> list[Drift]:
    """The watched figures of the `shown` runs that moved beyond the interval of the newest earlier stored run of
    the same setup on the same machine (`stored`: the store's records, any order)."""
    by_key: dict[tuple, list] = {}
    for r in stored:
        k = setup_key(r)
        if k is not None:
            by_key.setdefault((k, machine_key(r)), []).append(r)
    out = []
    for r in shown:
        k = setup_key(r)
        if k is None:
            continue
        earlier = [x for x in by_key.get((k, machine_key(r)), ())
                   if x.run_id != r.run_id and str(x.created_at) < str(r.created_at)]
        if not earlier:
            continue
        prev = max(earlier, key=lambda x: str(x.created_at))
        for name, path, _unit in WATCHED:
            v, b, iv = _value(r, path), _value(prev, path), interval(prev, path)
            if v is None or b is None or iv is None or iv[0] <= v <= iv[1]:
                continue
            out.append(Drift(r.run_id, r.label, name, v, b, iv, prev.run_id, str(prev.created_at),
                             changes(prev, r)))
    return out
