"""The fused forward pass: one C++ call per model step (kernels/cpu/fused_cpu.cpp).

``fused_forward_rows(model, tokens, rows, cache, logits_at)`` is what ``Transformer.forward_rows``
tries first. It returns the fp32 logits, or ``None`` when the fused path does not apply; the model
then runs its PyTorch path, which stays the reference. It applies on CPU, with the extension built,
``KernelConfig.fused`` (``SCL_FUSED=0`` turns it off), an fp32 KV cache (slots or paged, read through its
block table), a bf16 one, or a paged int8 one (quantized and dequantized in the step), and a model whose
projections are our int4/int8 linears in the tiled CPU layout (q/k/v and gate/up fused, as the
default conversion makes them, or separate), head_dim 64, 96, 128 or 256. The head may be our quantized linear
(computed in the same call) or a float nn.Linear (run here on the normed rows; fp32, or a DenseLinear holding a
checkpoint's head in bf16/fp16 as stored).

A bf16 model (bf16 embeddings and linears, ``quantize_model`` at bf16) runs the same step on its own bf16 weights
(kernels/cpu/fused_bf16.h): each linear's input rounded once to bf16, fp32 products and sums, and everything
between the linears (norms, RoPE, attention, residual) in fp32 over a bf16 KV cache, as llama.cpp's BF16
computes. Its PyTorch path rounds after every op, so the two differ by bf16's rounding (tests/test_fused_bf16.py
bounds it), and the record's ``kernels`` says which ran.

The dense families run in the C++ step (``FUSED_FEATURES``, names from ``ModelConfig.features()``):
sliding windows per layer (attention reads only the window's keys), q/k norms, a rotary setting per
layer (scaled, partial), Gemma's (1 + w) norms (folded into fp32 copies here), sandwich norms,
GELU-tanh, attention scale and soft-cap, and biases. The embedding scale and the final soft-cap are
applied here, around the call, as the model applies them. Length-dependent RoPE (dynamic, longrope)
and mixture-of-experts MLPs run the PyTorch path, the reason counted.

Any number of rows: a step of more than 64 rows (a long prefill chunk) is split into calls of 64,
a sequence's later rows attending to the K/V its earlier rows wrote. Whether the fused path runs
is decided per model and per setting, never by the step's size: a row's numbers are then the same
in every step composition (the kernels are row-independent), which the server's "a request's
tokens do not depend on its neighbours" rests on. Falling back to PyTorch for large steps would
break that (the two paths agree to ~1e-6, and with int8 activations the rounding of one element
can move a logit by 0.1).

The model is read by duck typing (``model.model.layers[i].self_attn.qkv_proj.prepared`` ...): ops
imports neither infer nor quant. The C++ plan (pointers into the prepared weights, the RoPE
frequencies, every workspace) is built once per model and kept in a weak dictionary.

Which path ran is counted, per run: a run opens ``count_steps()`` around itself, and inside it
``fused_info()`` (carried by ``backend_info()`` into record.kernels) reports that run's passes only.
Outside any run it reports the whole process's. The open counters live in a context variable, so
runs in two threads (two dashboard sessions) never count each other's steps.
"""
from __future__ import annotations

import threading
import weakref
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch

from engine.ops import build as _build
from engine.ops import config as _config
from engine.ops.dense import HALF_WEIGHTS, DenseLinear
from engine.ops.prepared import PreparedInt4, PreparedInt8
from engine.ops.rope import rope_inv_freq

__all__ = ["fused_forward_rows", "fused_info", "fused_profile", "reset_fused_stats", "count_steps", "StepCounts",
           "FUSED_MAX_ROWS", "rope_inv_freq", "split_rows"]

FUSED_MAX_ROWS = 64  # rows per C++ call (FUSED_MAX_ROWS in kernels/cpu/fused_kernels.h); more are split
# ModelConfig.features() the C++ step computes, each checked against the PyTorch path by
# tests/test_fused_families.py; a model using any other runs the PyTorch path (reason counted)
FUSED_FEATURES: frozenset[str] = frozenset({
    "sliding_window", "qk_norm", "rope_per_layer", "rope_attention_factor", "partial_rotary", "gemma_norms",
    "gelu_tanh", "embed_scale", "attn_scale", "attn_softcap", "final_softcap", "o_bias", "mlp_bias"})
FUSED_HEAD_DIMS = (64, 96, 128, 256)  # the attention kernel's instantiations (fused_simd_body.h)
_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # make_fused_plan's act codes

