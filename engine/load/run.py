"""A load test is a run: LoadConfig -> probe the server -> send the requests -> one `load` record per point.

The record (kind "load") holds the endpoint, the load profile, the SLOs, the workload, the server
facts that could be read (models, version or props, how it was launched), every per-request sample
(output.samples), metrics.load (metrics.py) and, where the server exposes vLLM's counters,
metrics.spec: its acceptance over the load point from /metrics before and after.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import uuid
from dataclasses import asdict, dataclass, field

from engine.common.errors import UserError
from engine.common.vocab import kv_words
from engine.load import client, server_metrics
from engine.load import metrics as M
from engine.load.profiles import SLO, Limits, Profile, parse_profile, parse_slo
from engine.load.requests import (Request, cycle, fixed_lengths, fresh, from_conversations, from_workload,
                                  load_tokenizer, tokenizer_folder)
from engine.measure import conversations
from engine.measure.conversations import is_multiturn

GENERATORS = {"lab": "engine.load (httpx + asyncio)", "guidellm": "GuideLLM 0.8.1 (.venv-guidellm), ingested"}


@dataclass
class LoadConfig:
    url: str
    profile: str = "concurrent:1"
    slo: str | None = None
    slo_attainment: float = 0.9
    workload: str | None = "chat:16"  # None: fixed lengths; multiturn:N[:TURNS]: conversations turn by turn
    input_len: int | None = None
    output_len: int | None = None
    prompt_kind: str = "random"  # fixed lengths: random | text
    requests: int | None = None  # None: the workload's size (fixed lengths: 32)
    max_output_len: int = 256
    max_model_len: int | None = None  # None: what the server says (llama-server's n_ctx), else unbounded
    tokenizer: str = "default-draft"
    served_model: str | None = None
    api_key: str | None = None  # never recorded
    temperature: float = 0.0
    seed: int = 0
    warmup: int = 0
    max_seconds: float = 600.0
    request_timeout_s: float = 300.0
    server: dict = field(default_factory=dict)  # what the launcher knows: system, label, model, precision, ...
    generator: str = "lab"  # lab: engine/load/client.py; guidellm: GuideLLM in .venv-guidellm (guidellm.py)

    def validate(self) -> "LoadConfig":
        client.check_url(self.url)
        self.parsed_profile()
        self.parsed_slo()
        if self.workload is None and (self.input_len is None or self.output_len is None):
            raise UserError("a load test needs a workload or fixed lengths",
                            "pass --workload chat:16, or both --input-len and --output-len")
        if self.workload is not None and (self.input_len is not None or self.output_len is not None):
            raise UserError("both a workload and fixed lengths were given",
                            "pass --workload, or --input-len/--output-len, not both")
        if self.generator not in GENERATORS:
            raise UserError(f"unknown load generator '{self.generator}'", f"use one of: {', '.join(GENERATORS)}")
        if is_multiturn(self.workload):
            if self.generator != "lab":
                raise UserError("only the lab's client replays multi-turn conversations", "drop --generator guidellm")
            conversations.parse(self.workload)  # a bad spec fails before anything is sent
        if not 0 <= self.temperature <= 2:
            raise UserError(f"temperature {self.temperature} is out of range", "use 0 (greedy) to 2")
        self.limits(1)
        return self

    def parsed_profile(self) -> Profile:
        return parse_profile(self.profile, self.seed)

    def parsed_slo(self) -> SLO:
        return parse_slo(self.slo, self.slo_attainment)

    def limits(self, n: int) -> Limits:
        return Limits(n, self.max_seconds, self.request_timeout_s, self.warmup).validate()

    def record_config(self) -> dict:
        d = asdict(self)
        d.pop("api_key")
        return d


def build_requests(cfg: LoadConfig, tokenizer, max_model_len: int | None) -> tuple[list[Request], dict]:
    """The requests, and what a multi-turn workload cut to fit the context ({} for any other)."""
    if is_multiturn(cfg.workload):
        base, cut = from_conversations(cfg.workload, tokenizer, cfg.max_output_len, max_model_len)
        return cycle(base, cfg.requests or len(base)), cut
    if cfg.workload is not None:
        base = from_workload(cfg.workload, tokenizer, cfg.max_output_len, max_model_len=max_model_len)
        return cycle(base, cfg.requests or len(base)), {}
    return fixed_lengths(cfg.requests or 32, cfg.input_len, cfg.output_len, tokenizer, cfg.prompt_kind, cfg.seed), {}


def server_from_facts(facts: dict, url: str) -> dict:
    """What a launcher would have said about a server it did not start, where the server says it: our own
    server's setup in /v1/models ("lab"), so a load record against its URL is labelled, and calibrates the
    planner's batch model, like one the lab started. {} for any other server."""
    lab = facts.get("lab")
    if not isinstance(lab, dict) or not lab.get("precision"):
        return {}
    draft = lab.get("draft") if isinstance(lab.get("draft"), dict) else None
    settings = lab.get("settings") if isinstance(lab.get("settings"), dict) else {}
    words = f" + {draft.get('kind')} draft" if draft else ""
    words += kv_words(settings.get("kv_cache"), settings.get("kv_dtype"), settings.get("kv_cache_gib"))
    return {"system": "serving-cost-lab", "label": f"serving-cost-lab {lab['precision']}{words} at {url} (its own "
            "account)", "model": lab.get("model"), "precision": lab.get("precision"), "draft": draft,
            "slots": settings.get("max_seqs"), "setup": lab.get("setup"), "calibration": lab.get("calibration"),
            "identified_by": "/v1/models lab"}


