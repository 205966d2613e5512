"""One measured run from a config: load (pooled), probe, warm up, measure, judge noise, quality, store.

The CLI, the dashboard and the benchmarks all call `execute`; it is the only place a run record
for a generation is made. A run's prompts are a workload (engine.measure.workloads: `code:8,edit:8`)
or, without one, the prompt given (or the first of data/prompts.json); each is generated `reps`
times after a warm-up, and the noise guard (noise.py) records the machine's state around them.
`execute` is a short loop over the named steps below; `Run` is what they share.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from types import SimpleNamespace

from engine.common.errors import UserError
from engine.common.paths import DATA
from engine.common.setup import EngineSetup
from engine.infer.generate import generate
from engine.infer.loader import LoadedSetup, load_setup, make_spec, resolve_device
from engine.infer.sampling import SamplingParams
from engine.infer.speculative import generate_speculative
from engine.infer.tokens import check_length, encode_prompts
from engine.measure import noise, workloads
from engine.measure.bandwidth import bandwidth_gbs
from engine.measure.memory import PeakMemory
from engine.measure.pool import ModelPool
from engine.measure.record_config import RecordConfig
from engine.measure.records import RunRecord
from engine.measure.summary import aggregate, make_record, sample, summarize

MAX_REPS = 50
MAX_BATCH = 64
# The kinds a measured generation is stored as: a benchmark run, `python -m engine generate`, and a run of the
# Speculative playground.
RUN_KINDS = ("bench", "generate", "playground")

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
            raise UserError(f"unknown run config field '{unknown[0]}'", f"run fields are: setup, {', '.join(run_names)}; "
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

    def measure(self, pool: ModelPool, store=None, progress=None) -> RunRecord:
        """Run this configuration (the interface sweep.run_many calls; peers.PeerConfig has the same)."""
        return execute(self, pool, store, progress)


@dataclass(frozen=True)
class Call:
    """One generation call of a run: a prompt sent as `texts` (batch-size sequences), its id and category."""

    id: str
    category: str
    texts: tuple

    @property
    def text(self) -> str:
        return self.texts[0]


def calls(cfg: RunConfig) -> list[Call]:
    """The run's generations: each workload prompt as batch-size identical sequences, or the one prompt."""
    if cfg.workload:
        return [Call(p.id, p.category, (p.text,) * cfg.batch_size) for p in workloads.load(cfg.workload)]
    if cfg.prompt is not None:
        return [Call("prompt", "prompt", tuple(cfg.prompts()))]
    return [Call("prompts.json", "default", tuple(cfg.prompts()))]


def _context(lms) -> int:
    return min(lm.cfg.max_position for lm in lms if lm is not None)


def _fits(ids: list[list[int]], cfg: RunConfig, lms) -> bool:
    """Prompt + new tokens + speculation headroom within every model's context."""
    return max(len(x) for x in ids) + cfg.max_new_tokens + cfg.setup.headroom <= _context(lms)


def _encode(cfg, target, draft, reqs: list[Call]):
    """(call, token ids) of the calls that fit the context, and the ids of the workload prompts that do not.

    A workload prompt that does not fit is skipped (never truncated) and counted in the record; a
    prompt the user typed that does not fit is refused, saying what would fit.
    """
    todo, skipped = [], []
    for r in reqs:
        ids = encode_prompts(target.tokenizer, list(r.texts), cfg.chat)
        if not cfg.workload:  # says what would fit, before the warm-up
            check_length(SimpleNamespace(max_position=_context((target, draft))), max(len(x) for x in ids),
                         cfg.max_new_tokens, cfg.setup.headroom)
        if cfg.workload and not _fits(ids, cfg, (target, draft)):
            skipped.append(r.id)
        else:
            todo.append((r, ids))
    if not todo:
        raise UserError(f"every prompt of workload {cfg.workload} is longer than the context allows with "
                        f"{cfg.max_new_tokens} new tokens ({len(skipped)} skipped)",
                        "ask for fewer new tokens, or pick a category with shorter prompts (chat, code)")
    return todo, skipped