_NO_TABLE = torch.empty(0, dtype=torch.int32)
_NO_SCALE = torch.empty(0, dtype=torch.float16)
_lock = threading.Lock()
_plans: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


@dataclass
class StepCounts:
    """Forward passes that took each path: the fused step, or the PyTorch reference and why."""
    fused: int = 0
    reference: int = 0
    last: str = ""
    reasons: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"fused_steps": self.fused, "reference_steps": self.reference, "last_step": self.last,
                "reference_reasons": dict(self.reasons)}


_process = StepCounts()  # every pass since the process started (or reset_fused_stats)
_open: ContextVar[tuple] = ContextVar("scl_open_step_counts", default=())  # this context's runs, outermost first
_count_lock = threading.Lock()  # the server's thread and a dashboard run may step at once


@contextmanager
def count_steps() -> Iterator[StepCounts]:
    """Count the passes of the run inside the block apart from everything else in the process.
    Inside it, ``fused_info()`` / ``backend_info()`` report this run's counts (innermost block)."""
    counts = StepCounts()
    token = _open.set(_open.get() + (counts,))
    try:
        yield counts
    finally:
        _open.reset(token)


def _count(last: str, reason: str | None = None) -> None:
    with _count_lock:
        for c in (_process, *_open.get()):
            if reason is None:
                c.fused += 1
            else:
                c.reference += 1
                c.reasons[reason] += 1
            c.last = last


class _Unsupported(Exception):
    """This model cannot run the fused step (the reason is recorded)."""


def _decline(reason: str) -> None:
    _count("reference: " + reason, reason)
    return None


def fused_info() -> dict:
    """Whether the fused step is on, and how many forward passes took each path: in the run this is
    called from (inside ``count_steps()``), else in the whole process ("steps_counted" says which)."""
    cfg = _config.kernel_config()
    if not cfg.enabled:
        state = "off: kernels disabled"
    elif not cfg.fused:
        state = "off: KernelConfig.fused=False (SCL_FUSED=0)"
    elif _build._cpu_state["ext"] is None:
        state = "off: CPU extension not built" + (f" ({_build._cpu_state['reason']})"
                                                  if _build._cpu_state["tried"] else "")
    else:
        state = "on (CPU int4/int8/bf16 models)"
    runs = _open.get()
    with _count_lock:
        counts = (runs[-1] if runs else _process).as_dict()
    return {"fused": state, "cuda_graph": "on" if (cfg.enabled and cfg.cuda_graph) else "off", **counts,
            "steps_counted": "this run" if runs else "this process"}


def fused_profile(model, on: bool = True, reset: bool = True) -> dict | None:
    """The fused step's phase timers for this model ({"steps", "threads": [{category: seconds}]}),
    read before switching them on/off (and resetting them); None if the model has no fused plan."""
    hit = _plans.get(model)
    if hit is None or hit[1] is None or _build._cpu_state["ext"] is None:
        return None
    return _build._cpu_state["ext"].fused_profile(hit[1], on, reset)


def reset_fused_stats() -> None:
    """Zero the process-wide counts (a run's own counts come from ``count_steps()``)."""
    global _process
    with _count_lock:
        _process = StepCounts()


def _lin_spec(mod, what: str, optional: bool = False, bf16: bool = False):
    """(kind, w, s, bias, N, K, gs, input order) of one of our quantized linears in the tiled CPU layout (or, in a
    bf16 model, of a bf16 linear: kind 16, its own weight); the order (an act-order checkpoint's, int32 [K]) is an
    empty tensor for none."""
    perm = getattr(mod, "in_perm", None)
    perm = torch.empty(0, dtype=torch.int32) if perm is None else perm
    if bf16 and isinstance(mod, torch.nn.Linear) and mod.weight.dtype == torch.bfloat16:
        w, b = mod.weight.detach(), mod.bias
        if not w.is_contiguous() or w.shape[1] % 32:
            raise _Unsupported(f"{what} bf16 weight is not contiguous with K a multiple of 32")
        b = None if b is None else b.detach().float().contiguous()
        return (16, w, torch.empty(0), b, w.shape[0], w.shape[1], 0, perm)
    p = getattr(mod, "prepared", None)
    if isinstance(p, (PreparedInt4, PreparedInt8)) and p.layout == "cpu_tiled":
        b = getattr(mod, "bias", None)
        b = None if b is None else b.detach()
        if b is not None and (b.dtype != torch.float32 or not b.is_contiguous()):
            raise _Unsupported(f"{what} bias is not contiguous fp32")
        if isinstance(p, PreparedInt4):
            return (4, p.w, p.sm, b, p.N, p.K, p.group_size, perm)
        return (8, p.w, p.scale, b, p.N, p.K, 0, perm)
    held = isinstance(mod, DenseLinear) and mod.weight.dtype in HALF_WEIGHTS  # a checkpoint's head as stored
    float_head = isinstance(mod, torch.nn.Linear) and mod.bias is None and (mod.weight.dtype == torch.float32 or held)
    if optional and float_head:
        e = torch.empty(0)
        return (0, e, e, None, 0, 0, 0, e)
    raise _Unsupported(f"{what} is not an int4/int8 linear in the tiled CPU layout ({type(mod).__name__})")