def _context_of(facts: dict) -> int | None:
    """The context one request gets, where the server says (llama-server's /props: n_ctx per slot; vLLM's
    /v1/models: max_model_len)."""
    n = (facts.get("props") or {}).get("n_ctx") or facts.get("max_model_len")
    return n if isinstance(n, int) and n > 0 else None


@dataclass
class Prepared:
    """Everything a load point needs. Each point gets its own fresh copy of the requests and the warm-up its
    own prompts (requests.fresh, tagged by this test's salt and the point's number), so no point is served
    from a prompt cache an earlier point or the warm-up filled; the record says which tag it sent."""

    endpoint: client.Endpoint
    facts: dict
    tokenizer: object
    requests: list[Request]
    sampling: client.Sampling
    salt: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    points: int = 0
    cut: dict = field(default_factory=dict)  # multi-turn: conversations and turns cut to fit the context

    def next_point(self, warmup: int) -> tuple[str, list[Request], list[Request]]:
        """(tag, the `warmup` warm-up requests, the point's requests), neither sent before by this test."""
        tag = f"{self.salt}.{self.points}"
        self.points += 1
        return (tag, fresh(self.requests[:warmup], f"{tag}w", self.tokenizer),
                fresh(self.requests, tag, self.tokenizer))


def prepare(cfg: LoadConfig, progress=None) -> Prepared:
    """Everything a load point needs: the endpoint and what it says of itself, the tokenizer, the requests."""
    say = progress or (lambda s: None)
    cfg.validate()
    ep = client.Endpoint(cfg.url, cfg.served_model, cfg.api_key or os.environ.get("OPENAI_API_KEY"))
    say(f"probing {ep.base}")
    facts = client.probe(ep)
    ep = client.Endpoint(cfg.url, facts.get("model"), ep.api_key)
    tok = load_tokenizer(cfg.tokenizer)
    ctx = cfg.max_model_len or _context_of(facts) or (cfg.server or {}).get("max_model_len")
    reqs, cut = build_requests(cfg, tok, ctx)
    sampling = client.Sampling(cfg.temperature, cfg.seed, facts["accepts"])
    return Prepared(ep, facts, tok, reqs, sampling, cut=cut)


