"""The run record: one versioned type that engine, store, dashboard and reports all agree on.

`RunRecord{schema_version, run_id, created_at, kind, config, metrics, machine, versions, kernels,
output, notes}`. The metric names, units and definitions are declared once in fields.py; this
module checks a record against them (pydantic, field by field) and reads older versions.

Schema versions:
- 1: the first record.
- 2: metrics declared in fields.py; two batch > 1 defects fixed. Version 1 divided a per-token
  median by the batch size again, overstating bw_efficiency b times, and its per-token latencies
  were step time over the tokens of all b sequences (1/b of what one user sees). A version-1
  record is read as version 2 with bw_efficiency divided by, and the token latencies multiplied
  by, its batch size; its notes say so. The stored row is never rewritten.
  Workloads and repetitions added fields without changing what an existing one means: a run of
  many generations states each per-generation metric as the median over its samples (fields.py),
  which for a one-generation record is that generation's value; new are samples, baseline_samples,
  intervals, by_category, workload and noise in metrics, the request-weighted acceptance in
  metrics.spec, and workload and reps in config. Still version 2.
- 3: the KL statistics of metrics.quality share llama.cpp's KLD prefix: version 2's kl_mean,
  kl_mean_err, kl_p99 and kl_max are kld_mean, kld_mean_err, kld_p99 and kld_max (the same numbers;
  KL_RENAMES). A version-2 record is read with the new names; the stored row is never rewritten.
  Records are written through fields.Metrics, and the store refuses one with an undeclared field.
"""
from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field as PField, PlainValidator, StrictBool, StrictInt, StrictStr
from pydantic import ValidationError, create_model

from engine.common.errors import UserError
from engine.common.record_setup import calibration_suffix, setup_from_record
from engine.common import fields as F
from engine.common.vocab import RECORD_KINDS

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
FIX = "import a file exported by the lab"


@dataclass
class RunRecord:
    kind: str
    config: dict
    metrics: dict
    machine: dict
    versions: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    output: dict = field(default_factory=dict)
    notes: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False, default=_jsonable)

    @classmethod
    def from_dict(cls, d: dict) -> "RunRecord":
        """Validate (any readable version) and return the record as the current version."""
        return cls(**{k: v for k, v in validate(d).items() if k in cls.__dataclass_fields__})

    @classmethod
    def from_json(cls, s: str) -> "RunRecord":
        try:
            d = json.loads(s)
        except (ValueError, TypeError) as e:
            raise UserError(f"run record is not valid JSON ({e})", "export the record again from the lab") from None
        return cls.from_dict(d)

    @property
    def label(self) -> str:
        return self._label(self.config) + calibration_suffix(self.config)

    def _label(self, c: dict) -> str:
        if self.kind in ("peer", "load", "accuracy", "quality") and c.get("label"):
            return c["label"] + ("" if c.get("model") in (None, "default") else f" ({c['model']})")
        try:  # one builder, EngineSetup.label, for records of every schema (config.setup, run_config or flat)
            setup = setup_from_record(c)
            s = replace(setup, model=c.get("model") or setup.model).label
        except (UserError, TypeError, ValueError):
            s = f"{c.get('model', '?')}@{c.get('precision', '?')}"
        if c.get("batch_size", 1) != 1:
            s += f" b={c['batch_size']}"
        return s