def _norm_w(mod, what: str, bf16: bool = False) -> torch.Tensor:
    """An RMSNorm's fp32 weight as the C++ step multiplies by it: Gemma's (1 + w) folded in (the same
    fp32 sum the model computes on every call); a bf16 model's weight widened (exact)."""
    w = getattr(mod, "weight", None)
    if w is None or w.dtype not in ((torch.float32, torch.bfloat16) if bf16 else (torch.float32,)) \
            or w.device.type != "cpu":
        raise _Unsupported(f"{what} weight is not fp32 on CPU")
    w = w.detach().float()
    return (1.0 + w).contiguous() if getattr(mod, "gemma", False) else w.contiguous()


def _layer_norms(i: int, blk, bf16: bool) -> list[torch.Tensor]:
    """make_fused_plan's 6 norms of a layer: input, MLP input, attention output, MLP output, q, k
    (an empty tensor where the model has none)."""
    none = torch.empty(0)
    if getattr(blk, "sandwich", False):  # Gemma: post_attention_layernorm normalizes the attention output
        out = [_norm_w(blk.input_layernorm, f"layer {i} input norm", bf16),
               _norm_w(blk.pre_feedforward_layernorm, f"layer {i} pre-feedforward norm", bf16),
               _norm_w(blk.post_attention_layernorm, f"layer {i} post-attention norm", bf16),
               _norm_w(blk.post_feedforward_layernorm, f"layer {i} post-feedforward norm", bf16)]
    else:
        out = [_norm_w(blk.input_layernorm, f"layer {i} input norm", bf16),
               _norm_w(blk.post_attention_layernorm, f"layer {i} post-attention norm", bf16), none, none]
    a = blk.self_attn
    if getattr(a, "q_norm", None) is not None:
        return out + [_norm_w(a.q_norm, f"layer {i} q norm", bf16), _norm_w(a.k_norm, f"layer {i} k norm", bf16)]
    return out + [none, none]


def _is_bf16_model(model) -> bool:
    """A model converted to bf16 (it computes in bf16: its norms are bf16): its bf16 linears and norms go into the
    plan. A quantized model holding a checkpoint's embedding or head in bf16 computes in fp32 and is not one."""
    w = getattr(model.model.norm, "weight", None)
    return w is not None and w.dtype == torch.bfloat16


def bf16_in_step(ext, cfg) -> bool:
    """Whether a bf16 model runs the fused step: as ``fused_bf16`` says, and when unset everywhere but on a CPU with
    AMX-BF16 under an AVX-512 cap (there the PyTorch path's AMX kernel was measured; the step has no AMX kernel)."""
    if cfg.fused_bf16 is not None:
        return cfg.fused_bf16
    return not (_build.cpu_isa(ext, cfg) == 2 and ext.has_amx_bf16())