# ---------------------------------------------------------------- the run and its steps

@dataclass
class Run:
    """What the steps of one run share: its config, what was loaded, and what has been measured so far."""

    cfg: RunConfig
    pool: ModelPool
    say: object
    on_token: object = None
    device: str = "cpu"
    loaded: LoadedSetup | None = None
    bw: float | None = None  # the machine's read bandwidth, GB/s
    todo: list = field(default_factory=list)  # (Call, token ids) that fit
    skipped: list = field(default_factory=list)  # ids of workload prompts that did not
    gens: list = field(default_factory=list)  # summarize() of each measured generation
    samples: list = field(default_factory=list)
    base: list = field(default_factory=list)  # samples of the paired baseline
    output: dict | None = None  # the first measured generation
    settings: dict | None = None  # the scheduler settings the generations ran with
    before: dict | None = None  # the noise guard's machine state around the measurement
    after: dict | None = None
    metrics: dict = field(default_factory=dict)
    quality: dict | None = None

    @property
    def speculative(self) -> bool:
        return self.loaded is not None and self.loaded.proposer is not None

    @property
    def paired(self) -> bool:
        return self.cfg.baseline and self.speculative

    def generate(self, spec_on: bool, req: Call, ids, n_tokens: int, cb=None):
        """One generation of `req`: speculative with the setup's proposer, else the target alone."""
        cfg, target = self.cfg, self.loaded.target
        if spec_on:
            return generate_speculative(target, self.loaded.proposer, list(req.texts), n_tokens, cfg.setup.gamma,
                                        cfg.setup.adaptive_gamma, cfg.sampling, cb, cfg.chat, prompt_ids=ids)
        return generate(target, list(req.texts), n_tokens, cfg.sampling, cb, cfg.chat, prompt_ids=ids)


def load_step(run: Run) -> None:
    """The target, draft and proposer (from the pool), and the prompts encoded and checked against the context."""
    run.loaded = load_setup(run.cfg.setup, get=run.pool.get, progress=run.say)
    run.todo, run.skipped = _encode(run.cfg, run.loaded.target, run.loaded.draft, calls(run.cfg))


def probe_step(run: Run) -> None:
    """The machine's memory read bandwidth, the floor every decode step is compared against."""
    run.bw = bandwidth_gbs(run.device)


def warm_up_step(run: Run) -> None:
    """A few tokens of the first prompt through each path the run will time (kernels built, caches hot)."""
    if not run.cfg.warmup:
        return
    run.say("warming up")
    n = min(4, run.cfg.max_new_tokens)
    run.generate(run.speculative, *run.todo[0], n)
    if run.paired:
        run.generate(False, *run.todo[0], n)


def measure_step(run: Run) -> None:
    """Every prompt `reps` times (the baseline right before its speculative twin when paired), under the
    noise guard and the peak-memory tracker; the record's metrics aggregated from the samples."""
    cfg, target = run.cfg, run.loaded.target
    run.say(f"generating with {target.label}" + (f" + {cfg.setup.draft} draft" if run.speculative else ""))
    run.before = noise.before(run.device)
    with PeakMemory(run.device) as mem:
        for rep in range(cfg.reps):
            for j, (req, ids) in enumerate(run.todo):
                if len(run.todo) * cfg.reps > 1:
                    run.say(f"repetition {rep + 1}/{cfg.reps}, prompt {j + 1}/{len(run.todo)} ({req.category})")
                if run.paired:
                    rb = run.generate(False, req, ids, cfg.max_new_tokens)
                    run.base.append(sample(rb, summarize(target, rb, None, run.bw), req.category, req.id, rep))
                first = run.output is None
                res = run.generate(run.speculative, req, ids, cfg.max_new_tokens, run.on_token if first else None)
                m = summarize(target, res, None, run.bw)
                run.gens.append(m)
                run.samples.append(sample(res, m, req.category, req.id, rep))
                run.settings = res.settings
                if first:
                    run.output = {"texts": res.texts, "new_tokens": res.new_tokens, "trace": res.trace,
                                  "finish": res.finish, "prompt_id": req.id}
    run.after = noise.after(run.device)
    run.metrics = aggregate(run.gens, run.samples, run.base or None)
    run.metrics.update(mem.as_dict())
    todo = [r for r, _ in run.todo]
    run.metrics["workload"] = {"name": cfg.workload or todo[0].category, "reps": cfg.reps, "prompts": len(todo),
                               "skipped": len(run.skipped), "skipped_ids": run.skipped,
                               "categories": {c: sum(1 for r in todo if r.category == c)
                                              for c in dict.fromkeys(r.category for r in todo)},
                               "fingerprint": workloads.fingerprint(todo)}