def run_point(cfg: LoadConfig, profile: Profile, prepared: Prepared, store=None, sweep: dict | None = None,
              progress=None, send=None):
    """One load point -> its RunRecord (saved to `store` when given). `send` replaces client.run_point
    (same arguments, raw samples back): engine.cluster's Ray actors as several clients; its `facts` are recorded."""
    from engine.measure.machine import library_versions, machine_facts
    from engine.measure.records import RunRecord

    say = progress or (lambda s: None)
    ep, facts, tok, sampling = prepared.endpoint, prepared.facts, prepared.tokenizer, prepared.sampling
    limits = cfg.limits(len(prepared.requests))
    tag, warm, reqs = prepared.next_point(limits.warmup)
    slo = cfg.parsed_slo()
    say(f"{profile.label}: {len(reqs)} requests to {ep.base}")
    client.warm_up(ep, warm, limits, sampling)
    before = client.fetch_metrics(ep) if facts.get("metrics_endpoint") else None
    if cfg.generator == "guidellm":
        from engine.load import guidellm

        raw = guidellm.run_point(ep.base, ep.model, reqs, profile, limits, tok, tokenizer_folder(cfg.tokenizer))
    else:
        raw = (send or client.run_point)(ep, reqs, profile, limits, sampling)
    after = client.fetch_metrics(ep) if facts.get("metrics_endpoint") else None
    samples = [M.per_request(s, tok) for s in raw]
    for s in samples:
        s["met_slo"] = slo.met_by(s)
    load = M.summarize(samples, slo)
    done = [s for s in samples if s.get("ok")]
    load["lengths_forced"] = M.lengths_forced(done, facts["accepts"])
    load["meets_slo"] = M.meets_slo(load, slo)
    load["spec_by_category"] = M.spec_by_category(done)
    srv = server_metrics.summary(before, after)
    load["server_metrics"] = srv
    load["server_view"] = server_metrics.server_view(srv.get("delta") or {}, load.get("duration_s"))
    load["prefix_cache"] = server_metrics.prefix_cache_from(srv.get("delta") or {})
    metrics = {"load": load}
    spec = server_metrics.spec_from(srv.get("delta") or {})
    if spec:
        metrics["spec"] = spec
    s = {**server_from_facts(facts, ep.base), **(cfg.server or {})}  # what the launcher or user said wins
    config = {
        "system": s.get("system") or "endpoint", "label": s.get("label") or ep.base,
        "model": s.get("model") or ep.model, "precision": s.get("precision"), "draft": s.get("draft"),
        "calibration": s.get("calibration"), "batch_size": 1, "endpoint": {"url": ep.base, "model": ep.model},
        "profile": {**profile.to_dict(), "label": profile.label}, "slo": {**slo.to_dict(), "label": slo.label},
        "workload": {**_workload_facts(cfg, reqs), **prepared.cut, "fresh_tag": tag},
        "tokenizer": str(tokenizer_folder(cfg.tokenizer)),
        "generator": GENERATORS[cfg.generator],
        "server": {**facts, **{k: v for k, v in s.items() if k not in ("system", "label")}},
        "load_config": cfg.record_config(), "sweep": sweep, "clients": getattr(send, "facts", None),
    }
    versions = library_versions()
    versions["httpx"] = md.version("httpx")
    rec = RunRecord(kind="load", config=config, metrics=metrics, machine=machine_facts("cpu"), versions=versions,
                    output={"samples": samples},
                    notes="" if load["completed"] else f"failed: no request completed "
                    f"({(samples[0].get('error') if samples else 'none sent')})")
    if store is not None:
        store.save_run(rec)
    say(f"{profile.label}: {load['completed']}/{load['requests']} ok, {load['output_tok_s'] or 0:.1f} tok/s, "
        f"goodput {load['goodput_req_s'] or 0:.2f} req/s")
    return rec


def _workload_facts(cfg: LoadConfig, reqs: list[Request]) -> dict:
    out_lens = [r.max_tokens for r in reqs]
    return {"spec": cfg.workload, "input_len": cfg.input_len, "output_len": cfg.output_len,
            "prompt_kind": None if cfg.workload else cfg.prompt_kind, "requests": len(reqs),
            "max_output_len": cfg.max_output_len, "prompt_tokens_total": sum(r.prompt_tokens for r in reqs),
            "requested_output_tokens_total": sum(out_lens),
            "capped": sum(1 for r in reqs if r.reference_tokens and r.reference_tokens > r.max_tokens)}


def run(cfg: LoadConfig, store=None, progress=None, send=None) -> list:
    """The load test `cfg` describes: one record for a point, several for a sweep."""
    prepared = prepare(cfg, progress)
    profile = cfg.parsed_profile()
    if profile.kind == "sweep":
        return run_sweep_profile(cfg, profile, prepared, store, progress, send)
    return [run_point(cfg, profile, prepared, store, progress=progress, send=send)]


def run_sweep_profile(cfg: LoadConfig, profile: Profile, prepared: Prepared, store=None, progress=None,
                      send=None) -> list:
    """GuideLLM's sweep: synchronous, throughput, then `steps` constant rates up to the throughput's rate."""
    sid = uuid.uuid4().hex[:8]
    recs = []

    def point(p: Profile, kind: str):
        rec = run_point(cfg, p, prepared, store, {"id": sid, "index": len(recs), "point": kind}, progress, send)
        recs.append(rec)
        return rec.metrics["load"].get("request_s") or 0.0

    lo = point(Profile("synchronous", streams=1, seed=cfg.seed), "synchronous")
    hi = point(Profile("throughput", seed=cfg.seed), "throughput")
    if hi <= 0 or lo <= 0:
        return recs
    hi = max(hi, lo)
    for i in range(1, profile.steps + 1):
        rate = lo + (hi - lo) * i / profile.steps
        point(Profile("constant", rate=round(rate, 4), seed=cfg.seed), "constant")
    return recs


def sweep_result(recs: list) -> dict:
    """The highest request rate whose point met the SLO, from a sweep's records (recomputable from the store)."""
    ok = [r for r in recs if (r.metrics.get("load") or {}).get("meets_slo")
          and (r.config.get("profile") or {}).get("kind") in ("synchronous", "constant", "poisson")]
    best = max(ok, key=lambda r: r.metrics["load"]["request_s"] or 0, default=None)
    if best is None:
        return {"max_rate_meeting_slo": None, "run_id": None, "goodput_req_s": None}
    p = best.config["profile"]
    rate = p.get("rate") if p.get("rate") is not None else best.metrics["load"]["request_s"]
    return {"max_rate_meeting_slo": rate, "run_id": best.run_id, "goodput_req_s": best.metrics["load"]["goodput_req_s"]}