def _build_plan(model, ext):
    cfg = model.cfg
    beyond = [f for f in getattr(cfg, "features", lambda: ())() if f not in FUSED_FEATURES]
    if beyond:
        raise _Unsupported(f"{getattr(cfg, 'family', 'model')} uses {', '.join(beyond)} (not in the fused step)")
    if cfg.head_dim not in FUSED_HEAD_DIMS:
        raise _Unsupported(f"head_dim {cfg.head_dim} (the fused attention has {', '.join(map(str, FUSED_HEAD_DIMS))})")
    if getattr(cfg, "act", "silu") not in _ACTIVATIONS:
        raise _Unsupported(f"activation {cfg.act}")
    norms, lins = [], []
    e = torch.empty(0)
    absent = (0, e, e, None, 0, 0, 0, e)
    bf16 = _is_bf16_model(model)
    for i, blk in enumerate(model.model.layers):
        a, m = blk.self_attn, blk.mlp
        norms += _layer_norms(i, blk, bf16)
        # per layer: qkv (or q), k, v, o, gate_up (or gate), up, down; k, v, up absent when fused
        if getattr(a, "qkv_proj", None) is not None:
            lins += [_lin_spec(a.qkv_proj, f"layer {i} qkv_proj", bf16=bf16), absent, absent]
        else:
            lins += [_lin_spec(getattr(a, n), f"layer {i} {n}", bf16=bf16) for n in ("q_proj", "k_proj", "v_proj")]
        lins.append(_lin_spec(a.o_proj, f"layer {i} o_proj", bf16=bf16))
        if getattr(m, "gate_up_proj", None) is not None:
            lins += [_lin_spec(m.gate_up_proj, f"layer {i} gate_up_proj", bf16=bf16), absent]
        else:
            lins += [_lin_spec(m.gate_proj, f"layer {i} gate_proj", bf16=bf16),
                     _lin_spec(m.up_proj, f"layer {i} up_proj", bf16=bf16)]
        lins.append(_lin_spec(m.down_proj, f"layer {i} down_proj", bf16=bf16))
    norms.append(_norm_w(model.model.norm, "final norm", bf16))
    lins.append(_lin_spec(model.lm_head, "lm_head", optional=True, bf16=bf16))
    if cfg.intermediate_size % 64 or cfg.hidden_size % 32:
        raise _Unsupported("intermediate size not a multiple of 64 or hidden size not of 32")
    dims = [cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size]
    specs = list(dict.fromkeys(cfg.ropes))  # the distinct rotary settings (RopeSpec, ops/rope.py), one index per layer
    try:
        return ext.make_fused_plan(dims, float(cfg.rms_eps), float(cfg.attn_scale), float(cfg.attn_softcap),
                                   _ACTIVATIONS[cfg.act], [s.inv_freq().float().contiguous() for s in specs],
                                   [float(s.scale()) for s in specs], [specs.index(r) for r in cfg.ropes],
                                   [cfg.window(i) for i in range(cfg.num_layers)], norms, [t[:7] for t in lins],
                                   [t[7] for t in lins])
    except RuntimeError as e:  # a shape or layout the C++ side refuses
        raise _Unsupported(str(e).splitlines()[0][:200]) from None


def _signature(model) -> tuple:
    a = model.model.layers[0].self_attn
    return (len(model.model.layers), id(getattr(a.qkv_proj if a.qkv_proj is not None else a.q_proj, "prepared", None)),
            id(getattr(model.lm_head, "prepared", model.lm_head)), id(model.model.norm.weight))


def _plan_for(model, ext):
    """(plan, None) or (None, reason); built once per model (and again if its layers were swapped)."""
    sig = _signature(model)
    hit = _plans.get(model)
    if hit is not None and hit[0] == sig:
        return hit[1], hit[2]
    with _lock:
        try:
            plan, why = _build_plan(model, ext), None
        except _Unsupported as e:
            plan, why = None, str(e)
        _plans[model] = (sig, plan, why)
    return plan, why


