"""Serving one replica: latencies and capacity under load.

Open loop (`serving_point`): Poisson arrivals with continuous batching; the decode batch solves
Little's law, the p90s come from an M/D/1 prefill queue and a normal approximation of a request's
decode time. Closed loop (`closed_loop_point`): c users as in `vllm bench serve`. `max_rate`:
the largest rate one replica serves within both p90 SLOs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from engine.planner.roofline import Deployment, memory, per_token_step, prefill_step
from engine.planner.acceptance import tokens_per_step_variance
from engine.planner.why import Why, ms

Z90 = 1.2816            # standard normal 90th percentile


@dataclass(frozen=True)
class ServingPoint:
    """Steady state of one replica under Poisson arrivals at `rate` req/s."""

    rate: float
    stable: bool
    batch: float                 # mean sequences decoding together (Little's law)
    prefill_util: float          # share of GPU time spent in prefill
    prefill_s: float
    step_s: float                # one decode round at `batch`
    tokens_per_step: float
    ttft_mean_s: float
    ttft_p90_s: float
    tpot_mean_s: float
    tpot_p90_s: float
    limit: str = ""              # why it is unstable, if it is

    def to_dict(self) -> dict:
        return asdict(self)

    def batch_why(self, output_tokens: int) -> Why:
        return Why("decode batch", f"Little's law: B = rate {self.rate:.3g}/s * {output_tokens} tokens * TPOT",
                   self.batch, "sequences")

    def latency_why(self, speculative: bool) -> list[Why]:
        """The prefill share and the latencies it leads to (serving_point's model, in its words)."""
        return [
            Why("prefill share of GPU time", f"rho = rate * prefill = {self.rate:.3g} * {ms(self.prefill_s):.1f} ms",
                self.prefill_util, "fraction"),
            Why("TPOT mean", "round / (E * (1 - rho))", ms(self.tpot_mean_s), "ms"),
            Why("TPOT p90", "mean + 1.2816 sd of a request's decode time (prefill interruptions ~ Poisson"
                + (", rounds ~ acceptance" if speculative else "") + ") / output tokens", ms(self.tpot_p90_s), "ms"),
            Why("TTFT p90", "prefill + one decode round + M/D/1 wait p90 = (W/rho) ln(10 rho)", ms(self.ttft_p90_s),
                "ms")]


def _unstable(rate, why, prefill_s=math.inf) -> ServingPoint:
    inf = math.inf
    return ServingPoint(rate, False, inf, inf, prefill_s, inf, 1.0, inf, inf, inf, inf, why)


def serving_point(dep: Deployment, rate: float, input_tokens: int, output_tokens: int,
                  max_concurrency: float | None = None) -> ServingPoint:
    """Mean-value model of continuous batching for one replica.

    - Prefill takes T_p per request; rho = rate*T_p is the share of GPU time spent prefilling, and
      decode steps stall while it runs (additive; real engines overlap a little: conservative).
    - Decode: B sequences share each round of time s(B) and get E tokens each, so the mean
      per-token latency is TPOT = s(max(1,B))/(E*(1-rho)); Little's law B = rate*O*TPOT fixes B.
      B is solved by bisection (the right side is convex in B, so there is one crossing).
    - TTFT = queueing wait + T_p + one decode round in flight. The wait is M/D/1 with mean
      W = rho*T_p/(2(1-rho)); its tail is approximated as exponential with mean W/rho beyond the
      probability rho of waiting at all, so p90 wait = (W/rho)*ln(10*rho) for rho > 0.1, else 0.
    - p90 TPOT (per request, over its O tokens): decode time D = N*s + P*T_p, with N rounds
      (renewal variance O*Var(X)/E^3 of the tokens-per-round X) and P ~ Poisson(rate*D) prefills of
      other requests landing meanwhile; p90 = mean + 1.2816*sd (normal approximation) / O.
    """
    I, O = input_tokens, output_tokens
    ctx = I + O / 2.0
    tp_ = prefill_step(dep, I).total
    rho = rate * tp_
    if rho >= 1:
        return _unstable(rate, f"prefill alone needs {rho:.0%} of the GPU time", tp_)
    cap = float(min(dep.max_batch, max_concurrency if max_concurrency is not None else dep.max_batch))
    if cap < 1:
        return _unstable(rate, "not even one request fits in KV memory", tp_)

    # A decoding request is itself in the batch: it sees at least batch 1 (max(1, B)), which also
    # makes the light-load limit the batch-1 floor that infeasibility messages quote.
    def h(b):
        s, e = per_token_step(dep, max(1.0, b), ctx)
        return rate * O * s / (e * (1 - rho)) - b

    if h(cap) > 0:
        return _unstable(rate, f"needs more than {cap:.0f} concurrent sequences (KV memory / max batch)", tp_)
    lo, hi = 0.0, cap
    for _ in range(32):
        mid = (lo + hi) / 2
        if h(mid) > 0:
            lo = mid
        else:
            hi = mid
    b = hi
    s, e = per_token_step(dep, max(1.0, b), ctx)
    tpot = s / (e * (1 - rho))
    w_mean = rho * tp_ / (2 * (1 - rho))
    w_p90 = (w_mean / rho) * math.log(10 * rho) if rho > 0.1 else 0.0
    ttft_mean = w_mean + tp_ + s
    ttft_p90 = w_p90 + tp_ + s
    var_rounds = 0.0
    if dep.spec is not None:
        var_rounds = O * tokens_per_step_variance(dep.spec.acceptance_rate, dep.spec.gamma) / e ** 3
    d_mean = O * tpot
    var_d = s * s * var_rounds + tp_ * tp_ * rate * d_mean
    tpot_p90 = (d_mean + Z90 * math.sqrt(var_d)) / O
    return ServingPoint(rate, True, b, rho, tp_, s, e, ttft_mean, ttft_p90, tpot, tpot_p90)


def closed_loop_point(dep: Deployment, concurrency: int, input_tokens: int, output_tokens: int) -> dict:
    """Benchmark-style closed loop (`vllm bench serve --max-concurrency c`): c users, each sending
    the next request when one finishes. Per-token latency is one decode round at batch
    min(c, capacity); throughput = c*O / (c*T_p + O*s(c)) (prefills serialize with decode rounds)."""
    mem = memory(dep)
    cap = min(dep.max_batch, mem.max_concurrency(input_tokens + output_tokens))
    c = max(1, min(concurrency, cap)) if cap >= 1 else 0
    if c == 0:
        return {"concurrency": concurrency, "fits": False}
    ctx = input_tokens + output_tokens / 2.0
    s, e = per_token_step(dep, c, ctx)
    tp_ = prefill_step(dep, input_tokens).total
    thr = c * output_tokens / (c * tp_ + output_tokens * s / e)
    return {"concurrency": concurrency, "effective_batch": c, "fits": True, "itl_s": s / e, "round_s": s,
            "ttft_s": tp_ + (s if c > 1 else 0.0), "prefill_s": tp_, "output_tok_s": thr}


def max_rate(dep: Deployment, input_tokens: int, output_tokens: int, ttft_slo: float, tpot_slo: float,
             max_concurrency: int) -> tuple[float, ServingPoint | None]:
    """Largest per-replica request rate meeting both p90 SLOs (bisection; every predicted latency
    grows with the rate, so the feasible rates are an interval [0, r*])."""
    def ok(r):
        sp = serving_point(dep, r, input_tokens, output_tokens, max_concurrency)
        return sp.stable and sp.ttft_p90_s <= ttft_slo and sp.tpot_p90_s <= tpot_slo, sp

    hi = 1.0 / prefill_step(dep, input_tokens).total
    tiny = hi * 1e-6
    good, sp0 = ok(tiny)
    if not good:
        return 0.0, sp0
    lo = tiny
    for _ in range(32):
        mid = (lo + hi) / 2
        if ok(mid)[0]:
            lo = mid
        else:
            hi = mid
    return lo, ok(lo)[1]
