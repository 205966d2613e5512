"""One measured run from a config: load (pooled), warm up, generate, measure, store.

The CLI, the dashboard and the benchmarks all call `execute`; it is the only place a run record
for a generation is made.
"""
from __future__ import annotations

import gc
import json
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass

from engine.common.errors import UserError
from engine.common.paths import DATA
from engine.infer.generate import generate
from engine.infer.sampling import SamplingParams
from engine.infer.loader import LoadedModel, load, make_spec, resolve_device
from engine.measure.bandwidth import bandwidth_gbs
from engine.measure.memory import PeakMemory
from engine.measure.summary import make_record
from engine.measure.records import RunRecord
from engine.infer.speculative import DRAFT_KINDS, check_gamma, generate_speculative, make_proposer

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
    prompt: str | None = None  # None: the first of data/prompts.json
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


def execute(cfg: RunConfig, pool: ModelPool, store=None, progress=None, on_token=None) -> RunRecord:
    """Measure one configuration; the record is saved to `store` as soon as it exists."""
    cfg.validate()
    device = resolve_device(cfg.device)
    say = progress or (lambda s: None)
    with pool.lock:
        target = pool.get(cfg.model, cfg.target_spec(), device, say)
        draft = _draft_lm(cfg, pool, device, say)
        proposer = make_proposer(cfg.draft, draft, target) if cfg.draft != "none" else None
        bw = bandwidth_gbs(device)
        prompts = cfg.prompts()
        sp = cfg.sampling

        def run(spec_on: bool, n_tokens: int, cb=None):
            if spec_on:
                p = make_proposer(cfg.draft, draft, target)
                return generate_speculative(target, p, prompts, n_tokens, cfg.gamma, cfg.adaptive_gamma, sp, cb,
                                            cfg.chat)
            return generate(target, prompts, n_tokens, sp, cb, cfg.chat)

        if cfg.warmup:
            say("warming up")
            run(proposer is not None, 4)
        baseline = None
        if cfg.baseline and proposer is not None:
            say(f"timing {target.label} without speculation (baseline)")
            baseline = run(False, cfg.max_new_tokens)
        say(f"generating with {target.label}" + (f" + {cfg.draft} draft" if proposer else ""))
        with PeakMemory(device) as mem:
            res = run(proposer is not None, cfg.max_new_tokens, on_token)
        quality = None
        if cfg.quality:
            from engine.measure.quality import evaluate, has_reference

            say("measuring quality against fp32")
            ref = None
            if target.spec.precision != "fp32" and not has_reference(target, cfg.quality_tokens):
                # Reuse (or keep) the pool's fp32 copy rather than loading a private second one.
                ref = pool.get(cfg.model, make_spec("fp32"), device, say)
            quality = evaluate(target, cfg.quality_tokens, ref_lm=ref, progress=say)
    extra = {"max_new_tokens": cfg.max_new_tokens, "sampling": sp.to_dict(), "chat": cfg.chat,
             "run_config": cfg.to_dict(),
             "draft": None if proposer is None else {
                 "kind": cfg.draft, "model": draft.name if draft else None,
                 "precision": draft.spec.label if draft else None, "gamma": cfg.gamma,
                 "adaptive": cfg.adaptive_gamma}}
    rec = make_record("bench" if cfg.warmup else "generate", target, res, mem, bw, extra, draft, quality)
    if baseline is not None and res.spec:
        from engine.measure.summary import summarize

        b = summarize(target, baseline, None, bw)
        rec.metrics["spec"]["baseline_tok_s"] = b["decode_tok_s"]
        if b["decode_tok_s"] and rec.metrics["decode_tok_s"]:
            rec.metrics["spec"]["speedup"] = rec.metrics["decode_tok_s"] / b["decode_tok_s"]
        rec.metrics["baseline"] = {k: b[k] for k in ("decode_tok_s", "ttft_s", "token_latency_ms_median")}
    if store is not None:
        store.save_run(rec)
    return rec
