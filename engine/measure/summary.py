"""Generations become a run record: per-generation metrics, the samples, medians and their intervals.

One generation (one prompt of the workload, b sequences) gives the metrics of `summarize`; a run
measures many (every prompt, R repetitions) and `aggregate` turns them into the record's metrics:
each per-generation metric is the median over the samples, acceptance counters are summed, and
stats.py gives the intervals (its docstring says which bootstrap each one uses, and why).
"""
from __future__ import annotations

import torch

from engine.common.formulas import expected_length, kv_bytes_per_token
from engine.common.fields import BASELINE_AT, CAT, IV, M, PER_GENERATION, S, SMP, SPEC_AT, Metrics
from engine.measure.machine import library_versions, machine_facts
from engine.measure.memory import PeakMemory
from engine.measure.records import RunRecord
from engine.measure.stats import bootstrap, finite, mean, median, percentile, repetition_spread


def kv_bytes_per_slot(lm) -> float:
    """K and V bytes of one cache slot (one token of one sequence) in the model's compute dtype."""
    c = lm.cfg
    return kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, torch.finfo(lm.model.compute_dtype).bits / 8)


def decode_bytes_per_step(lm, cache_slots: int, batch: int) -> int:
    """Bytes one decode step reads: the weights but the embedding table (a lookup reads one row per
    token), and each sequence's KV cache at `cache_slots` slots."""
    w = sum(v for k, v in lm.weights.items() if k != "embedding")
    return int(w + kv_bytes_per_slot(lm) * cache_slots * batch)


def summarize(lm, res, mem: PeakMemory | None, bw_gbs: float) -> Metrics:
    """Metrics of one generation (checked against fields.py, which defines each one)."""
    b = len(res.new_tokens)
    tokens_after_first = res.n_new - b
    decode_s = sum(res.step_s)
    # All sequences together; each sequence emits tokens_per_step / b of them per step.
    tokens_per_step = (tokens_after_first / len(res.step_s)) if res.step_s else float(b)
    per_seq = max(tokens_per_step / b, 1e-9)
    step_ms = [1000 * s for s in res.step_s]
    per_token_ms = [t / per_seq for t in step_ms]  # the latency one user sees per token
    prompt_tok = sum(len(p) for p in res.prompt_tokens)
    longest = max(len(p) for p in res.prompt_tokens)
    longest_out = max(len(t) for t in res.new_tokens)
    bytes_step = decode_bytes_per_step(lm, int(longest + longest_out / 2), b)
    bytes_per_token = bytes_step / max(tokens_per_step, 1e-9)  # the weights are read once for the whole step
    floor_ms = bytes_per_token / (bw_gbs * 1e9) * 1000 if bw_gbs else None
    med_step = percentile(step_ms, 50)
    m = Metrics({
        M.ttft_s: res.ttft_s,
        M.prefill_s: res.prefill_s,
        M.prefill_tok_s: prompt_tok / res.prefill_s if res.prefill_s else None,
        M.prompt_tokens: prompt_tok,
        M.new_tokens: res.n_new,
        M.decode_s: decode_s,
        M.decode_tok_s: tokens_after_first / decode_s if decode_s else None,
        M.tokens_per_step: tokens_per_step,
        M.token_latency_ms_median: percentile(per_token_ms, 50),
        M.token_latency_ms_p90: percentile(per_token_ms, 90),
        M.token_latency_ms_p99: percentile(per_token_ms, 99),
        M.total_s: res.total_s,
        M.weight_bytes: lm.weight_bytes,
        M.weight_breakdown: dict(lm.weights),
        M.quantized_layers: dict(lm.quantized) or None,
        M.kv_bytes: res.kv_bytes,
        M.mem_bw_gbs: bw_gbs,
        M.bytes_per_token: bytes_per_token,
        M.bw_floor_ms: floor_ms,
        # The floor of the whole step over the measured step: per-token floor * tokens per step.
        M.bw_efficiency: (floor_ms * tokens_per_step / med_step) if (floor_ms and med_step) else None,
        M.load_s: lm.load_s,
        M.spec: res.spec,
    })
    if mem is not None:
        m.update(mem.as_dict())
    return m


# ---------------------------------------------------------------- samples

# the speculative counters a sample keeps and a run sums (fields.SPEC and fields.SAMPLE share their names)
COUNTERS = (SMP.drafted, SMP.accepted, SMP.rounds, SMP.emitted)


def sample(res, m: dict, category: str, prompt_id: str, rep: int) -> dict:
    """What the record keeps of one generation (fields.SAMPLE defines each key)."""
    s = {SMP.rep: rep, SMP.category: category, SMP.prompt_id: prompt_id, SMP.prompt_tokens: len(res.prompt_tokens[0]),
         SMP.new_tokens: res.n_new, SMP.ttft_s: m[M.ttft_s], SMP.decode_s: m[M.decode_s],
         SMP.decode_tok_s: m[M.decode_tok_s], SMP.token_latency_ms: m[M.token_latency_ms_median]}
    if res.spec:
        s.update({k: int(res.spec.get(k) or 0) for k in COUNTERS})
    return s


