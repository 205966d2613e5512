"""One measured run from a config: load (pooled), warm up, generate every prompt R times, measure, store.

The CLI, the dashboard and the benchmarks all call `execute`; it is the only place a run record
for a generation is made. A run's prompts are a workload (engine.measure.workloads: `code:8,edit:8`)
or, without one, the prompt given (or the first of data/prompts.json); each is generated `reps`
times after a warm-up, and the noise guard (noise.py) records the machine's state around them.
"""
from __future__ import annotations

import gc
import json
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace

from engine.common.errors import UserError
from engine.common.paths import DATA
from engine.infer.generate import generate
from engine.infer.sampling import SamplingParams
from engine.infer.loader import LoadedModel, load, make_spec, resolve_device
from engine.infer.tokens import check_length, encode_prompts
from engine.measure import noise, workloads
from engine.measure.bandwidth import bandwidth_gbs
from engine.measure.memory import PeakMemory
from engine.measure.summary import aggregate, make_record, sample, summarize
from engine.measure.records import RunRecord
from engine.infer.speculative import DRAFT_KINDS, check_gamma, generate_speculative, proposer_spec

MAX_REPS = 50

PROMPTS_FILE = DATA / "prompts.json"


def default_prompts() -> list[str]:
    return json.loads(PROMPTS_FILE.read_text())["prompts"]


@dataclass
class RunConfig:
    model: str = "default"
    precision: str = "fp32"
    group_size: int = 64
    quantize_embeddings: bool = False
    quantize_head: bool = True
    device: str = "auto"
    draft: str = "none"  # none | model | self | ngram
    draft_model: str = "default-draft"
    draft_precision: str = "int4"
    gamma: int = 4
    adaptive_gamma: bool = False
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

    def validate(self) -> "RunConfig":
        make_spec(self.precision, self.group_size)
        if self.draft not in DRAFT_KINDS:
            raise UserError(f"unknown draft kind '{self.draft}'", f"use one of: {', '.join(DRAFT_KINDS)}")
        if self.draft != "none":
            check_gamma(self.gamma)
            if self.draft in ("model", "self"):
                make_spec(self.draft_precision, self.group_size)
        if not isinstance(self.batch_size, int) or not 1 <= self.batch_size <= 64:
            raise UserError(f"batch size {self.batch_size} is out of range", "use 1 to 64")
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

    def target_spec(self):
        return make_spec(self.precision, self.group_size, self.quantize_embeddings, self.quantize_head)

    def draft_spec(self):
        return make_spec(self.draft_precision, self.group_size, self.quantize_embeddings, self.quantize_head)

    def prompts(self) -> list[str]:
        if self.prompt is not None:
            return [self.prompt] * self.batch_size
        ps = default_prompts()
        return [ps[i % len(ps)] for i in range(self.batch_size)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, rec) -> "RunConfig | None":
        """The config a lab record was measured with (to measure it again); None for peers and old records."""
        d = (rec.config or {}).get("run_config") if rec.kind in ("bench", "generate") else None
        if not isinstance(d, dict):
            return None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def measure(self, pool: "ModelPool", store=None, progress=None) -> RunRecord:
        """Run this configuration (the interface sweep.run_many calls; peers.PeerConfig has the same)."""
        return execute(self, pool, store, progress)


# Extra models by name: factory(spec, device) -> LoadedModel. Tests register small random-init models
# here (tests/tiny.py); production code registers none, so the catalog is all a user sees.
_REGISTERED: dict[str, tuple] = {}


def register_model(name: str, factory, label: str | None = None) -> None:
    """Serve `name` from `factory(spec, device)` instead of the catalog (a test hook)."""
    _REGISTERED[name] = (factory, label or name)


def unregister_model(name: str) -> None:
    _REGISTERED.pop(name, None)


def registered_models() -> dict[str, str]:
    """Registered model names and their labels."""
    return {n: lbl for n, (_, lbl) in _REGISTERED.items()}


class ModelPool:
    """Loaded models keyed by (name, spec, device); least recently used ones are dropped past `keep`."""

    def __init__(self, keep: int = 3):
        self.keep = keep
        self._models: OrderedDict[tuple, LoadedModel] = OrderedDict()
        self.lock = threading.RLock()  # one generation at a time: no two runs share a KV cache

    def get(self, name, spec, device, progress=None) -> LoadedModel:
        key = (name, spec, device)
        with self.lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            while len(self._models) >= self.keep:
                self._models.popitem(last=False)
                gc.collect()
            lm = _REGISTERED[name][0](spec, device) if name in _REGISTERED else load(name, spec, device, progress)
            self._models[key] = lm
            return lm

    def peek(self, name, spec, device) -> LoadedModel | None:
        """The model if the pool holds it, without loading it."""
        with self.lock:
            return self._models.get((name, spec, device))

    def loaded(self) -> list[str]:
        return [lm.label for lm in self._models.values()]

    def clear(self):
        with self.lock:
            self._models.clear()
            gc.collect()


def _draft_lm(cfg: RunConfig, pool: ModelPool, device, progress):
    if cfg.draft == "model":
        return pool.get(cfg.draft_model, cfg.draft_spec(), device, progress)
    if cfg.draft == "self":
        return pool.get(cfg.model, cfg.draft_spec(), device, progress)
    return None


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


def _headroom(cfg: RunConfig) -> int:
    return cfg.gamma + 1 if cfg.draft != "none" else 0  # speculation drafts gamma + 1 slots ahead


