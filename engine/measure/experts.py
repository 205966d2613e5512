"""Experts touched per step on an MoE target: what engine.infer.moe counted, beside the planner's formula.

The planner prices an MoE decode step by the experts its tokens touch, E (1 - (1 - k/E)^T) for T rows
routed uniformly and independently (engine.planner.counts.expected_experts_touched). A measured run
records the count itself, by step kind, with that expectation over the same passes beside it: a
verification pass of gamma + 1 rows reads more experts than a decode pass of one, which is why
speculation pays less on an MoE target than on a dense one of the same active size.
"""
from __future__ import annotations

from engine.common.fields import M
from engine.planner.counts import expected_experts_touched


def touches_metrics(touches) -> dict:
    """The record's experts_touched fields from an engine.infer.moe.ExpertTouches ({} when nothing was counted:
    a dense target, or no labelled pass)."""
    if not touches.experts or not touches.by_kind:
        return {}
    e, k = touches.experts, touches.per_token
    kinds = {}
    for kind, by_rows in touches.by_kind.items():
        n = touches.layer_passes(kind)
        expected = sum(cnt * expected_experts_touched(e, k, rows) for rows, (cnt, _) in by_rows.items()) / n
        kinds[kind] = {"layer_passes": n, "mean": touches.mean(kind), "expected": expected,
                       "by_rows": {str(rows): [cnt, total] for rows, (cnt, total) in sorted(by_rows.items())}}
    return {M.experts_touched: {"experts": e, "experts_per_token": k, "by_kind": kinds},
            M.experts_touched_decode: touches.mean("decode"), M.experts_touched_verify: touches.mean("verify")}
