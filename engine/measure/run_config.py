"""A measured run's configuration: the engine setup, and what the run asks of it (prompts, repetitions,
sampling). Pure (no torch): the pages build and send it to the backend, which measures it (runs.execute).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from engine.common.errors import UserError
from engine.common.paths import DATA
from engine.common.sampling import SamplingParams
from engine.common.setup import EngineSetup
from engine.common.vocab import RUN_KINDS
from engine.measure import workloads

MAX_REPS = 50
MAX_BATCH = 64

PROMPTS_FILE = DATA / "prompts.json"


def default_prompts() -> list[str]:
    return json.loads(PROMPTS_FILE.read_text())["prompts"]


SETUP_FIELDS = tuple(f.name for f in fields(EngineSetup))


@dataclass
class RunConfig:
    """A measured run: the engine setup, and what this run asks of it (prompts, repetitions, sampling)."""

    setup: EngineSetup = field(default_factory=EngineSetup)
    prompt: str | None = None  # None: the first of data/prompts.json (unless a workload is given)
    workload: str | None = None  # e.g. "code:8,edit:8" (engine.measure.workloads); None: the prompt above
    reps: int = 3  # repetitions of every prompt after the warm-up
    batch_size: int = 1
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = 0
    chat: bool = True
    warmup: bool = True
    baseline: bool = False  # also time the same target without speculation, in this run
    quality: bool = False
    quality_tokens: int = 256

    @classmethod
    def of(cls, **flat) -> "RunConfig":
        """A config from flat keyword arguments: the setup's fields go to the setup, the rest to the run."""
        return cls.from_dict(flat)

    def validate(self) -> "RunConfig":
        self.setup = self.setup.validate()
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or not 1 <= self.batch_size <= MAX_BATCH:
            raise UserError(f"batch size {self.batch_size} is out of range", f"use 1 to {MAX_BATCH}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens {self.max_new_tokens} is out of range", "ask for at least 1 new token")
        if isinstance(self.reps, bool) or not isinstance(self.reps, int) or not 1 <= self.reps <= MAX_REPS:
            raise UserError(f"repetitions {self.reps!r} is out of range", f"use 1 to {MAX_REPS} (3 gives an interval)")
        if self.workload is not None:
            if self.prompt is not None:
                raise UserError("both a prompt and a workload were given", "give one of them: --prompt or --workload")
            self.workload = workloads.canonical(self.workload)
            workloads.load(self.workload)  # the data packages are there and hold every id, before anything runs
        self.sampling.validate()
        return self

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def label(self) -> str:
        """What the run's record will be called: the setup's label, and the batch when it is not 1."""
        return self.setup.label + (f" b={self.batch_size}" if self.batch_size != 1 else "")

    def prompts(self) -> list[str]:
        if self.prompt is not None:
            return [self.prompt] * self.batch_size
        ps = default_prompts()
        return [ps[i % len(ps)] for i in range(self.batch_size)]

    def to_dict(self) -> dict:
        """{"setup": {EngineSetup fields}, and the run's own fields}: the wire and record format."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        """A config from `to_dict()`'s form, or the flat form of schema-2 records (setup fields at the top
        level); an unknown key is refused by name, so a typo never becomes a default."""
        if not isinstance(d, dict):
            raise UserError(f"a run config must be an object, got {type(d).__name__}", "send RunConfig.to_dict()")
        run_names = [f.name for f in fields(cls) if f.name != "setup"]
        unknown = sorted(k for k in d if k not in run_names and k not in SETUP_FIELDS and k != "setup")
        if unknown:
            raise UserError(f"unknown run config field '{unknown[0]}'",
                            f"run fields are: setup, {', '.join(run_names)}; "
                            f"setup fields are: {', '.join(SETUP_FIELDS)}")
        flat_setup = {k: d[k] for k in SETUP_FIELDS if k in d}
        if "setup" in d:
            if flat_setup:
                raise UserError(f"setup field '{next(iter(flat_setup))}' was given both inside and beside 'setup'",
                                "give the setup's fields inside 'setup' only")
            setup = d["setup"] if isinstance(d["setup"], EngineSetup) else EngineSetup.from_dict(d["setup"])
        else:
            setup = EngineSetup(**flat_setup)
        return cls(setup=setup, **{k: d[k] for k in run_names if k in d})

    @classmethod
    def from_record(cls, rec) -> "RunConfig | None":
        """The config a lab record was measured with (to measure it again); None for peers, old records
        without one, and stored configs this version cannot read."""
        d = (rec.config or {}).get("run_config") if rec.kind in RUN_KINDS else None
        if not isinstance(d, dict):
            return None
        try:
            return cls.from_dict(d)
        except (UserError, TypeError):
            return None