def fused_forward_rows(model, tokens: torch.Tensor, rows, cache, logits_at: Optional[torch.Tensor] = None):
    """fp32 logits [len(logits_at) or N, V] from one fused C++ call, or None (run the PyTorch path)."""
    cfg = _config.kernel_config()
    if not (cfg.enabled and cfg.fused):
        return _decline("fused step off")
    n = rows.n
    if tokens.device.type == "cuda":
        return _cuda_step(model, tokens, rows, cache, logits_at, cfg)
    if tokens.device.type != "cpu":
        return _decline(f"device {tokens.device.type}")
    if n < 1:
        return _decline("no rows")
    q8 = getattr(cache, "quantized", False)  # a paged int8 cache: the step quantizes and dequantizes itself
    if (cache.k.dtype not in (torch.float32, torch.bfloat16) and not q8) or cache.k.device.type != "cpu":
        return _decline(f"KV cache dtype {str(cache.k.dtype).replace('torch.', '')}")
    ext = _build._cpu_state["ext"] or _build.load_cpu_extension()
    if ext is None:
        return _decline("CPU extension not built")
    if _is_bf16_model(model) and not bf16_in_step(ext, cfg):
        return _decline("bf16 on an AMX host: the PyTorch path's AMX kernel (SCL_FUSED_BF16=1: the fused step)"
                        if cfg.fused_bf16 is None else "bf16 model: KernelConfig.fused_bf16=False")
    plan, why = _plan_for(model, ext)
    if plan is None:
        return _decline(why)
    segs = rows.segments
    if len({s[0] for s in segs}) != len(segs):
        return _decline("two segments of one slot in a step")
    if logits_at is None:
        out_rows = list(range(n))
    else:
        if logits_at.dtype in (torch.bool,) or logits_at.dim() != 1:
            return _decline("logits_at is not a 1-D index tensor")
        out_rows = [r % n for r in logits_at.tolist()]
    x = model.model.embed_tokens(tokens)
    if x.dtype not in (torch.float32, torch.bfloat16):
        return _decline(f"compute dtype {x.dtype}")
    mc = model.cfg
    if mc.embed_scale != 1.0:  # Gemma: the scale rounded to the compute dtype, as the model applies it
        x = x * torch.tensor(mc.embed_scale, dtype=x.dtype)
    x = x.float()  # a bf16 model's embeddings widened (exact): the step computes in fp32
    isa = _build.cpu_isa(ext, cfg)
    # a paged cache (engine/infer/paged.py) hands its block table; a slot cache an empty one
    args = (cache.k, cache.v, cache.table if getattr(cache, "paged", False) else _NO_TABLE,
            cache.k_scale if q8 else _NO_SCALE, cache.v_scale if q8 else _NO_SCALE)
    opts = (isa, bool(ext.has_vnni()), cfg.act_int8, torch.get_num_threads())
    if getattr(cache, "two_pools", False):  # the windowed layers' pool (paged.py)
        opts += ([cache.wk, cache.wv, cache.wtable] + ([cache.wk_scale, cache.wv_scale] if q8 else [_NO_SCALE] * 2),)
    if n <= FUSED_MAX_ROWS:
        out = ext.fused_step(plan, x.contiguous(), [v for s in segs for v in s], *args, out_rows, *opts)
    else:
        width = plan.vocab if plan.has_head else model.cfg.hidden_size
        out = torch.empty(len(out_rows), width)
        for start, count, sub in split_rows(segs, FUSED_MAX_ROWS):
            sel = [(j, r - start) for j, r in enumerate(out_rows) if start <= r < start + count]
            part = ext.fused_step(plan, x[start:start + count].contiguous(), [v for s in sub for v in s], *args,
                                  [r for _, r in sel], *opts)
            if sel:
                out[[j for j, _ in sel]] = part
    if not plan.has_head:
        out = model.lm_head(out)
    if mc.final_softcap:  # Gemma 2, on the logits, as the model applies it
        out = torch.tanh(out / mc.final_softcap) * mc.final_softcap
    _count("fused")
    return out.float()


_graph_ok: "weakref.WeakKeyDictionary[torch.nn.Module, str | None]" = weakref.WeakKeyDictionary()


def _cuda_step(model, tokens, rows, cache, logits_at, cfg):
    """A plain decode step on CUDA from a captured graph (engine/ops/cuda_graph.py), if asked for."""
    if not cfg.cuda_graph:
        return _decline("CUDA: graphs off (KernelConfig.cuda_graph / SCL_CUDA_GRAPH=1)")
    if any(s[2] != 1 for s in rows.segments):
        return _decline("CUDA: not a plain decode step (a graph holds one row per sequence)")
    from engine.ops import cuda_graph

    if model not in _graph_ok:
        _graph_ok[model] = cuda_graph.graph_supported(model)
    if _graph_ok[model] is not None:
        return _decline("CUDA: " + _graph_ok[model])
    why = cuda_graph.cache_supported(model, cache)
    if why is not None:
        return _decline("CUDA: " + why)
    out = cuda_graph.graphed_forward(model, tokens, rows, cache, logits_at)
    _count("cuda graph")
    return out


def split_rows(segs, limit: int):
    """A step's segments (slot, first row, rows, first position) as calls of at most `limit` rows:
    [(first row, rows, segments with call-local first rows)]. A sequence cut between two calls
    continues at the next position in the next call."""
    calls, cur, used, start = [], [], 0, 0
    for slot, _, cnt, p0 in segs:
        off = 0
        while off < cnt:
            take = min(cnt - off, limit - used)
            cur.append((slot, used, take, p0 + off))
            used += take
            off += take
            if used == limit:
                calls.append((start, used, cur))
                start, cur, used = start + used, [], 0
    if cur:
        calls.append((start, used, cur))
    return calls
