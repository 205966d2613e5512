"""A generation becomes a run record: latencies, throughput, bytes, bandwidth efficiency (see records.py)."""
from __future__ import annotations

import torch

from engine.common.formulas import kv_bytes_per_token
from engine.measure.machine import library_versions, machine_facts
from engine.measure.memory import PeakMemory
from engine.measure.records import RunRecord
from engine.measure.stats import percentile


def kv_bytes_per_slot(lm) -> float:
    """K and V bytes of one cache slot (one token of one sequence) in the model's compute dtype."""
    c = lm.cfg
    return kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, torch.finfo(lm.model.compute_dtype).bits / 8)


def decode_bytes_per_step(lm, cache_slots: int, batch: int) -> int:
    """Bytes one decode step reads: the weights but the embedding table (a lookup reads one row per
    token), and each sequence's KV cache at `cache_slots` slots."""
    w = sum(v for k, v in lm.weights.items() if k != "embedding")
    return int(w + kv_bytes_per_slot(lm) * cache_slots * batch)


def summarize(lm, res, mem: PeakMemory | None, bw_gbs: float) -> dict:
    """Metrics of one generation; fields.py defines each one."""
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
    m = {
        "ttft_s": res.ttft_s,
        "prefill_s": res.prefill_s,
        "prefill_tok_s": prompt_tok / res.prefill_s if res.prefill_s else None,
        "prompt_tokens": prompt_tok,
        "new_tokens": res.n_new,
        "decode_s": decode_s,
        "decode_tok_s": tokens_after_first / decode_s if decode_s else None,
        "tokens_per_step": tokens_per_step,
        "token_latency_ms_median": percentile(per_token_ms, 50),
        "token_latency_ms_p90": percentile(per_token_ms, 90),
        "token_latency_ms_p99": percentile(per_token_ms, 99),
        "total_s": res.total_s,
        "weight_bytes": lm.weight_bytes,
        "weight_breakdown": dict(lm.weights),
        "quantized_layers": dict(lm.quantized) or None,
        "kv_bytes": res.kv_bytes,
        "mem_bw_gbs": bw_gbs,
        "bytes_per_token": bytes_per_token,
        "bw_floor_ms": floor_ms,
        # The floor of the whole step over the measured step: per-token floor * tokens per step.
        "bw_efficiency": (floor_ms * tokens_per_step / med_step) if (floor_ms and med_step) else None,
        "load_s": lm.load_s,
        "spec": res.spec,
    }
    if mem is not None:
        m.update(mem.as_dict())
    return m


def make_record(kind: str, lm, res, mem, bw_gbs, config_extra: dict | None = None, draft_lm=None,
                quality: dict | None = None) -> RunRecord:
    from engine import ops as kernels
    cfg = {
        "model": lm.name,
        "precision": lm.spec.label,
        "quant": lm.spec.to_dict(),
        "device": lm.device,
        "batch_size": len(res.new_tokens),
        "max_new_tokens": None,
        "draft": None,
    }
    cfg.update(config_extra or {})
    metrics = summarize(lm, res, mem, bw_gbs)
    if draft_lm is not None:
        metrics["draft_weight_bytes"] = draft_lm.weight_bytes
    if quality:
        metrics["quality"] = quality
    return RunRecord(
        kind=kind, config=cfg, metrics=metrics, machine=machine_facts(lm.device), versions=library_versions(),
        kernels=kernels.backend_info(),
        output={"texts": res.texts, "new_tokens": res.new_tokens, "trace": res.trace, "finish": res.finish},
    )