# (metric path, sample key): the speed figures whose interval comes from the repetitions.
SPEED = ((M.decode_tok_s, SMP.decode_tok_s), (M.ttft_s, SMP.ttft_s), (M.token_latency_ms_median, SMP.token_latency_ms))


def _interval(ci, over: str, n: int, kind: str = "interval") -> dict | None:
    return None if ci is None else {IV.lo: ci[0], IV.hi: ci[1], IV.over: over, IV.n: n, IV.kind: kind}


def _over_reps(groups: list, stat) -> dict | None:
    kind, ci = repetition_spread(groups, stat)
    return _interval(ci, "repetitions", len(groups), kind)


def _reps(samples: list[dict]) -> list[list[dict]]:
    by: dict[int, list] = {}
    for s in samples:
        by.setdefault(s[SMP.rep], []).append(s)
    return [by[r] for r in sorted(by)]


def _pooled_median(key):
    return lambda draw: median([s.get(key) for g in draw for s in g])


def speed(samples: list[dict], base: list[dict] | None = None) -> tuple[dict, dict]:
    """Medians of the speed figures and their repetition intervals; with `base` (the same prompts
    without speculation, interleaved with these), the baseline and the paired speedup."""
    vals, ivs = {}, {}
    reps = _reps(samples)
    for path, key in SPEED:
        vals[path] = median([s.get(key) for s in samples])
        ivs[path] = _over_reps(reps, _pooled_median(key))
    if base:
        b_reps = {r[0][SMP.rep]: r for r in _reps(base)}
        pairs = [(r, b_reps[r[0][SMP.rep]]) for r in reps if r[0][SMP.rep] in b_reps]
        b_tok = median([s.get(SMP.decode_tok_s) for s in base])
        vals[BASELINE_AT.decode_tok_s] = b_tok
        vals[BASELINE_AT.ttft_s] = median([s.get(SMP.ttft_s) for s in base])
        vals[BASELINE_AT.token_latency_ms_median] = median([s.get(SMP.token_latency_ms) for s in base])
        vals[SPEC_AT.baseline_tok_s] = b_tok
        vals[SPEC_AT.speedup] = vals[M.decode_tok_s] / b_tok if (b_tok and vals[M.decode_tok_s]) else None

        def ratio(draw):
            a = median([s.get(SMP.decode_tok_s) for p in draw for s in p[0]])
            b = median([s.get(SMP.decode_tok_s) for p in draw for s in p[1]])
            return a / b if a and b else None

        ivs[BASELINE_AT.decode_tok_s] = _over_reps([p[1] for p in pairs], _pooled_median(SMP.decode_tok_s))
        ivs[SPEC_AT.speedup] = _over_reps(pairs, ratio)
    return vals, ivs


def _per_prompt(samples: list[dict]) -> list[dict]:
    """Each prompt's acceptance counters summed over its repetitions."""
    by: dict[str, dict] = {}
    for s in samples:
        if SMP.drafted not in s:
            continue
        p = by.setdefault(s[SMP.prompt_id], {SMP.category: s[SMP.category], **{k: 0 for k in COUNTERS}})
        for k in COUNTERS:
            p[k] += s[k]
    return list(by.values())


def _token_rate(ps):
    d = sum(p[S.drafted] for p in ps)
    return sum(p[S.accepted] for p in ps) / d if d else None


def _token_length(ps):
    r = sum(p[S.rounds] for p in ps)
    return sum(p[S.emitted] for p in ps) / r if r else None


def _request_rate(ps):
    return mean([p[S.accepted] / p[S.drafted] for p in ps if p[S.drafted]])


def _request_length(ps):
    return mean([p[S.emitted] / p[S.rounds] for p in ps if p[S.rounds]])


ACCEPTANCE = ((S.acceptance_rate, _token_rate), (S.mean_acceptance_length, _token_length),
              (S.acceptance_rate_request_mean, _request_rate),
              (S.mean_acceptance_length_request_mean, _request_length))


def acceptance(samples: list[dict]) -> tuple[dict, dict]:
    """Token- and request-weighted acceptance with intervals over prompts (stratified by category)."""
    ps = _per_prompt(samples)
    if not ps:
        return {}, {}
    vals = {f"{M.spec}.{k}": int(sum(p[k] for p in ps)) for k in COUNTERS}
    vals[SPEC_AT.prompts] = len(ps)
    ivs = {}
    strata = [p[SMP.category] for p in ps]
    for name, fn in ACCEPTANCE:
        vals[f"{M.spec}.{name}"] = fn(ps)
        ivs[f"{M.spec}.{name}"] = _interval(bootstrap(ps, fn, strata), "prompts", len(ps))
    return vals, ivs


