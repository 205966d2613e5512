"""The run record's metric fields: one declaration of each name, its unit and its definition.

In the spirit of llama-bench's `test` record: the record owns its field list, and everything that
prints or validates a record (tables, CSV/JSON, reports, pages, imports) reads this declaration
rather than repeating string keys. Definitions follow vLLM's where one exists (shared/reference).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    """One metric: `name` is its key in RunRecord.metrics (or in a sub-object such as metrics.spec)."""

    name: str
    unit: str
    definition: str
    kind: str = "number"  # number | count | object | list | text


def _f(name, unit, definition, kind="number") -> Field:
    return Field(name, unit, definition, kind)


# metrics.<name>
METRICS: tuple[Field, ...] = (
    _f("ttft_s", "s", "wall time from the start of prefill to the first new token being chosen"),
    _f("prefill_s", "s", "wall time of the prefill pass (all sequences of the batch)"),
    _f("prefill_tok_s", "tokens/s", "prompt tokens (all sequences) over prefill time"),
    _f("prompt_tokens", "tokens", "prompt tokens, summed over the batch", "count"),
    _f("new_tokens", "tokens", "tokens generated, summed over the batch", "count"),
    _f("decode_s", "s", "wall time of the decode steps after the first token"),
    _f("decode_tok_s", "tokens/s", "tokens after the first (all sequences) over decode time: the batch's aggregate "
       "throughput"),
    _f("tokens_per_step", "tokens", "tokens emitted per decode step, all sequences together (batch size times "
       "speculative tokens per pass)"),
    _f("token_latency_ms_median", "ms", "median over decode steps of step time / tokens that step emitted per "
       "sequence: the per-token latency one user sees"),
    _f("token_latency_ms_p90", "ms", "90th percentile of the same per-token latency"),
    _f("token_latency_ms_p99", "ms", "99th percentile of the same per-token latency"),
    _f("token_latency_ms_mean", "ms", "peers: mean gap between consecutive tokens as they reach Python (peers do "
       "not expose their steps)"),
    _f("token_gap_ms_p90", "ms", "peers: 90th percentile of that gap"),
    _f("e2e_tok_s", "tokens/s", "peers: new tokens over the whole request, prefill included"),
    _f("total_s", "s", "wall time of the whole generation"),
    _f("weight_bytes", "bytes", "bytes held by the weights as converted (tied storage counted once)", "count"),
    _f("draft_weight_bytes", "bytes", "bytes of the draft model's weights (a second copy in memory)", "count"),
    _f("weight_breakdown", "bytes", "weight bytes by layer type (embedding, attention, mlp, norm, head)", "object"),
    _f("quantized_layers", "", "bytes of the quantized layers against the same layers in fp32 (ratio)", "object"),
    _f("kv_bytes", "bytes", "bytes of the KV caches allocated for the run (the target's, and a model draft's)", "count"),
    _f("peak_rss_bytes", "bytes", "the process's peak resident memory during the run (every loaded model "
       "included)", "count"),
    _f("run_rss_delta_bytes", "bytes", "that peak minus the resident memory when the run started", "count"),
    _f("peak_gpu_allocated_bytes", "bytes", "CUDA: torch.cuda.max_memory_allocated during the run", "count"),
    _f("load_peak_rss_bytes", "bytes", "peers: the worker process's peak resident memory, load included", "count"),
    _f("mem_bw_gbs", "GB/s", "measured memory read bandwidth of this machine (best of the probe)"),
    _f("bytes_per_token", "bytes", "bytes read per decode step (weights but the embedding table, plus the KV "
       "cache at the mean context) divided by the tokens that step emits, all sequences together"),
    _f("bw_floor_ms", "ms", "bytes_per_token / measured read bandwidth: the fastest a token can be on this machine"),
    _f("bw_efficiency", "", "achieved share of the bandwidth limit: bw_floor_ms * tokens_per_step / median step "
       "time (1.0 = at the limit; never above 1 within measurement noise)"),
    _f("load_s", "s", "time to load and convert the model"),
    _f("spec", "", "speculative decoding statistics (see SPEC)", "object"),
    _f("quality", "", "quality against the fp32 model (see QUALITY)", "object"),
    _f("baseline", "", "the same target without speculation, measured in the same run", "object"),
    _f("reps_decode_tok_s", "tokens/s", "peers: decode tokens/s of each repetition", "list"),
    _f("reps_ttft_s", "s", "peers: TTFT of each repetition", "list"),
)

# metrics.spec.<name>; vLLM's definitions (vllm/v1/spec_decode/metrics.py)
SPEC: tuple[Field, ...] = (
    _f("draft_kind", "", "model, self or ngram", "text"),
    _f("gamma", "tokens", "the largest number of draft tokens per round", "count"),
    _f("rounds", "", "draft rounds, summed over sequences (vLLM's num_drafts)", "count"),
    _f("drafted", "tokens", "draft tokens proposed (vLLM's num_draft_tokens)", "count"),
    _f("accepted", "tokens", "draft tokens accepted (vLLM's num_accepted_tokens)", "count"),
    _f("emitted", "tokens", "tokens emitted by verification passes, bonus and resampled tokens included", "count"),
    _f("acceptance_rate", "", "accepted / drafted"),
    _f("mean_acceptance_length", "tokens", "1 + accepted / rounds: tokens per target pass, the bonus token counted"),
    _f("expected_length", "tokens", "(1 - a^(g+1)) / (1 - a) for a = acceptance_rate, g = mean_gamma: what i.i.d. "
       "acceptance predicts for mean_acceptance_length"),
    _f("mean_gamma", "tokens", "mean draft tokens per round (adaptive gamma varies it)"),
    _f("position_rate", "", "share of rounds in which draft position i was accepted, of those that proposed it",
       "list"),
    _f("position_drafted", "", "rounds that proposed draft position i", "list"),
    _f("position_accepted", "", "rounds that accepted draft position i", "list"),
    _f("draft_s", "s", "wall time spent drafting"),
    _f("verify_s", "s", "wall time spent in target verification passes"),
    _f("baseline_tok_s", "tokens/s", "decode tokens/s of the same target without speculation, in the same run"),
    _f("speedup", "", "decode_tok_s / baseline_tok_s"),
)

# metrics.quality.<name>
QUALITY: tuple[Field, ...] = (
    _f("tokens", "tokens", "positions scored", "count"),
    _f("perplexity", "", "exp(mean negative log-likelihood) of the configuration on the eval text"),
    _f("ref_perplexity", "", "the same for the fp32 reference"),
    _f("kl_mean", "nats/token", "mean over positions of KL(fp32 || configuration)"),
    _f("kl_p99", "nats/token", "99th percentile of that KL"),
    _f("kl_max", "nats/token", "largest KL at any position"),
    _f("top1_agreement", "", "share of positions where both models' most likely token agree (llama.cpp's "
       "'same top p')"),
    _f("eval_text", "", "the text scored", "text"),
)

BY_NAME = {f.name: f for f in METRICS}
SPEC_BY_NAME = {f.name: f for f in SPEC}
QUALITY_BY_NAME = {f.name: f for f in QUALITY}


def lookup(path: str) -> Field:
    """The field at 'ttft_s', 'spec.acceptance_rate' or 'quality.kl_mean'."""
    head, _, rest = path.partition(".")
    if not rest:
        return BY_NAME[head]
    return {"spec": SPEC_BY_NAME, "quality": QUALITY_BY_NAME}[head][rest]


def get(metrics: dict, path: str):
    """The value at a dotted path in a record's metrics, or None."""
    cur = metrics
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur
