"""The server's statistics, kept apart from their sink (the Prometheus text of /metrics).

Names follow vLLM's (vllm/v1/metrics, vllm/v1/spec_decode/metrics.py), so a dashboard or a load
test that reads a vLLM server reads ours the same way:
- vllm:num_requests_running / vllm:num_requests_waiting: gauges at scrape time;
- vllm:kv_cache_usage_perc: share of the KV cache in use (0..1): blocks held (paged), else slots;
- vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total: prompt tokens looked up in the prefix
  cache at admission, and of those the tokens found cached (hit rate = hits / queries);
- vllm:num_preemptions_total: sequences preempted because the KV blocks ran out;
- vllm:prompt_tokens_total / vllm:generation_tokens_total: prompt tokens prefilled and tokens generated;
- vllm:request_success_total{finished_reason}: finished requests by reason (stop, length, abort);
- vllm:spec_decode_num_drafts_total: draft rounds (one per sequence per round);
- vllm:spec_decode_num_draft_tokens_total / vllm:spec_decode_num_accepted_tokens_total;
- vllm:spec_decode_num_accepted_tokens_per_pos_total{position}: rounds whose draft token at 0-based
  position i was accepted. Acceptance rate = accepted / draft tokens; mean acceptance length =
  1 + accepted / drafts (the bonus token counted);
- scl:spec_decode_steps_total{policy, gamma}: decode steps by the draft length the speculation policy chose
  (the lab's own: vLLM has no per-step count), 0 included;
- scl:spec_decode_asked_rounds_total{policy}: sequence rounds that asked the proposer for drafts, those where a
  lookup found none included (vLLM's num_drafts counts only rounds with drafts);
- histograms (seconds): vllm:time_to_first_token_seconds (arrival to first token),
  vllm:inter_token_latency_seconds (gaps between a request's consecutive tokens),
  vllm:e2e_request_latency_seconds (arrival to finish), vllm:request_queue_time_seconds (arrival to
  admission into a slot).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self):
        self.counts = [0] * len(self.buckets)

    def observe(self, x: float) -> None:
        self.total += x
        self.n += 1
        for i, b in enumerate(self.buckets):
            if x <= b:
                self.counts[i] += 1


@dataclass
class ServerStats:
    """Counters the engine loop updates; read under `lock` by the /metrics sink."""

    gamma: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    rejected: int = 0  # 429s
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.accepted_per_pos = [0] * self.gamma

    def request_done(self, seq, reason: str, t_arrival: float, t_admit: float | None, t_end: float) -> None:
        with self.lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1
            self.prompt_tokens += seq.n_prompt if seq is not None else 0
            if seq is None:
                return
            self.generation_tokens += len(seq.out)
            counts = seq.spec_stats
            self.num_drafts += counts.rounds
            self.num_draft_tokens += counts.drafted
            self.num_accepted_tokens += counts.accepted
            for i, a in enumerate(counts.position_accepted[:self.gamma]):
                self.accepted_per_pos[i] += a
            if seq.t_first is not None:
                self.ttft.observe(seq.t_first - t_arrival)
            for a, b in zip(seq.token_times, seq.token_times[1:]):
                self.itl.observe(b - a)
            self.e2e.observe(t_end - t_arrival)
            if t_admit is not None:
                self.queue.observe(t_admit - t_arrival)


def _hist(name: str, h: Histogram, help_: str) -> list[str]:
    out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
    for b, c in zip(h.buckets, h.counts):
        out.append(f'{name}_bucket{{le="{b}"}} {c}')
    out += [f'{name}_bucket{{le="+Inf"}} {h.n}', f"{name}_sum {h.total}", f"{name}_count {h.n}"]
    return out


def prometheus_text(stats: ServerStats, running: int, waiting: int, slots_used: int, slots: int,
                    model: str, kv: dict | None = None, spec: dict | None = None) -> str:
    """The Prometheus text exposition of the stats (the /metrics sink); kv: Scheduler.kv_facts(), spec:
    SpecPolicy.facts()."""
    lbl = f'model_name="{model}"'
    kv = kv or {}
    usage = kv["blocks_used"] / kv["num_blocks"] if kv.get("num_blocks") else (slots_used / slots if slots else 0.0)
    if kv.get("window_blocks"):  # the windowed layers' pool, when it is the fuller one
        usage = max(usage, kv["window_blocks_used"] / kv["window_blocks"])
    with stats.lock:
        lines = [
            "# HELP vllm:num_requests_running Requests in the running batch.", "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lbl}}} {running}",
            "# HELP vllm:num_requests_waiting Requests waiting for a slot.", "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lbl}}} {waiting}",
            "# HELP vllm:kv_cache_usage_perc Share of the KV cache in use.", "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lbl}}} {usage}",
            "# HELP vllm:num_preemptions Sequences preempted (KV blocks ran out).",
            "# TYPE vllm:num_preemptions counter", f"vllm:num_preemptions_total{{{lbl}}} {kv.get('preemptions', 0)}",
            "# HELP vllm:prefix_cache_queries Prompt tokens looked up in the prefix cache.",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{{{lbl}}} {kv.get('prefix_cache_queries', 0)}",
            "# HELP vllm:prefix_cache_hits Prompt tokens found in the prefix cache.",
            "# TYPE vllm:prefix_cache_hits counter",
            f"vllm:prefix_cache_hits_total{{{lbl}}} {kv.get('prefix_cache_hits', 0)}",
            "# HELP vllm:prompt_tokens_total Prompt tokens of finished requests.",
            "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{lbl}}} {stats.prompt_tokens}",
            "# HELP vllm:generation_tokens_total Generated tokens of finished requests.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lbl}}} {stats.generation_tokens}",
            "# HELP vllm:request_success_total Finished requests by reason.",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason, n in sorted(stats.finished.items()):
            lines.append(f'vllm:request_success_total{{{lbl},finished_reason="{reason}"}} {n}')
        lines += ["# HELP scl:requests_rejected_total Requests answered 429 (every slot busy, queue full).",
                  "# TYPE scl:requests_rejected_total counter",
                  f"scl:requests_rejected_total{{{lbl}}} {stats.rejected}"]
        if stats.gamma:
            lines += [
                "# HELP vllm:spec_decode_num_drafts Draft rounds.", "# TYPE vllm:spec_decode_num_drafts counter",
                f"vllm:spec_decode_num_drafts_total{{{lbl}}} {stats.num_drafts}",
                "# HELP vllm:spec_decode_num_draft_tokens Draft tokens proposed.",
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                f"vllm:spec_decode_num_draft_tokens_total{{{lbl}}} {stats.num_draft_tokens}",
                "# HELP vllm:spec_decode_num_accepted_tokens Draft tokens accepted.",
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                f"vllm:spec_decode_num_accepted_tokens_total{{{lbl}}} {stats.num_accepted_tokens}",
                "# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted draft tokens by position.",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
            ]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lbl},position="{i}"}} {a}'
                      for i, a in enumerate(stats.accepted_per_pos)]
        if spec:
            lines += ["# HELP scl:spec_decode_steps Decode steps by the draft length the policy chose.",
                      "# TYPE scl:spec_decode_steps counter"]
            lines += [f'scl:spec_decode_steps_total{{{lbl},policy="{spec["policy"]}",gamma="{g}"}} {n}'
                      for g, n in spec["steps_by_gamma"].items()]
            lines += ["# HELP scl:spec_decode_asked_rounds Sequence rounds that asked for drafts.",
                      "# TYPE scl:spec_decode_asked_rounds counter",
                      f'scl:spec_decode_asked_rounds_total{{{lbl},policy="{spec["policy"]}"}} {spec["asked_rounds"]}']
        lines += _hist("vllm:time_to_first_token_seconds", stats.ttft, "Arrival to first token.")
        lines += _hist("vllm:inter_token_latency_seconds", stats.itl, "Gaps between a request's tokens.")
        lines += _hist("vllm:e2e_request_latency_seconds", stats.e2e, "Arrival to finish.")
        lines += _hist("vllm:request_queue_time_seconds", stats.queue, "Arrival to admission into a slot.")
    return "\n".join(lines) + "\n"
