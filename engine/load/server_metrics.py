"""A server's /metrics before and after a load point, and what changed (acceptance over the load test).

vLLM names its counters `vllm:*` (our server uses the same names); llama-server names its own
`llamacpp:*` (with `--metrics`). Every counter's difference is kept as the server offers it; where
vLLM's speculative-decoding counters are present, the acceptance over the load point is derived
with vLLM's definitions (shared/reference/metrics.md): acceptance rate = accepted / draft tokens,
mean acceptance length = 1 + accepted / drafts, per-position rate = accepted at i / drafts.
"""
from __future__ import annotations

import re

from engine.common.formulas import acceptance_rate, mean_acceptance_length

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)(\s+\d+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SPEC = "vllm:spec_decode_"
LLAMA_SPEC = "llamacpp:spec_decode_"  # llama-server (with a draft) counts the same three under its own prefix


def parse(text: str | None) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} for counters (and histogram/summary _sum/_count)."""
    if not text:
        return {}
    types: dict[str, str] = {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# TYPE"):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if not _is_counter(name, types):
            continue
        try:
            out[name + _canonical(labels)] = float(value)
        except ValueError:
            continue
    return out


def _is_counter(name: str, types: dict[str, str]) -> bool:
    if types.get(name) == "counter" or name.endswith("_total"):
        return True
    for suffix in ("_sum", "_count"):
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) in ("histogram", "summary"):
            return True
    return False


def _canonical(labels: str) -> str:
    """Labels sorted, and the per-process ones (model name, engine id) kept: {a="1",b="2"}."""
    pairs = sorted(_LABEL.findall(labels))
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}" if pairs else ""


def diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters that moved during the load point (a counter reset reads as the after value)."""
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        if d < 0:
            d = v
        if d:
            out[k] = round(d, 6)
    return out


def _sum(d: dict[str, float], name: str) -> float | None:
    xs = [v for k, v in d.items() if k == name or k.startswith(name + "{")]
    return sum(xs) if xs else None


def spec_from(delta: dict[str, float]) -> dict | None:
    """metrics.spec over the load point from vLLM's counters, or llama-server's of the same names under
    `llamacpp:` (None when the server drafted nothing)."""
    if not _sum(delta, SPEC + "num_drafts_total") and _sum(delta, LLAMA_SPEC + "num_drafts_total"):
        delta = {SPEC + k[len(LLAMA_SPEC):]: v for k, v in delta.items() if k.startswith(LLAMA_SPEC)}
    drafts = _sum(delta, SPEC + "num_drafts_total")
    drafted = _sum(delta, SPEC + "num_draft_tokens_total")
    accepted = _sum(delta, SPEC + "num_accepted_tokens_total")
    if not drafts or drafted is None or accepted is None:
        return None
    per_pos: dict[int, float] = {}
    for k, v in delta.items():
        if k.startswith(SPEC + "num_accepted_tokens_per_pos_total{"):
            m = re.search(r'position="(\d+)"', k)
            if m:
                per_pos[int(m.group(1))] = per_pos.get(int(m.group(1)), 0.0) + v
    rates = [per_pos.get(i, 0.0) / drafts for i in range(max(per_pos) + 1)] if per_pos else None
    return {"rounds": int(drafts), "drafted": int(drafted), "accepted": int(accepted),
            "acceptance_rate": acceptance_rate(accepted, drafted),
            "mean_acceptance_length": mean_acceptance_length(accepted, drafts), "mean_gamma": drafted / drafts,
            "position_rate": rates, "source": "server /metrics, difference over the load point"}


def prefix_cache_from(delta: dict[str, float]) -> dict | None:
    """The prefix cache over the load point, from vLLM's counters (tokens): hit rate = hits / queries, and
    the preemptions (None when the server counts neither)."""
    queries = _sum(delta, "vllm:prefix_cache_queries_total")
    preempted = _sum(delta, "vllm:num_preemptions_total")
    if queries is None and preempted is None:
        return None
    hits = _sum(delta, "vllm:prefix_cache_hits_total") or 0.0
    return {"queries": int(queries or 0), "hits": int(hits), "hit_rate": hits / queries if queries else None,
            "preemptions": int(preempted or 0), "source": "server /metrics, difference over the load point"}


def server_view(delta: dict[str, float], window_s: float | None) -> dict | None:
    """The server's own timings of the point's requests, where it offers vLLM's histograms: the mean
    arrival-to-finish, arrival-to-first-token and queue time, and the mean requests in flight as the server
    saw them (its e2e sum over the client's window). Beside the client's figures, these say whether a gap
    between two clients is the server's (it ran slower) or the client's (its own time, or fewer in flight)."""
    n = _sum(delta, "vllm:e2e_request_latency_seconds_count")
    if not n or not window_s:
        return None

    def mean(name):
        total = _sum(delta, f"vllm:{name}_seconds_sum")
        return total / n if total is not None else None

    e2e = _sum(delta, "vllm:e2e_request_latency_seconds_sum")
    return {"requests": int(n), "e2e_s_mean": mean("e2e_request_latency"), "ttft_s_mean": mean("time_to_first_token"),
            "queue_s_mean": mean("request_queue_time"), "concurrency_mean": e2e / window_s}


def summary(before_text: str | None, after_text: str | None) -> dict:
    """What the record keeps: whether /metrics was there, every counter's change, the family of names."""
    if before_text is None or after_text is None:
        return {"available": False}
    delta = diff(parse(before_text), parse(after_text))
    families = sorted({k.split(":", 1)[0] for k in parse(after_text) if ":" in k})
    return {"available": True, "families": families, "delta": delta}
