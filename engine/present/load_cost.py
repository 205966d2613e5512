"""$/1M output tokens at the SLO, and the load at which a configuration stops paying, from `load` records.

Cost at the SLO (one configuration, its load points):
  goodput tok/s of a point = output tokens of the requests that met every SLO / the point's window;
  the point used = the one at the highest offered load (concurrency, or request rate) whose point
  met the SLO (metrics.load.meets_slo: at least `attainment` of its requests met every bound);
  $/1M = usd_per_million_tokens(that goodput, $/hour) (engine.common.formulas).
  No point met the SLO: there is no number, the answer is "infeasible at this SLO on this machine".

Crossover (a candidate against its baseline, measured side by side at the same loads): at each
load both measured, ratio = candidate / baseline of a metric (default: aggregate output tok/s,
which sets $/1M at that load). The candidate leads where ratio > 1 + margin (for a lower-is-better
metric, < 1 - margin). It stops paying at the first load, in ascending order, where it does not lead;
if it leads at every load, it pays up to the largest measured one.

KV cache quantized or not (kv_cost_rows): our server with the same weights, draft, workload, SLO and
KV budget, its KV cache stored quantized (int8, fp8) in one configuration and at the compute dtype in
the other; each priced at the SLO as above, and the ratio unquantized / quantized $/1M.

Configurations are told apart by what the record says about the server (label, model), the
workload, the SLO and our server's KV cache; records of other kinds are ignored. Reads records only.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.common.fields import L, M
from engine.common.formulas import sequences_in_blocks, usd_per_million_tokens
from engine.common.vocab import QUANTIZED_KV

INFEASIBLE = "infeasible at this SLO on this machine"
CLOSED = ("synchronous", "concurrent", "throughput")
OPEN = ("constant", "poisson")
# metric -> (where it is in metrics.load, higher is better, label)
METRICS = {L.output_tok_s: (L.output_tok_s, True, "output tok/s"),
           "goodput_tok_s": (None, True, "goodput tok/s (requests meeting the SLO)"),
           L.itl_s_p50: (L.itl_s_p50, False, "ITL p50"),
           L.ttft_s_p90: (L.ttft_s_p90, False, "TTFT p90")}


def _cfg(rec) -> dict:
    return rec.config or {}


def _load(rec) -> dict:
    return (rec.metrics or {}).get(M.load) or {}


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def is_load(rec) -> bool:
    return getattr(rec, "kind", None) == "load" and bool(_load(rec))


# ---------------------------------------------------------------- configurations

def kv_of(rec) -> dict | None:
    """Our server's KV cache as a load record says it: the server's own account (/v1/models lab.kv and
    lab.settings, kept by the load client), else what the launcher asked for; None for a peer or a record
    from before the paged cache. `sequences`: whole sequences of max_model_len positions the blocks hold
    (the slot cache: its slots)."""
    srv = _cfg(rec).get("server") or {}
    lab = srv.get("lab") if isinstance(srv.get("lab"), dict) else {}
    kv = lab.get("kv") if isinstance(lab.get("kv"), dict) else {}
    st = lab.get("settings") if isinstance(lab.get("settings"), dict) else {}
    if not kv and not srv.get("kv_dtype"):
        return None
    out = {"cache": kv.get("kv_cache") or srv.get("kv_cache") or "paged",
           "dtype": kv.get("kv_dtype") or srv.get("kv_dtype"),  # what it stored ('auto' resolved)
           "asked": st.get("kv_dtype") or srv.get("kv_dtype") or "auto",
           "budget_gib": _num(st.get("kv_cache_gib", srv.get("kv_cache_gib"))) or None,
           "blocks": kv.get("num_blocks"), "block_size": kv.get("block_size"), "bytes": kv.get("kv_bytes"),
           "max_model_len": st.get("max_model_len") or srv.get("max_model_len"),
           "prefix_caching": kv.get("prefix_caching", st.get("prefix_caching")),
           "window": kv.get("kv_window") or None,  # a sequence holds its window (every layer's, or:)
           "window_layers": kv.get("window_layers") or None}  # those layers' in a pool of their own
    if out["cache"] == "slots":
        out["sequences"] = st.get("max_seqs") or srv.get("slots")
    elif out["blocks"] and out["block_size"] and out["max_model_len"]:
        out["sequences"] = sequences_in_blocks(out["blocks"], out["block_size"], out["max_model_len"],
                                               kv.get("sequence_blocks") or 0)
    else:
        out["sequences"] = None
    return out


def kv_text(kv: dict | None) -> str | None:
    """'int8 paged, 0.25 GiB (1126 blocks)'; 'fp32 slots'; ', holds a 4096-token window' when every layer
    is windowed, ', 5 windowed layers hold a 4096-token window' beside full ones; None for no KV facts."""
    if not kv:
        return None
    where = f", {kv['budget_gib']:g} GiB" if kv.get("budget_gib") else ""
    blocks = f" ({kv['blocks']} blocks)" if kv.get("blocks") else ""
    window = "" if not kv.get("window") else f", holds a {kv['window']}-token window" if not kv.get("window_layers") \
        else f", {kv['window_layers']} windowed layers hold a {kv['window']}-token window"
    return f"{kv.get('dtype') or '?'} {kv.get('cache')}{where}{blocks}{window}"


def _kv_key(rec) -> str:
    kv = kv_of(rec)
    return "" if not kv else f"{kv.get('asked')} {kv.get('cache')} {kv.get('budget_gib') or ''}".strip()


def config_key(rec) -> tuple:
    """What makes two load records the same configuration: server, model, workload, SLO, and our server's
    KV cache (its dtype, kind and budget)."""
    c = _cfg(rec)
    return (c.get("label") or c.get("system") or "?", c.get("model") or "?",
            (c.get("workload") or {}).get("spec") or _fixed(c), (c.get("slo") or {}).get("label") or "none",
            _kv_key(rec))


def _fixed(c: dict) -> str:
    w = c.get("workload") or {}
    return f"{w.get('input_len')}/{w.get('output_len')} tokens" if w.get("input_len") else "?"


def configurations(records) -> dict[str, list]:
    """Load records grouped by configuration, under a readable name (label · model, plus the workload
    or SLO where two groups differ only there), in the order first seen."""
    groups: dict[tuple, list] = {}
    for r in records:
        if is_load(r):
            groups.setdefault(config_key(r), []).append(r)
    out: dict[str, list] = {}
    for key, recs in groups.items():
        base = f"{key[0]} · {key[1]}"
        twins = [k for k in groups if (k[0], k[1]) == (key[0], key[1])]
        # what tells twins apart, and only that: the workload, the SLO, our server's KV cache
        parts = [fmt.format(key[i] or "unrecorded") for i, fmt in ((2, "{}"), (3, "SLO {}"), (4, "KV {}"))
                 if len({k[i] for k in twins}) > 1]
        out[" · ".join([base] + parts)] = recs
    return out


# ---------------------------------------------------------------- load level and goodput

def axis_of(records) -> str:
    """'rate' when any point was sent at a rate (constant, poisson), else 'concurrency'."""
    kinds = {(_cfg(r).get("profile") or {}).get("kind") for r in records if is_load(r)}
    return "rate" if kinds & set(OPEN) else "concurrency"


def load_level(rec, axis: str = "concurrency") -> float | None:
    """The offered load of a point on `axis`: concurrency = streams (synchronous 1, throughput every
    request at once); rate = requests/s sent (closed-loop points: the rate they achieved, as
    GuideLLM's sweep places them)."""
    p = _cfg(rec).get("profile") or {}
    kind = p.get("kind")
    if axis == "rate":
        if kind in OPEN:
            return _num(p.get("rate"))
        return _num(_load(rec).get(L.request_s))
    if kind == "synchronous":
        return 1.0
    if kind == "concurrent":
        return _num(p.get("streams"))
    if kind == "throughput":
        return _num(_load(rec).get(L.requests))
    return None


def goodput_tok_s(rec) -> tuple[float | None, str]:
    """(output tokens/s of the requests that met every SLO, how it was counted).

    From the per-request samples when the record has them; otherwise output tok/s scaled by the share
    of completed requests that met the SLO (assumes they were of average length; said so)."""
    m = _load(rec)
    window = _num(m.get(L.duration_s))
    samples = (rec.output or {}).get("samples") if isinstance(rec.output, dict) else None
    if samples and window and window > 0:
        toks = sum(s.get("output_tokens") or 0 for s in samples if s.get("ok") and s.get("met_slo"))
        return toks / window, "samples"
    out, good, done = _num(m.get(L.output_tok_s)), _num(m.get(L.goodput_req_s)), _num(m.get(L.request_s))
    if out is None or good is None or not done:
        return None, "unknown"
    return out * good / done, "scaled from goodput req/s (no samples)"


@dataclass(frozen=True)
class LoadPoint:
    run_id: str
    profile: str
    load: float | None
    meets_slo: bool
    attainment: float | None
    output_tok_s: float | None
    goodput_tok_s: float | None
    goodput_source: str


def points(records, axis: str | None = None) -> list[LoadPoint]:
    """One configuration's points, ascending by offered load."""
    recs = [r for r in records if is_load(r)]
    axis = axis or axis_of(recs)
    out = []
    for r in recs:
        m = _load(r)
        g, src = goodput_tok_s(r)
        out.append(LoadPoint(r.run_id, (_cfg(r).get("profile") or {}).get("label") or "?", load_level(r, axis),
                             bool(m.get(L.meets_slo)), _num(m.get(L.slo_attainment)), _num(m.get(L.output_tok_s)),
                             g, src))
    return sorted(out, key=lambda p: (p.load is None, p.load or 0.0))


# ---------------------------------------------------------------- cost at the SLO

@dataclass
class SLOCost:
    """$/1M output tokens at the SLO for one configuration, with the point it came from, or why none."""

    configuration: str
    usd_per_hour: float
    axis: str
    slo: str
    usd_per_1m_out: float | None = None
    point: LoadPoint | None = None
    single_stream_usd_per_1m_out: float | None = None  # the concurrency-1 point's output tok/s, priced
    reason: str | None = None                            # why there is no number
    points: list[LoadPoint] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.usd_per_1m_out is not None

    @property
    def answer(self) -> str:
        if self.feasible:
            return (f"${self.usd_per_1m_out:.4g} per 1M output tokens at {self.axis} {_fmt(self.point.load)} "
                    f"({self.point.goodput_tok_s:.3g} goodput tok/s, SLO {self.slo})")
        return f"{INFEASIBLE} ({self.reason})"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(feasible=self.feasible, answer=self.answer)
        return d


def _fmt(x: float | None) -> str:
    return "?" if x is None else (f"{x:g}" if x == int(x) else f"{x:.3g}")


def cost_at_slo(records, usd_per_hour: float, configuration: str | None = None) -> SLOCost:
    """$/1M output tokens at the SLO for ONE configuration's load records (see the module docstring)."""
    recs = [r for r in records if is_load(r)]
    keys = {config_key(r) for r in recs}
    name = configuration or (next(iter(configurations(recs))) if recs else "?")
    axis = axis_of(recs)
    slo = ", ".join(sorted({k[3] for k in keys})) or "none"
    res = SLOCost(name, usd_per_hour, axis, slo)
    usd_per_million_tokens(1.0, usd_per_hour)  # refuses a bad price before anything else
    if not recs:
        res.reason = "no load records"
        return res
    if len(keys) > 1:
        res.reason = f"the records are {len(keys)} configurations; price each on its own (configurations())"
        return res
    res.points = pts = points(recs, axis)
    one = [p for p in pts if p.load == 1.0 and axis == "concurrency" and p.output_tok_s]
    if one:
        res.single_stream_usd_per_1m_out = usd_per_million_tokens(max(p.output_tok_s for p in one), usd_per_hour)
    ok = [p for p in pts if p.meets_slo and p.load is not None and p.goodput_tok_s]
    if not ok:
        best = max(pts, key=lambda p: p.attainment or 0.0)
        if best.attainment is None:
            res.reason = "no point completed a request"
        else:
            res.reason = (f"no point meets the SLO {slo}: the best, {best.profile}, had {best.attainment:.0%} of its "
                          "requests within every bound")
        return res
    top = max(p.load for p in ok)
    res.point = max((p for p in ok if p.load == top), key=lambda p: p.goodput_tok_s)
    res.usd_per_1m_out = usd_per_million_tokens(res.point.goodput_tok_s, usd_per_hour)
    return res


def costs_at_slo(records, usd_per_hour: float) -> list[SLOCost]:
    """cost_at_slo for every configuration among the records."""
    return [cost_at_slo(recs, usd_per_hour, name) for name, recs in configurations(records).items()]


def _sig(x: float | None, digits: int = 4) -> float | None:
    """x to `digits` significant digits, for tables (the SLOCost keeps the exact value)."""
    return None if x is None else float(f"{x:.{digits}g}")


def cost_rows(costs: list[SLOCost]) -> list[dict]:
    """A table of costs at the SLO: the answer, the point, the single-stream figure beside it."""
    return [{"configuration": c.configuration, "slo": c.slo,
             "usd_per_1m_out_at_slo": _sig(c.usd_per_1m_out),
             "at": f"{c.point.profile} ({c.axis} {_fmt(c.point.load)})" if c.point else INFEASIBLE,
             "goodput_tok_s": round(c.point.goodput_tok_s, 1) if c.point and c.point.goodput_tok_s is not None
             else None,
             "usd_per_1m_out_single_stream": _sig(c.single_stream_usd_per_1m_out),
             "why": c.reason or "", "run": c.point.run_id if c.point else None} for c in costs]


# ---------------------------------------------------------------- crossover

@dataclass
class Crossover:
    """Where `candidate` (spec on, or the smaller precision) stops leading `baseline` as load rises."""

    candidate: str
    baseline: str
    kind: str              # speculation | precision | custom
    metric: str
    axis: str
    loads: list[float] = field(default_factory=list)
    candidate_values: list[float | None] = field(default_factory=list)
    baseline_values: list[float | None] = field(default_factory=list)
    ratios: list[float | None] = field(default_factory=list)
    leads: list[bool] = field(default_factory=list)
    stops_paying_at: float | None = None   # the first load where the candidate does not lead
    verdict: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _metric(rec, metric: str) -> float | None:
    if metric == "goodput_tok_s":
        return goodput_tok_s(rec)[0]
    return _num(_load(rec).get(METRICS[metric][0]))


def _by_load(records, metric: str, axis: str) -> dict[float, float]:
    """load -> the metric there (points at the same load: their mean)."""
    acc: dict[float, list[float]] = {}
    for r in records:
        if not is_load(r):
            continue
        x, v = load_level(r, axis), _metric(r, metric)
        if x is not None and v is not None:
            acc.setdefault(x, []).append(v)
    return {x: sum(vs) / len(vs) for x, vs in acc.items()}


def crossover(candidate_records, baseline_records, candidate: str = "candidate", baseline: str = "baseline",
              metric: str = L.output_tok_s, kind: str = "custom", margin: float = 0.0) -> Crossover:
    """The first load at which the candidate stops leading its baseline (see the module docstring)."""
    if metric not in METRICS:
        from engine.common.errors import UserError

        raise UserError(f"unknown crossover metric '{metric}'", f"use one of: {', '.join(METRICS)}")
    axis = axis_of(list(candidate_records) + list(baseline_records))
    a, b = _by_load(candidate_records, metric, axis), _by_load(baseline_records, metric, axis)
    higher = METRICS[metric][1]
    x = Crossover(candidate, baseline, kind, metric, axis)
    x.loads = sorted(set(a) & set(b))
    for load in x.loads:
        va, vb = a[load], b[load]
        ratio = va / vb if vb else None
        lead = ratio is not None and (ratio > 1 + margin if higher else ratio < 1 - margin)
        x.candidate_values.append(va)
        x.baseline_values.append(vb)
        x.ratios.append(ratio)
        x.leads.append(lead)
    label = METRICS[metric][2]
    if not x.loads:
        x.verdict = f"not measured at a common {axis}: run both at the same loads"
        return x
    lost = next((load for load, lead in zip(x.loads, x.leads) if not lead), None)
    x.stops_paying_at = lost
    if lost is None:
        x.verdict = f"{candidate} leads {baseline} on {label} at every measured {axis}, up to {_fmt(x.loads[-1])}"
    elif lost == x.loads[0]:
        later = [_fmt(load) for load, lead in zip(x.loads, x.leads) if lead]
        x.verdict = (f"{candidate} does not lead {baseline} on {label} even at {axis} {_fmt(lost)} "
                     f"(ratio {x.ratios[0]:.2f})"
                     + (f"; it leads at {', '.join(later)}" if later else ": it never pays here"))
    else:
        prev = x.loads[x.loads.index(lost) - 1]
        x.verdict = (f"{candidate} leads {baseline} on {label} up to {axis} {_fmt(prev)} "
                     f"and stops paying at {_fmt(lost)} "
                     f"(ratio {x.ratios[x.loads.index(lost)]:.2f})")
    return x


def _facts(recs) -> dict:
    c = _cfg(recs[0])
    draft = c.get("draft")
    return {"system": c.get("system"), "model": c.get("model"), "precision": str(c.get("precision") or ""),
            "draft": (draft or {}).get("kind") if isinstance(draft, dict) else (draft or None),
            "workload": config_key(recs[0])[2], "slo": config_key(recs[0])[3],
            "kv": kv_of(recs[0]) or {}}


def _same_kv(f: dict, g: dict) -> bool:
    """The same KV cache asked for (kind, dtype setting, budget): int4 and bf16 weights both at 'auto' are
    like-for-like, though auto stores each at its compute dtype."""
    return all(f["kv"].get(k) == g["kv"].get(k) for k in ("asked", "cache", "budget_gib"))


CHEAPER = ("int4", "int8")  # candidate precisions, each against the wider ones after it
WIDER = {"int4": ("int8", "bf16", "fp32"), "int8": ("bf16", "fp32")}


def crossover_pairs(records, metric: str = L.output_tok_s) -> list[Crossover]:
    """Every pair measured side by side: spec on vs off (same server, model, precision), and int4 vs
    int8/bf16 (our engine without a draft, same model); same workload and SLO in each pair."""
    groups = configurations(records)
    facts = {n: _facts(rs) for n, rs in groups.items()}
    out = []

    def same(f, g, *keys):
        return all(f[k] == g[k] for k in keys)

    for n, f in facts.items():
        if f["draft"] in (None, "none"):
            continue
        for m, g in facts.items():
            if g["draft"] in (None, "none") and same(f, g, "system", "model", "precision", "workload", "slo") \
                    and _same_kv(f, g):
                out.append(crossover(groups[n], groups[m], n, m, metric, "speculation"))
    for n, f in facts.items():
        if f["draft"] not in (None, "none") or f["precision"].split("-")[0] not in CHEAPER:
            continue
        for m, g in facts.items():
            if g["draft"] in (None, "none") and g["precision"].split("-")[0] in WIDER[f["precision"].split("-")[0]] \
                    and same(f, g, "system", "model", "workload", "slo") and _same_kv(f, g):
                out.append(crossover(groups[n], groups[m], n, m, metric, "precision"))
    for n, m in kv_pairs(facts):
        out.append(crossover(groups[n], groups[m], n, m, metric, "kv-cache"))
    return out


def kv_pairs(facts: dict) -> list[tuple[str, str]]:
    """(quantized KV, unquantized KV) configurations of our server that differ only there: the same model,
    weights, draft, workload, SLO and KV budget."""
    out = []
    for n, f in facts.items():
        if f["kv"].get("dtype") not in QUANTIZED_KV:
            continue
        for m, g in facts.items():
            if g["kv"] and g["kv"].get("dtype") not in QUANTIZED_KV and g["kv"].get("cache") == "paged" \
                    and f["kv"].get("budget_gib") == g["kv"].get("budget_gib") \
                    and all(f[k] == g[k] for k in ("system", "model", "precision", "draft", "workload", "slo")):
                out.append((n, m))
    return out


KV_COST_LABELS = {"weights": "weights", "kv_budget_gib": "KV budget GiB", "kv_quantized": "KV quantized",
                  "kv_unquantized": "KV not", "sequences_quantized": "sequences (quantized)",
                  "sequences_unquantized": "sequences (not)", "usd_per_1m_out_at_slo_quantized":
                  "$/1M out at the SLO (quantized)", "usd_per_1m_out_at_slo_unquantized": "$/1M out at the SLO (not)",
                  "at_quantized": "at (quantized)", "at_unquantized": "at (not)",
                  "unquantized_over_quantized": "not / quantized", "workload": "workload", "slo": "SLO",
                  "why": "why not"}


def kv_cost_rows(records, usd_per_hour: float) -> list[dict]:
    """$/1M output tokens at the SLO with the KV cache quantized and not, pair by pair (kv_pairs): the
    sequences of max_model_len each cache's blocks hold at the same budget, the cost at the SLO of each,
    and the unquantized cost over the quantized one (above 1: quantizing the KV cache saves)."""
    groups = configurations(records)
    facts = {n: _facts(rs) for n, rs in groups.items()}
    rows = []
    for n, m in kv_pairs(facts):
        q, b = cost_at_slo(groups[n], usd_per_hour, n), cost_at_slo(groups[m], usd_per_hour, m)
        kq, kb = facts[n]["kv"], facts[m]["kv"]
        saving = b.usd_per_1m_out / q.usd_per_1m_out if q.feasible and b.feasible else None
        rows.append({"weights": facts[n]["precision"], "kv_budget_gib": kq.get("budget_gib"),
                     "kv_quantized": kq.get("dtype"), "kv_unquantized": kb.get("dtype"),
                     "sequences_quantized": kq.get("sequences"), "sequences_unquantized": kb.get("sequences"),
                     "usd_per_1m_out_at_slo_quantized": _sig(q.usd_per_1m_out),
                     "usd_per_1m_out_at_slo_unquantized": _sig(b.usd_per_1m_out),
                     "at_quantized": f"{q.axis} {_fmt(q.point.load)}" if q.point else INFEASIBLE,
                     "at_unquantized": f"{b.axis} {_fmt(b.point.load)}" if b.point else INFEASIBLE,
                     "unquantized_over_quantized": None if saving is None else round(saving, 3),
                     "workload": facts[n]["workload"], "slo": facts[n]["slo"],
                     "why": "; ".join(x for x in (q.reason, b.reason) if x)})
    return rows
