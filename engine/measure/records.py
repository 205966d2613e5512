"""The run record: one versioned type that engine, store, dashboard and reports all agree on.

Definitions (units in the names):
- ttft_s: wall time from the start of prefill to the first new token being chosen.
- decode latencies: wall time of each decode step after the first token. With speculation a step
  emits several tokens, so per-token latency is step time divided by the tokens it emitted.
- decode_tok_s: new tokens after the first, over the time spent producing them.
- prefill_tok_s: prompt tokens (all sequences) over prefill time.
- weight_bytes: bytes held by the weights as converted (tied storage counted once).
- quantized_layers: bytes of the quantized layers against the same layers in fp32 (ratio).
- kv_bytes: bytes of the KV cache allocated for the run.
- peak_rss_bytes: the process's peak resident memory during the run (all loaded models included);
  run_rss_delta_bytes: that peak minus the resident memory when the run started.
- bytes_per_token: weight bytes read per decode step plus KV bytes read, divided by tokens per step.
- bw_floor_ms: bytes_per_token / measured read bandwidth: the fastest a token can be on this machine.
- bw_efficiency: bw_floor_ms / measured per-token latency (1.0 = at the memory-bandwidth limit).
- spec: see speculative.SpecStats; mean_acceptance_length counts the bonus token, as vLLM does.
"""
from __future__ import annotations

import json
import math
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from engine.common.errors import UserError

SCHEMA_VERSION = 1
KINDS = ("generate", "bench", "quality", "peer")


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
        validate(d)
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @classmethod
    def from_json(cls, s: str) -> "RunRecord":
        try:
            d = json.loads(s)
        except (ValueError, TypeError) as e:
            raise UserError(f"run record is not valid JSON ({e})", "export the record again from the lab") from None
        return cls.from_dict(d)

    @property
    def label(self) -> str:
        c = self.config
        if self.kind == "peer" and c.get("label"):
            return c["label"] + ("" if c.get("model") in (None, "default") else f" ({c['model']})")
        draft = c.get("draft") or {}
        s = f"{c.get('model', '?')}@{c.get('precision', '?')}"
        if draft.get("kind"):
            s += f" + {draft['kind']}"
            if draft.get("precision"):
                s += f"@{draft['precision']}"
            s += f" g={draft.get('gamma', '?')}"
        if c.get("batch_size", 1) != 1:
            s += f" b={c['batch_size']}"
        return s


def _jsonable(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


_REQUIRED = {"schema_version": int, "kind": str, "config": dict, "metrics": dict, "machine": dict,
             "run_id": str, "created_at": str}


def validate(d) -> None:
    """Check a record's shape; raise UserError naming the first problem."""
    if not isinstance(d, dict):
        raise UserError(f"a run record must be a JSON object, got {type(d).__name__}", "import a file exported by the lab")
    for k, t in _REQUIRED.items():
        if k not in d:
            raise UserError(f"run record lacks the field '{k}'", "import a file exported by the lab")
        if not isinstance(d[k], t) or (t is int and isinstance(d[k], bool)):
            raise UserError(f"run record field '{k}' should be {t.__name__}, got {type(d[k]).__name__}",
                            "import a file exported by the lab")
    if d["schema_version"] != SCHEMA_VERSION:
        raise UserError(f"run record has schema version {d['schema_version']}, this lab reads version {SCHEMA_VERSION}",
                        "export it again with this version of the lab")
    if d["kind"] not in KINDS:
        raise UserError(f"run record kind '{d['kind']}' is unknown", f"kinds are {', '.join(KINDS)}")
    for k, v in d["metrics"].items():
        if isinstance(v, float) and not math.isfinite(v):
            raise UserError(f"metric '{k}' is {v}", "metrics must be finite numbers")
    if len(d["run_id"]) > 64:
        raise UserError("run_id is longer than 64 characters", "import a file exported by the lab")


def percentile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile; None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