def _context(lms) -> int:
    return min(lm.cfg.max_position for lm in lms if lm is not None)


def _fits(ids: list[list[int]], cfg: RunConfig, lms) -> bool:
    """Prompt + new tokens + speculation headroom within every model's context."""
    return max(len(x) for x in ids) + cfg.max_new_tokens + _headroom(cfg) <= _context(lms)


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
                         cfg.max_new_tokens, _headroom(cfg))
        if cfg.workload and not _fits(ids, cfg, (target, draft)):
            skipped.append(r.id)
        else:
            todo.append((r, ids))
    if not todo:
        raise UserError(f"every prompt of workload {cfg.workload} is longer than the context allows with "
                        f"{cfg.max_new_tokens} new tokens ({len(skipped)} skipped)",
                        "ask for fewer new tokens, or pick a category with shorter prompts (chat, code)")
    return todo, skipped


def execute(cfg: RunConfig, pool: ModelPool, store=None, progress=None, on_token=None) -> RunRecord:
    """Measure one configuration: warm up, then every prompt R times; saved to `store` once complete.

    With a baseline, each prompt also runs on the same target without speculation, right before
    the speculative generation of the same repetition (paired: drift hits both alike). `on_token`
    streams the first measured generation only.
    """
    cfg.validate()
    device = resolve_device(cfg.device)
    say = progress or (lambda s: None)
    reqs = calls(cfg)
    with pool.lock:
        target = pool.get(cfg.model, cfg.target_spec(), device, say)
        draft = _draft_lm(cfg, pool, device, say)
        proposer = proposer_spec(cfg.draft, draft, target) if cfg.draft != "none" else None
        bw = bandwidth_gbs(device)
        todo, skipped = _encode(cfg, target, draft, reqs)
        sp = cfg.sampling
        paired = cfg.baseline and proposer is not None

        def run(spec_on: bool, req: Call, ids, n_tokens: int, cb=None):
            if spec_on:
                p = proposer_spec(cfg.draft, draft, target)
                return generate_speculative(target, p, list(req.texts), n_tokens, cfg.gamma, cfg.adaptive_gamma, sp,
                                            cb, cfg.chat, prompt_ids=ids)
            return generate(target, list(req.texts), n_tokens, sp, cb, cfg.chat, prompt_ids=ids)

        if cfg.warmup:
            say("warming up")
            run(proposer is not None, *todo[0], min(4, cfg.max_new_tokens))
            if paired:
                run(False, *todo[0], min(4, cfg.max_new_tokens))
        gens, samples, base, output = [], [], [], None
        say(f"generating with {target.label}" + (f" + {cfg.draft} draft" if proposer else ""))
        before = noise.before(device)
        with PeakMemory(device) as mem:
            for rep in range(cfg.reps):
                for j, (req, ids) in enumerate(todo):
                    if len(todo) * cfg.reps > 1:
                        say(f"repetition {rep + 1}/{cfg.reps}, prompt {j + 1}/{len(todo)} ({req.category})")
                    if paired:
                        rb = run(False, req, ids, cfg.max_new_tokens)
                        base.append(sample(rb, summarize(target, rb, None, bw), req.category, req.id, rep))
                    res = run(proposer is not None, req, ids, cfg.max_new_tokens, on_token if output is None else None)
                    m = summarize(target, res, None, bw)
                    gens.append(m)
                    samples.append(sample(res, m, req.category, req.id, rep))
                    if output is None:
                        output = {"texts": res.texts, "new_tokens": res.new_tokens, "trace": res.trace,
                                  "finish": res.finish, "prompt_id": req.id}
        after = noise.after(device)
        quality = None
        if cfg.quality:
            from engine.measure.quality import evaluate, has_reference

            say("measuring quality against fp32")
            ref = None
            if target.spec.precision != "fp32" and not has_reference(target, cfg.quality_tokens):
                # Reuse (or keep) the pool's fp32 copy rather than loading a private second one.
                ref = pool.get(cfg.model, make_spec("fp32"), device, say)
            quality = evaluate(target, cfg.quality_tokens, ref_lm=ref, progress=say)
    metrics = aggregate(gens, samples, base or None)
    metrics.update(mem.as_dict())
    metrics["workload"] = {"name": cfg.workload or todo[0][0].category, "reps": cfg.reps, "prompts": len(todo),
                           "skipped": len(skipped), "skipped_ids": skipped,
                           "categories": {c: sum(1 for r, _ in todo if r.category == c)
                                          for c in dict.fromkeys(r.category for r, _ in todo)},
                           "fingerprint": workloads.fingerprint([r for r, _ in todo])}
    metrics["noise"] = noise.verdict(before, after, metrics, os.cpu_count())
    extra = {"max_new_tokens": cfg.max_new_tokens, "sampling": sp.to_dict(), "chat": cfg.chat,
             "batch_size": cfg.batch_size, "workload": cfg.workload, "reps": cfg.reps, "run_config": cfg.to_dict(),
             "batch_settings": res.settings,  # the scheduler's max_seqs, token budget, policy (infer.scheduler)
             "draft": None if proposer is None else {
                 "kind": cfg.draft, "model": draft.name if draft else None,
                 "precision": draft.spec.label if draft else None, "gamma": cfg.gamma,
                 "adaptive": cfg.adaptive_gamma}}
    rec = make_record("bench" if cfg.warmup else "generate", target, metrics, output, extra, draft, quality)
    if store is not None:
        store.save_run(rec)
    return rec
