"""A load point's metrics from its raw per-request samples (the one home of these definitions).

Definitions (GuideLLM's and vLLM `bench serve`'s, shared/reference/metrics.md), all timed on the client:
- ttft_s: request sent -> first chunk carrying text;
- itl_s (per request): (last text chunk - first text chunk) / (output tokens - 1), the mean gap
  after the first token (vLLM calls it TPOT); gaps: every gap between consecutive text chunks of
  every request, pooled (vLLM's ITL list; a chunk carrying several tokens is one gap);
- e2e_s: request sent -> stream closed;
- the measured window: the first send -> the last completion; output tok/s, requests/s and
  goodput (requests that met every SLO) are over that window;
- output tokens are counted with the client's tokenizer on the text received, and compared with the
  server's usage where it reports one; server_output_tok_s is the server's usage over the same window,
  the count vLLM `bench serve` divides (tokens that carry no text, e.g. special tokens past an ignored
  EOS, count there and not in output_tok_s).
Percentiles are over raw samples (engine.measure.stats.percentile); merging load points or clients
concatenates their samples (`merge`), never their percentiles.
"""
from __future__ import annotations

from engine.common.formulas import acceptance_rate, mean_acceptance_length
from engine.load.profiles import SLO
from engine.measure.stats import percentile

PCTS = (50, 90, 99)


def per_request(sample: dict, tokenizer=None) -> dict:
    """Add output_tokens, itl_s and gaps_s to a raw sample (tokens counted with `tokenizer`)."""
    from engine.load.requests import count_tokens

    s = dict(sample)
    times = s.pop("chunk_times_s", None) or []
    text = s.pop("text", "") or ""
    if "output_tokens" not in s:
        s["output_tokens"] = count_tokens(tokenizer, text) if tokenizer is not None else None
    usage = s.pop("usage", None) or {}
    s["server_prompt_tokens"] = usage.get("prompt_tokens")
    s["server_output_tokens"] = usage.get("completion_tokens")
    n = s["output_tokens"]
    first_last = s.pop("first_last_s", None)  # GuideLLM's results: the first and last token times only
    span = first_last or ([times[0], times[-1]] if len(times) > 1 else None)
    s["itl_s"] = (span[1] - span[0]) / (n - 1) if s.get("ok") and n and n > 1 and span else None
    s["gaps_s"] = None if first_last else [round(b - a, 6) for a, b in zip(times, times[1:])]
    s["chunks"] = None if first_last else len(times)
    for k in ("t_send_s", "t_end_s", "ttft_s", "e2e_s", "itl_s"):
        if isinstance(s.get(k), float):
            s[k] = round(s[k], 6)
    return s


def merge(*sample_lists: list[dict]) -> list[dict]:
    """Several clients' (or repetitions') samples as one list: raw samples, never percentiles."""
    out: list[dict] = []
    for xs in sample_lists:
        out += xs
    return out


def _stats(prefix: str, xs: list[float]) -> dict:
    out = {f"{prefix}_mean": sum(xs) / len(xs) if xs else None}
    for q in PCTS:
        out[f"{prefix}_p{q}"] = percentile(xs, q)
    return out