def _nest(flat: dict) -> dict:
    out: dict = {}
    for path, v in flat.items():
        head, _, rest = path.partition(".")
        if rest:
            out.setdefault(head, {})[rest] = v
        else:
            out[head] = v
    return out


def _block(samples: list[dict], base: list[dict] | None) -> tuple[dict, dict]:
    v, i = speed(samples, base)
    av, ai = acceptance(samples)
    return {**v, **av}, {k: x for k, x in {**i, **ai}.items() if x is not None}


def _spec_totals(specs: list[dict]) -> dict:
    """The run's speculative statistics: counters summed over every generation (vLLM's global counters)."""
    first = specs[0]
    out = {k: first.get(k) for k in (S.draft_kind, S.gamma, S.adaptive)}
    out.update({k: int(sum(s.get(k) or 0 for s in specs)) for k in COUNTERS})
    width = max(len(s.get(S.position_drafted) or []) for s in specs)
    pos_d, pos_a = [0] * width, [0] * width
    for s in specs:
        for j, (d, a) in enumerate(zip(s.get(S.position_drafted) or [], s.get(S.position_accepted) or [])):
            pos_d[j] += d
            pos_a[j] += a
    hist = [g for s in specs for g in (s.get(S.gamma_history) or [])]
    a = out[S.accepted] / out[S.drafted] if out[S.drafted] else None
    out.update({S.position_drafted: pos_d, S.position_accepted: pos_a,
                S.position_rate: [x / d if d else None for x, d in zip(pos_a, pos_d)], S.acceptance_rate: a,
                S.mean_acceptance_length: out[S.emitted] / out[S.rounds] if out[S.rounds] else None,
                S.mean_gamma: sum(hist) / len(hist) if hist else float(first.get(S.gamma) or 0),
                S.draft_s: median([s.get(S.draft_s) for s in specs]),
                S.verify_s: median([s.get(S.verify_s) for s in specs])})
    out[S.expected_length] = expected_length(a, out[S.mean_gamma])
    return out


def aggregate(gens: list[dict], samples: list[dict], base: list[dict] | None = None) -> Metrics:
    """The record's metrics from every measured generation (`gens`: summarize() of each) and its sample.

    Per-generation metrics: the median over the samples. Spec counters: summed. Intervals: stats.py.
    by_category holds the same figures for each category's samples.
    """
    # The run's own figures (weights, bandwidth, load time): the first generation's. Each per-generation
    # metric (fields.PER_GENERATION): the median over the generations.
    m = Metrics({k: v for k, v in gens[0].items() if k not in PER_GENERATION and k not in (M.kv_bytes, M.spec)})
    for k in PER_GENERATION:
        m[k] = median([g.get(k) for g in gens])
        if k in (M.prompt_tokens, M.new_tokens) and m[k] is not None and float(m[k]).is_integer():
            m[k] = int(m[k])  # counts stay whole where the median is one
    m[M.kv_bytes] = max(finite(g.get(M.kv_bytes) for g in gens) or [0])
    specs = [g[M.spec] for g in gens if g.get(M.spec)]
    vals, ivs = _block(samples, base)
    nested = _nest(vals)
    if specs:
        m[M.spec] = {**_spec_totals(specs), **nested.get(M.spec, {})}
    if M.baseline in nested:
        m[M.baseline] = nested[M.baseline]
    m[M.intervals] = ivs
    cats = list(dict.fromkeys(s[SMP.category] for s in samples))
    m[M.by_category] = {}
    for c in cats:
        cs = [s for s in samples if s[SMP.category] == c]
        cb = [s for s in (base or []) if s[SMP.category] == c] or None
        v, i = _block(cs, cb)
        block = _nest({k: x for k, x in v.items() if k.partition(".")[0] != M.baseline})
        block.update({CAT.samples: len(cs), CAT.prompts: len({s[SMP.prompt_id] for s in cs}), M.intervals: i})
        m[M.by_category][c] = block
    m[M.samples] = samples
    if base:
        m[M.baseline_samples] = base
    return m


def make_record(kind: str, lm, metrics: dict, output: dict, config, draft_lm=None,
                quality: dict | None = None) -> RunRecord:
    """The record of a measured run; `config` is its typed config (measure.record_config.RecordConfig)."""
    from engine import ops as kernels
    cfg = config.to_dict()
    if draft_lm is not None:
        metrics[M.draft_weight_bytes] = draft_lm.weight_bytes
    if quality:
        metrics[M.quality] = quality
    return RunRecord(kind=kind, config=cfg, metrics=metrics, machine=machine_facts(lm.device),
                     versions=library_versions(), kernels=kernels.backend_info(), output=output)
