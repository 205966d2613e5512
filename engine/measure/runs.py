"""One measured run from a config: load (pooled), probe, warm up, measure, judge noise, quality, store.

The CLI, the dashboard and the benchmarks all call `execute`; it is the only place a run record
for a generation is made. A run's prompts are a workload (engine.measure.workloads: `code:8,edit:8`)
or, without one, the prompt given (or the first of data/prompts.json); each is generated `reps`
times after a warm-up, and the noise guard (noise.py) records the machine's state around them.
`execute` is a short loop over the named steps below; `Run` is what they share.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

from engine.common.errors import UserError
from engine.common.fields import M
from engine.common.vocab import RUN_KINDS
from engine.infer import moe
from engine.infer.generate import generate
from engine.infer.loader import LoadedSetup, load_setup, make_spec, resolve_device
from engine.infer.speculative import generate_speculative
from engine.infer.tokens import check_length, encode_prompts
from engine.measure import noise, workloads
from engine.measure.bandwidth import bandwidth_gbs, run_bandwidth
from engine.measure.experts import touches_metrics
from engine.measure.memory import PeakMemory
from engine.measure.pool import ModelPool
from engine.measure.record_config import RecordConfig
from engine.measure.records import RunRecord
from engine.measure.run_config import (MAX_BATCH, MAX_REPS, PROMPTS_FILE, SETUP_FIELDS,  # noqa: F401
                                       RunConfig, default_prompts)
from engine.measure.summary import aggregate, make_record, sample, summarize

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
    """The machine's cached read bandwidth: the floor's fallback when the run's own probes cannot run."""
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
    done = []  # (result, its baseline twin or None, request, repetition): summarized once the run's probes are in
    with PeakMemory(run.device) as mem, moe.count_expert_touches() as touches:  # an MoE target's experts per step
        for rep in range(cfg.reps):
            for j, (req, ids) in enumerate(run.todo):
                if len(run.todo) * cfg.reps > 1:
                    run.say(f"repetition {rep + 1}/{cfg.reps}, prompt {j + 1}/{len(run.todo)} ({req.category})")
                rb = run.generate(False, req, ids, cfg.max_new_tokens) if run.paired else None
                first = run.output is None
                res = run.generate(run.speculative, req, ids, cfg.max_new_tokens, run.on_token if first else None)
                done.append((res, rb, req, rep))
                run.settings = res.settings
                if first:
                    run.output = {"texts": res.texts, "new_tokens": res.new_tokens, "trace": res.trace,
                                  "finish": res.finish, "prompt_id": req.id}
    run.after = noise.after(run.device)
    run.bw, source = run_bandwidth(run.before, run.after, run.bw)  # the floor from this process's own probes
    for res, rb, req, rep in done:
        if rb is not None:
            run.base.append(sample(rb, summarize(target, rb, None, run.bw), req.category, req.id, rep))
        m = summarize(target, res, None, run.bw)
        run.gens.append(m)
        run.samples.append(sample(res, m, req.category, req.id, rep))
    run.metrics = aggregate(run.gens, run.samples, run.base or None)
    run.metrics[M.bw_probe] = source
    run.metrics.update(mem.as_dict())
    run.metrics.update(touches_metrics(touches))
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
                        kernel_settings=kernels.kernel_config().to_dict(), run_config=cfg.to_dict(),
                        architecture=target.cfg.architecture(), calibration=target.calibration)


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