def _jsonable(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


# ---------------------------------------------------------------- reading older versions

def upgrade(d: dict) -> dict:
    """A record dict of any readable version as the current version (a new dict; `d` is untouched).

    Each step reads one version as the next; a malformed part is left for validation to name."""
    v = d.get("schema_version")
    if v == SCHEMA_VERSION or v not in READABLE_VERSIONS:
        return d
    out = json.loads(json.dumps(d))
    for step in _STEPS[READABLE_VERSIONS.index(v):]:
        step(out)
    out["schema_version"] = SCHEMA_VERSION
    return out


def _part(d, key) -> dict:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def _from_1(out: dict) -> None:
    """Version 1 at batch b > 1 overstated bw_efficiency b times and understated per-token latency b times."""
    b = _part(out, "config").get("batch_size") or 1
    m = _part(out, "metrics")
    if not isinstance(b, int) or b <= 1 or out.get("kind") == "peer":
        return
    if isinstance(m.get(F.M.bw_efficiency), (int, float)):
        m[F.M.bw_efficiency] = m[F.M.bw_efficiency] / b
    for k in (F.M.token_latency_ms_median, F.M.token_latency_ms_p90, F.M.token_latency_ms_p99):
        if isinstance(m.get(k), (int, float)):
            m[k] = m[k] * b
    out["notes"] = ((out.get("notes") or "") + f" [read from schema 1 at batch {b}: bw_efficiency divided "
                    f"by {b} and per-token latencies multiplied by {b}, as version 1 mis-stated them]").strip()


# version 2's KL names -> version 3's (llama.cpp's KLD prefix); the numbers are the same
KL_RENAMES = {"kl_mean": F.Q.kld_mean, "kl_mean_err": F.Q.kld_mean_err, "kl_p99": F.Q.kld_p99, "kl_max": F.Q.kld_max}


def _from_2(out: dict) -> None:
    """The KL statistics renamed, in metrics.quality, its categories and the intervals."""
    m = _part(out, "metrics")
    q = _part(m, F.M.quality)
    for block in [q, *(b for b in _part(q, "by_category").values() if isinstance(b, dict))]:
        for old, new in KL_RENAMES.items():
            if old in block:
                block[new] = block.pop(old)
    ivs = _part(m, F.M.intervals)
    for old, new in KL_RENAMES.items():
        if f"quality.{old}" in ivs:
            ivs[f"quality.{new}"] = ivs.pop(f"quality.{old}")


_STEPS = (_from_1, _from_2)  # _STEPS[i] reads READABLE_VERSIONS[i] as the next version


# ---------------------------------------------------------------- validation (pydantic, from fields.py)

def _number(x):
    if x is None:
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError("should be a number or null")
    if not math.isfinite(x):
        raise ValueError("should be a finite number")
    return x


Num = Annotated[Any, PlainValidator(_number)]
_TYPES = {"number": Num, "count": Num, "text": Optional[StrictStr], "list": Optional[list[Optional[Any]]],
          "object": Optional[dict], "bool": Optional[StrictBool]}
_OPEN = ConfigDict(extra="allow")  # records carry more than the declared fields (peers' settings, new metrics)


def _model(name: str, flds, overrides: dict | None = None):
    spec = {f.name: (_TYPES[f.kind], None) for f in flds}
    spec.update(overrides or {})
    return create_model(name, __config__=_OPEN, **spec)


_NumList = Optional[list[Num]]
SpecModel = _model("SpecMetrics", F.SPEC, {"position_rate": (_NumList, None)})
QualityModel = _model("QualityMetrics", F.QUALITY)
LoadModel = _model("LoadMetrics", F.LOAD)
ProblemModel = _model("ProblemOutcome", F.PROBLEM)
AccuracyModel = _model("AccuracyMetrics", F.ACCURACY, {"outcomes": (Optional[list[ProblemModel]], None),
                                                       "stops": (Optional[list[StrictStr]], None)})
SampleModel = _model("Sample", F.SAMPLE)
IntervalModel = _model("Interval", F.INTERVAL)
NoiseModel = _model("Noise", F.NOISE, {"reasons": (Optional[list[StrictStr]], None)})
MetricsModel = _model("Metrics", F.METRICS, {
    "spec": (Optional[SpecModel], None), "quality": (Optional[QualityModel], None),
    "load": (Optional[LoadModel], None), "accuracy": (Optional[AccuracyModel], None),
    "weight_breakdown": (Optional[dict[str, Num]], None),
    "samples": (Optional[list[SampleModel]], None), "baseline_samples": (Optional[list[SampleModel]], None),
    "intervals": (Optional[dict[str, Optional[IntervalModel]]], None), "noise": (Optional[NoiseModel], None)})


class ConfigModel(BaseModel):
    model_config = _OPEN
    model: Optional[StrictStr] = None
    precision: Optional[StrictStr] = None
    device: Optional[StrictStr] = None
    batch_size: StrictInt = 1
    draft: Optional[dict] = None


class RecordModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int
    run_id: Annotated[StrictStr, PField(min_length=1, max_length=64)]
    created_at: StrictStr
    kind: Literal[RECORD_KINDS]  # type: ignore[valid-type]
    config: ConfigModel
    metrics: MetricsModel
    machine: dict
    versions: dict = {}
    kernels: dict = {}
    output: dict = {}
    notes: StrictStr = ""


def _where(loc) -> str:
    return ".".join(str(p) for p in loc)


def validate(d, strict: bool = False) -> dict:
    """Check a record of any readable version against the declared fields, and return it as the current
    version; a UserError names the first bad field. strict (what the store writes): every metric key,
    nested ones included, must be declared in fields.py. Reading stays lenient: older rows keep opening."""
    if not isinstance(d, dict):
        raise UserError(f"a run record must be a JSON object, got {type(d).__name__}", FIX)
    v = d.get("schema_version")
    if isinstance(v, int) and not isinstance(v, bool) and v not in READABLE_VERSIONS:
        raise UserError(f"run record has schema version {v}, this lab reads versions "
                        f"{', '.join(map(str, READABLE_VERSIONS))}", "export it again with this version of the lab")
    up = upgrade(d) if isinstance(v, int) and not isinstance(v, bool) else d
    try:
        RecordModel.model_validate(up)
    except ValidationError as e:
        raise _user_error(e.errors()[0]) from None
    if strict:
        F.Metrics(up["metrics"])  # raises UndeclaredField naming the first undeclared key
    return up


_WANT = {"dict_type": "an object", "model_type": "an object", "int_type": "a whole number", "float_type": "a number",
         "string_type": "text", "list_type": "a list", "bool_type": "true or false"}


def _user_error(err: dict) -> UserError:
    where, got, typ = _where(err["loc"]), err.get("input"), err["type"]
    if typ == "missing":
        return UserError(f"run record lacks the field '{where}'", FIX)
    if typ == "extra_forbidden":
        return UserError(f"run record has an unknown field '{where}'", FIX)
    if typ == "string_too_long":
        return UserError(f"run record field {where} is longer than {err['ctx']['max_length']} characters", FIX)
    if where == "kind" and typ == "literal_error":
        return UserError(f"run record kind {got!r} is unknown", f"kinds are {', '.join(RECORD_KINDS)}")
    want = _WANT.get(typ)
    what = f"should be {want}" if want else err["msg"].removeprefix("Value error, ")
    return UserError(f"run record field {where} {what}, got {type(got).__name__} {str(got)[:40]!r}", FIX)