def summarize(samples: list[dict], slo: SLO) -> dict:
    """metrics.load for one load point (samples already through per_request)."""
    done = [s for s in samples if s.get("ok")]
    failed = [s for s in samples if not s.get("ok")]
    met = [s for s in done if slo.met_by(s)]
    start = min((s["t_send_s"] for s in samples), default=0.0)
    end = max((s["t_end_s"] for s in samples), default=0.0)
    window = end - start
    out_tokens = sum(s.get("output_tokens") or 0 for s in done)
    in_tokens = sum(s.get("prompt_tokens") or 0 for s in done)
    gaps = [g for s in done for g in s.get("gaps_s") or []]
    m = {
        "requests": len(samples), "completed": len(done), "failed": len(failed),
        "rejected": sum(1 for s in failed if s.get("status") == 429),
        "duration_s": window if samples else None,
        "request_s": len(done) / window if window > 0 else None,
        "output_tok_s": out_tokens / window if window > 0 else None,
        "prompt_tok_s": in_tokens / window if window > 0 else None,
        "output_tokens": out_tokens, "prompt_tokens": in_tokens,
        "goodput_req_s": len(met) / window if window > 0 else None,
        "slo_attainment": len(met) / len(samples) if samples else None,
        "concurrency_mean": sum(s["e2e_s"] for s in samples) / window if window > 0 else None,
        **_stats("ttft_s", [s["ttft_s"] for s in done if s.get("ttft_s") is not None]),
        **_stats("itl_s", [s["itl_s"] for s in done if s.get("itl_s") is not None]),
        **{f"gap_s_p{q}": percentile(gaps, q) for q in PCTS},
        **_stats("e2e_s", [s["e2e_s"] for s in done]),
        **token_check(done),
    }
    # vLLM `bench serve`'s output tok/s: the server's usage tokens over the window (special tokens count there)
    server_out = m["server_output_tokens"]
    m["server_output_tok_s"] = server_out / window if server_out is not None and window > 0 else None
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in m.items()}


def token_check(done: list[dict]) -> dict:
    """The client's token count against the server's usage, where the server reports it."""
    pairs = [(s["output_tokens"], s["server_output_tokens"]) for s in done
             if s.get("server_output_tokens") is not None and s.get("output_tokens") is not None]
    if not pairs:
        return {"server_output_tokens": None, "token_count_ratio": None, "token_count_mismatches": None}
    server = sum(b for _, b in pairs)
    return {"server_output_tokens": server, "token_count_ratio": sum(a for a, _ in pairs) / server if server else None,
            "token_count_mismatches": sum(1 for a, b in pairs if a != b)}


def lengths_forced(done: list[dict], accepts: dict) -> str:
    """'forced', or why not: the server refused the fields, or accepted them and still stopped short."""
    if not (accepts.get("ignore_eos") or accepts.get("min_tokens")):
        return "not forced: the server refused ignore_eos and min_tokens"
    short = [s for s in done if (s.get("server_output_tokens") if s.get("server_output_tokens") is not None
                                 else s.get("output_tokens") or 0) < s["max_tokens"]]
    if short:
        took = " and ".join(k for k in ("ignore_eos", "min_tokens") if accepts.get(k))
        return f"not forced: {len(short)} of {len(done)} answers ended before max_tokens though the server " \
               f"accepted {took}"
    return "forced"


def meets_slo(load_metrics: dict, slo: SLO) -> bool:
    """A load point meets the SLO when `slo.attainment` of its requests met every bound."""
    a = load_metrics.get("slo_attainment")
    return a is not None and a >= slo.attainment


def spec_by_category(done: list[dict]) -> dict | None:
    """Acceptance per workload category from each answer's own speculative stats (vLLM's per-request summary,
    `metrics.speculative_decoding`; the lab's server sends it while it drafts), with vLLM's definitions:
    acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafting rounds.
    None when no answer carried the stats; 'all' pools every category."""
    carried = [s for s in done if s.get("spec")]
    if not carried:
        return None
    groups: dict[str, list[dict]] = {}
    for s in carried:
        groups.setdefault(s.get("category") or "fixed-length", []).append(s["spec"])
    if len(groups) > 1:
        groups["all"] = [s["spec"] for s in carried]
    out = {}
    for cat, xs in groups.items():
        rounds = sum(x.get("num_spec_steps", 0) for x in xs)
        drafted = sum(x.get("num_draft_tokens", 0) for x in xs)
        accepted = sum(x.get("num_accepted_draft_tokens", 0) for x in xs)
        out[cat] = {"requests": len(xs), "rounds": rounds, "drafted": drafted, "accepted": accepted,
                    "acceptance_rate": acceptance_rate(accepted, drafted),
                    "mean_acceptance_length": mean_acceptance_length(accepted, rounds),
                    "policies": sorted({x.get("policy") for x in xs if x.get("policy")})}
    return out