def judge_noise_step(run: Run) -> None:
    """Whether the machine was busy or throttled while the run was measured (noise.py)."""
    run.metrics["noise"] = noise.verdict(run.before, run.after, run.metrics, os.cpu_count())


def quality_step(run: Run) -> None:
    """Perplexity and KL against fp32, when asked (the pool's fp32 copy is the reference, loaded once)."""
    if not run.cfg.quality:
        return
    from engine.measure.quality import evaluate, has_reference

    target = run.loaded.target
    run.say("measuring quality against fp32")
    ref = None
    if target.spec.precision != "fp32" and not has_reference(target, run.cfg.quality_tokens):
        ref = run.pool.get(run.cfg.setup.model, make_spec("fp32"), run.device, run.say)
    run.quality = evaluate(target, run.cfg.quality_tokens, ref_lm=ref, progress=run.say)


def record_config(run: Run) -> RecordConfig:
    """The record's typed config: the setup as loaded (canonical model names), the run's settings."""
    from engine import ops as kernels

    cfg, target, draft = run.cfg, run.loaded.target, run.loaded.draft
    setup = replace(cfg.setup, model=target.name)
    if setup.draft == "model" and draft is not None:
        setup = replace(setup, draft_model=draft.name)
    return RecordConfig(setup=setup, device=run.device, precision_label=target.spec.label,
                        quant=target.spec.to_dict(), workload=cfg.workload, reps=cfg.reps,
                        sampling=cfg.sampling.to_dict(), chat=cfg.chat, batch_size=cfg.batch_size,
                        max_new_tokens=cfg.max_new_tokens, batch_settings=run.settings,
                        kernel_settings=kernels.kernel_config().to_dict(), run_config=cfg.to_dict())


def store_step(run: Run, kind: str, store) -> RunRecord:
    """The run record, saved to `store` (when given) now that it is complete."""
    rec = make_record(kind, run.loaded.target, run.metrics, run.output, record_config(run), run.loaded.draft,
                      run.quality)
    if store is not None:
        store.save_run(rec)
    return rec


STEPS = (load_step, probe_step, warm_up_step, measure_step, judge_noise_step, quality_step)


def execute(cfg: RunConfig, pool: ModelPool, store=None, progress=None, on_token=None,
            kind: str = "bench") -> RunRecord:
    """Measure one configuration and store it as a record of `kind` (bench, generate or playground).

    With a baseline, each prompt also runs on the same target without speculation, right before
    the speculative generation of the same repetition (paired: drift hits both alike). `on_token`
    streams the first measured generation only.
    """
    if kind not in RUN_KINDS:
        raise UserError(f"a measured run cannot be stored as kind '{kind}'", f"use one of: {', '.join(RUN_KINDS)}")
    cfg.validate()
    run = Run(cfg, pool, progress or (lambda s: None), on_token, device=resolve_device(cfg.setup.device))
    from engine import ops as kernels

    with kernels.count_steps():  # record.kernels counts this run's forward passes, not the process's
        with pool.lock:
            for step in STEPS:
                step(run)
        return store_step(run, kind, store)
