"""The roofline of one replica: a model on `tp` GPUs at one precision, maybe speculating.

Times per GPU of a tensor-parallel group of `tp` GPUs:
  gpu work    = max(W/(e_w*BW) + K/(e_kv*BW), F/(e_c*PEAK)) + 2*layers*allreduce(tp)
                W weight bytes read (all but the embedding table), K KV bytes read, F FLOPs
  decode step = gpu work + launches + fixed + per_seq*batch      (eager stacks: max(gpu work, launches))
  prefill     = max(F_prefill/(e_c*PEAK), W/(e_w*BW)) + allreduces + launches + fixed + per-prefill cost
  allreduce   = latency(link) + 2*(tp-1)/tp * bytes / (f_link * interconnect)        (ring)
  speculation = verify(g+1 tokens per sequence) + g * draft step        (the same forward pass)
launches = layers * per-layer cost. e_w, the all-reduce latency per link, the per-sequence and
per-prefill costs are fitted to published points (planner.fit); each says where it comes from.
and the per-GPU memory budget (weights, reserve, KV). Efficiencies e_* come from efficiency.py
or the lab's calibration.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from engine.common.vocab import BNB_PRECISIONS
from engine.planner import counts, shapes
from engine.planner.calibration import Calibration
from engine.planner.efficiency import (FAMILIES, TERM_DEFAULTS, Efficiency, FitTable, KernelFamily, compute_dtype,
                                      shipped_fit)
from engine.planner.errors import PlanError
from engine.planner.gpus import GPU
from engine.planner.shapes import ModelShape
from engine.planner.speculation import SpecConfig
from engine.planner.why import Why, ms

GIB = 2 ** 30
# Tensor-parallel all-reduce. NVLink/PCIe datasheet figures are bidirectional per GPU; NCCL ring
# all-reduce bus bandwidth reaches ~40% of that (e.g. ~360 GB/s of H100's 900 GB/s: assumption).
# Its small-message latency per link is a fitted term (efficiency.TERM_DEFAULTS holds the defaults).
ALLREDUCE_BW_FRACTION = 0.40
DEFAULT_MEM_UTIL = {"gpu": 0.90, "cpu": 0.75}   # vLLM's gpu_memory_utilization default is 0.90
DEFAULT_MAX_BATCH = 256                          # vLLM's default max_num_seqs
PREFILL_CHUNK_TOKENS = 8192                      # activation memory reserved for one prefill chunk
MEASURED_LINE = "measured under load"            # Efficiency.source of a step taken from a load-record line
# No published decode point is compute-bound (the largest, 256 users of an 8B, still reads more than it
# computes), so a compute-bound step's e_c is the family's default at every batch: said where it is shown.
EC_WORDS = "; e_c is the family default (extrapolated: no published decode step is compute-bound)"


@dataclass(frozen=True)
class Deployment:
    """One model replica: a model on `tp` GPUs of one kind, at one precision, maybe speculating."""

    model: ModelShape
    gpu: GPU
    precision: str
    tp: int = 1
    family: str = "serving"
    kv_dtype: str = "bf16"
    quantize_embeddings: bool = False
    quantize_head: bool = False
    group_size: int = 64
    spec: SpecConfig | None = None
    draft: ModelShape | None = None
    mem_util: float | None = None
    reserve_gib: float | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    # Both efficiencies times this (capped at 1): the planner's fitted error as a band (planner.savings).
    efficiency_scale: float = 1.0
    calibration: Calibration | None = field(default=None, compare=False, hash=False, repr=False)
    # Bandwidth efficiencies fitted to published measurements (None: the shipped fit,
    # data/efficiency_fit.csv); planner.fit passes its own tables to fit and to leave one out.
    fit: FitTable | None = field(default=None, compare=False, hash=False, repr=False)
    # Per-instance memo of roofline coefficients: planning evaluates thousands of steps per plan.
    # init=False: dataclasses.replace() must start a fresh memo, never share the original's.
    _memo: dict = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)

    @property
    def label(self) -> str:
        s = f"{self.model.name} {self.precision} on {self.tp}x {self.gpu.name}"
        if self.spec:
            s += f" + spec ({self.spec.draft_kind}{' ' + self.draft.name if self.draft else ''}, g={self.spec.gamma})"
        return s

    def family_obj(self) -> KernelFamily:
        if self.gpu.kind == "cpu":
            return FAMILIES["cpu"]
        if self.family not in FAMILIES:
            raise PlanError("family", f"unknown kernel family '{self.family}'; known: {', '.join(FAMILIES)}")
        return FAMILIES[self.family]

    def efficiency(self, precision: str | None = None) -> tuple[Efficiency, str]:
        """Efficiency for `precision` (default: the deployment's), and where it comes from."""
        eff, src = self._efficiency(precision)
        k = self.efficiency_scale
        if k == 1.0:
            return eff, src
        # A fraction of a datasheet peak cannot pass 1; a measured line's can, against this machine's
        # placeholder peaks (only fraction * peak means something there).
        cap = math.inf if eff.source == MEASURED_LINE else 1.0
        return (Efficiency(min(cap, eff.mem_bw * k), min(cap, eff.compute * k), eff.source),
                f"{src}, x {k:.2f} (the band's edge)")

    def fit_table(self) -> FitTable:
        return self.fit if self.fit is not None else shipped_fit()

    def term(self, kind: str, key: str | None = None) -> tuple[float, str]:
        """A fitted step term (efficiency.TERM_DEFAULTS) for this replica: keyed by its link or family.
        The lab's CPU has its own calibration: no published term applies to it."""
        key = key or (link_kind(self.gpu) if kind == "allreduce_us" else self.family_obj().name)
        if self.gpu.kind == "cpu":
            return 0.0, "not modelled on this machine (its calibration holds its costs)"
        return self.fit_table().term(kind, key)

    def layer_overhead_ms(self) -> float:
        """Per-layer cost per forward pass: the family's, plus the part fitted to published points."""
        fam = self.family_obj()
        return fam.per_layer_overhead_ms if self.gpu.kind == "cpu" else self.fit_table().layer_overhead_ms(fam)

    def _lab_device(self) -> str | None:
        """'cpu' or 'cuda' where the lab's calibration applies (this machine, or the lab's own CUDA
        kernels); None for other stacks, whose kernels the lab did not measure."""
        if self.calibration is None:
            return None
        if self.gpu.kind == "cpu":
            return "cpu"
        return "cuda" if self.family == "lab-cuda" else None

    def measured_line(self, precision: str | None = None):
        """The calibration's decode step against batch for this device and precision (a BatchFit
        whose line says something), or None: the step is then that line, not the roofline's max."""
        dev = self._lab_device()
        p = shapes.kernel_precision(precision or self.precision)
        return self.calibration.decode_line_for(dev, p) if dev else None

    def prefill_tflops(self) -> tuple[float, str] | None:
        """(TFLOP/s, source) of prefill as the lab measured it on this device, scaled like the band."""
        dev = self._lab_device()
        got = self.calibration.prefill_for(dev, shapes.kernel_precision(self.precision)) if dev else None
        return (got[0] * self.efficiency_scale, got[1]) if got else None

    def _efficiency(self, precision: str | None = None) -> tuple[Efficiency, str]:
        p = shapes.kernel_precision(precision or self.precision)
        fam = self.family_obj()
        dev = "cpu" if self.gpu.kind == "cpu" else "cuda"
        bf = self.measured_line(p)
        if bf is not None:
            # The step measured under load, t(B) = weights + B * per sequence, as fractions of this
            # device's peaks: the weights term for the measured model's bytes, the per-sequence term
            # for its FLOPs per token (another model on this device scales by its bytes and FLOPs).
            weights_s, per_seq_s = bf.line
            measured = shapes.get_model(bf.model)
            cdt = compute_dtype(self.gpu, p)[0]
            peak = (self.gpu.peak_tflops(cdt) if cdt else None) or 1e-9
            wb = _fixed_weight_bytes(measured, p, self)
            return (Efficiency(wb / weights_s / (self.gpu.mem_bw_tbs * 1e12),
                               bf.flops_per_token / per_seq_s / (peak * 1e12), MEASURED_LINE),
                    f"decode step measured under load on {dev}: {bf.intercept_s * 1e3:.1f} ms + "
                    f"{per_seq_s * 1e3:.2f} ms per sequence ({len(bf.points)} "
                    f"load point(s) of {bf.model}); weights and compute add up on this device")
        fit = None
        if self.calibration is not None and (dev == "cpu" or self.family == "lab-cuda"):
            fit = self.calibration.fit_for(dev, p)
        if dev == "cpu":
            base, base_src = fam.efficiency[p], f"{fam.name} default"
        else:
            base, base_src = self.fit_table().lookup(self.gpu.generation, fam.name, p, fam.efficiency[p])
        comp, comp_src = base.compute, ""
        if self.calibration is not None and (dev == "cpu" or self.family == "lab-cuda"):
            achieved, words = self.calibration.compute_for(dev, p) or (None, "")
            cdt = compute_dtype(self.gpu, p)[0]
            peak = self.gpu.peak_tflops(cdt) if cdt else None
            if achieved and peak:
                # For this machine the peak is a placeholder: only achieved = fraction * peak matters.
                comp, comp_src = achieved / peak, f"; {words}"
        if fit is not None:
            return (Efficiency(fit.mem_bw_frac, comp, "calibrated"),
                    f"calibrated from {fit.n} lab run(s) on {dev} (fit rmse {fit.rmse_rel:.0%}){comp_src}")
        if comp_src:
            return Efficiency(base.mem_bw, comp, "calibrated prefill"), f"{base_src}{comp_src}"
        if p in BNB_PRECISIONS and fam.name == "serving":
            return base, f"{base_src} (bitsandbytes kernels)"
        return base, base_src


@dataclass(frozen=True)
class Step:
    """Cost of one forward pass of a replica, per GPU, with the roofline terms."""

    tokens: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    t_weights: float
    t_kv: float
    t_compute: float
    t_comm: float
    t_overhead: float            # fixed per step, per sequence, per prefill: never overlapped
    # True where the step is a line measured under load (Deployment.measured_line): on that device
    # streaming the weights and computing do not overlap, so their times add instead of max().
    additive: bool = False
    t_launch: float = 0.0        # per-layer launches
    overlap: bool = False        # launches overlap the GPU's work (eager stacks): max, not sum

    @property
    def t_memory(self) -> float:
        return self.t_weights + self.t_kv

    @property
    def t_gpu(self) -> float:
        core = self.t_memory + self.t_compute if self.additive else max(self.t_memory, self.t_compute)
        return core + self.t_comm

    @property
    def total(self) -> float:
        g = self.t_gpu
        return (max(g, self.t_launch) if self.overlap else g + self.t_launch) + self.t_overhead

    @property
    def bound(self) -> str:
        return "compute" if self.t_compute > self.t_memory else "memory"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(t_memory=self.t_memory, total=self.total, bound=self.bound)
        return d

    def decode_why(self, dep: "Deployment", eff: Efficiency) -> list[Why]:
        """The decode step's roofline terms, at the efficiencies `eff` it was computed with."""
        g, m = dep.gpu, dep.model
        cdt, _ = compute_dtype(g, dep.precision)
        ec = EC_WORDS if self.bound == "compute" and eff.source not in ("calibrated", MEASURED_LINE) else ""
        return [
            Why("decode step: weights",
                f"{self.weight_bytes / 1e9:.2f} GB / ({eff.mem_bw:.2f} * {g.mem_bw_tbs:g} TB/s)", ms(self.t_weights),
                "ms"),
            Why("decode step: KV read",
                f"{self.kv_bytes / 1e9:.2f} GB / ({dep.family_obj().kv_mem_bw:.2f} * bandwidth)", ms(self.t_kv), "ms"),
            Why("decode step: compute", f"{self.flops / 1e12:.2f} TFLOP / ({eff.compute:.2f} * {g.peak_tflops(cdt):g} "
                f"TFLOPS){ec}",
                ms(self.t_compute), "ms"),
            Why("decode step: all-reduce",
                f"2 * {m.layers} layers * ring all-reduce over {g.interconnect or 'n/a'} (TP {dep.tp})"
                + (f"; {dep.term('allreduce_us')[1]}" if dep.tp > 1 else ""), ms(self.t_comm), "ms"),
            Why("decode step: launches", f"{dep.family_obj().name}: {m.layers} layers * per-layer cost"
                + (" (overlaps the GPU's work: the larger counts)" if self.overlap else ""), ms(self.t_launch), "ms"),
            Why("decode step: overhead", f"{dep.family_obj().name}: fixed per step + {dep.term('per_seq_us')[1]} "
                "* sequences", ms(self.t_overhead), "ms"),
            Why("decode step", ("max(max(memory, compute) + all-reduce, launches)" if self.overlap else
                                "max(memory, compute) + all-reduce + launches") + f" + overhead = {self.bound}-bound",
                ms(self.total), "ms")]

    def prefill_why(self, dep: "Deployment", eff: Efficiency, tokens: int) -> Why:
        """A prefill of `tokens` tokens as one term."""
        g = dep.gpu
        cdt, _ = compute_dtype(g, dep.precision)
        return Why("prefill time", f"max({self.flops / 1e12:.2f} TFLOP / ({eff.compute:.2f} * {g.peak_tflops(cdt):g} "
                   f"TFLOPS), weights / bandwidth) + all-reduces + overhead, {tokens} tokens ({self.bound}-bound)",
                   ms(self.total), "ms")


def link_kind(gpu: GPU) -> str:
    """The all-reduce link a fitted latency is keyed by: nvlink, xgmi (AMD Infinity Fabric) or pcie."""
    if gpu.nvlink:
        return "nvlink"
    ic = gpu.interconnect.lower()
    return "xgmi" if "xgmi" in ic or "infinity fabric" in ic else "pcie"


def allreduce_time(nbytes: float, tp: int, gpu: GPU, latency_us: float | None = None) -> float:
    """Ring all-reduce: latency + 2*(tp-1)/tp * bytes / (ALLREDUCE_BW_FRACTION * interconnect);
    latency_us None: the link's default (efficiency.TERM_DEFAULTS)."""
    if tp <= 1:
        return 0.0
    if latency_us is None:
        latency_us = TERM_DEFAULTS["allreduce_us"][link_kind(gpu)]
    bw = max(gpu.interconnect_gbs, 1e-3) * 1e9 * ALLREDUCE_BW_FRACTION
    return latency_us * 1e-6 + 2.0 * (tp - 1) / tp * nbytes / bw


def kv_shard(model: ModelShape, tp: int) -> float:
    """Fraction of a token's KV one GPU holds: KV heads are split over tp, replicated past kv_heads.
    MLA's latent is one vector for all heads: every GPU holds all of it (as vLLM does under TP)."""
    if model.is_mla:
        return 1.0
    return math.ceil(model.kv_heads / tp) / model.kv_heads


@dataclass(frozen=True)
class _Coef:
    """Per-GPU roofline coefficients of one (model, precision) in a deployment."""

    w_fixed: float        # bytes read every step whatever the batch (dense blocks, head, norms)
    w_experts: float      # MoE expert bytes (the touched share is read, depending on tokens)
    experts: int          # routed experts per MoE layer (0 for dense)
    active: int           # experts each token is routed to
    row: float            # embedding row bytes per token
    kv_tok: float         # KV bytes per cached token in the global layers
    kv_local: float       # KV bytes per cached token in the sliding-window layers (they hold <= window)
    window: int           # sliding window (0: none)
    f_lin: float          # FLOPs per token for the matmuls (incl. head)
    f_attn: float         # FLOPs per token per cached token, global layers
    f_attn_local: float   # FLOPs per token per cached token, sliding-window layers (<= window of them)
    inv_bw_w: float       # s/byte for weights
    inv_bw_kv: float      # s/byte for KV
    inv_flops: float      # s/FLOP
    comm_lat: float       # s per step of all-reduce latency (2 per layer)
    comm_tok: float       # s per token of all-reduce transfer
    overhead: float       # s per forward pass, fixed
    per_seq: float        # s per sequence per forward pass
    launch: float         # s per forward pass of per-layer launches
    overlap: bool         # launches overlap the GPU's work (max), else they add
    additive: bool        # memory and compute times add (a step measured under load), else max()


def _fixed_weight_bytes(model: ModelShape, precision: str, dep: Deployment) -> float:
    """Bytes a decode step reads whatever its batch: dense blocks, the head (all of the embedding
    table when tied), norms; not MoE experts, nor an untied embedding table (only its tokens' rows)."""
    wb = counts.weight_bytes_breakdown(model, precision, dep.quantize_embeddings, dep.quantize_head, dep.group_size)
    head = wb.embedding if wb.head_shares_embedding else wb.head
    return wb.blocks - wb.experts + head + wb.small


def _coef(dep: Deployment, model: ModelShape, precision: str, layers_overhead: bool = True) -> _Coef:
    key = (model.name, precision, layers_overhead)
    c = dep._memo.get(key)
    if c is not None:
        return c
    gpu, tp = dep.gpu, dep.tp
    eff, _ = dep.efficiency(precision)
    fam = dep.family_obj()
    wb = counts.weight_bytes_breakdown(model, precision, dep.quantize_embeddings, dep.quantize_head, dep.group_size)
    cdt, _ = compute_dtype(gpu, precision)
    peak = (gpu.peak_tflops(cdt) if cdt else None) or 1e-9
    bw = gpu.mem_bw_tbs * 1e12
    kv_layer = counts.kv_layer_bytes(model, dep.kv_dtype) * kv_shard(model, tp)
    pair = counts.attention_pair_flops(model) / tp
    if tp > 1:
        link_bw = max(gpu.interconnect_gbs, 1e-3) * 1e9 * ALLREDUCE_BW_FRACTION
        lat = dep.term("allreduce_us")[0] * 1e-6
        comm_lat = 2 * model.layers * lat
        comm_tok = 2 * model.layers * 2.0 * (tp - 1) / tp * model.hidden * 2 / link_bw
    else:
        comm_lat = comm_tok = 0.0
    c = _Coef(
        w_fixed=_fixed_weight_bytes(model, precision, dep) / tp,
        w_experts=wb.experts / tp,
        experts=model.experts,
        active=model.active_experts,
        row=wb.embedding / model.vocab / tp,
        kv_tok=kv_layer * model.global_layers,
        kv_local=kv_layer * model.local_layers,
        window=model.sliding_window,
        f_lin=2.0 * counts.matmul_params_per_token(model) / tp,
        f_attn=pair * model.global_layers,
        f_attn_local=pair * model.local_layers,
        inv_bw_w=1.0 / (eff.mem_bw * bw),
        inv_bw_kv=1.0 / (fam.kv_mem_bw * bw),
        inv_flops=1.0 / (eff.compute * peak * 1e12),
        comm_lat=comm_lat,
        comm_tok=comm_tok,
        overhead=fam.step_overhead_ms / 1e3,
        per_seq=dep.term("per_seq_us")[0] * 1e-6,
        launch=(dep.layer_overhead_ms() * model.layers if layers_overhead else 0) / 1e3,
        overlap=fam.launch_overlaps,
        additive=dep.measured_line(precision) is not None,
    )
    dep._memo[key] = c
    return c


def _step_parts(c: _Coef, batch: float, context: float, tokens_per_seq: float):
    tokens = batch * tokens_per_seq
    w = c.w_fixed + c.row * tokens
    if c.w_experts:
        w += c.w_experts * counts.expected_experts_touched(c.experts, c.active, max(1.0, tokens)) / c.experts
    held = min(context, c.window) if c.window else 0.0
    kv = batch * (context * c.kv_tok + held * c.kv_local)
    flops = tokens * (c.f_lin + c.f_attn * context + c.f_attn_local * held)
    t_comm = c.comm_lat + c.comm_tok * tokens if c.comm_lat else 0.0
    return tokens, w, kv, flops, t_comm


def _step_time(c: _Coef, batch: float, context: float, tokens_per_seq: float = 1.0) -> float:
    tokens, w, kv, flops, t_comm = _step_parts(c, batch, context, tokens_per_seq)
    mem, comp = w * c.inv_bw_w + kv * c.inv_bw_kv, flops * c.inv_flops
    gpu = (mem + comp if c.additive else max(mem, comp)) + t_comm
    return (max(gpu, c.launch) if c.overlap else gpu + c.launch) + c.overhead + c.per_seq * batch


def forward_cost(dep: Deployment, model: ModelShape, precision: str, batch: float, context: float,
                 tokens_per_seq: float = 1.0, layers_overhead: bool = True) -> Step:
    """Roofline cost of one decode-style forward pass: `batch` sequences, each scoring
    `tokens_per_seq` new tokens against `context` cached tokens (verify passes use > 1).
    Weight bytes are all but the embedding table (its rows only), MoE experts as touched."""
    c = _coef(dep, model, precision, layers_overhead)
    tokens, w, kv, flops, t_comm = _step_parts(c, batch, context, tokens_per_seq)
    return Step(tokens, w, kv, flops, w * c.inv_bw_w, kv * c.inv_bw_kv, flops * c.inv_flops, t_comm,
                c.overhead + c.per_seq * batch, c.additive, c.launch, c.overlap)


def decode_step(dep: Deployment, batch: float, context: float, tokens_per_seq: float = 1.0) -> Step:
    """One plain decode step of the target model (see module docstring)."""
    return forward_cost(dep, dep.model, dep.precision, batch, context, tokens_per_seq)


def prefill_step(dep: Deployment, tokens: int, batch: int = 1) -> Step:
    """Prefill `batch` prompts of `tokens` tokens: compute-bound GEMMs, weights read once."""
    key = ("prefill", tokens, batch)
    hit = dep._memo.get(key)
    if hit is not None:
        return hit
    gpu, tp, m = dep.gpu, dep.tp, dep.model
    eff, _ = dep.efficiency()
    fam = dep.family_obj()
    wbytes = counts.weight_bytes(m, dep.precision, dep.quantize_embeddings, dep.quantize_head, dep.group_size) / tp
    kvw = batch * counts.kv_cache_bytes(m, tokens, dep.kv_dtype) * kv_shard(m, tp)
    flops = batch * counts.prefill_flops(m, tokens) / tp
    cdt, _ = compute_dtype(gpu, dep.precision)
    peak = (gpu.peak_tflops(cdt) if cdt else None) or 1e-9
    # The lab's measured prefill rate where it has one: prefill GEMMs run at another rate than the
    # batched decode step the efficiency's compute side may come from.
    measured = dep.prefill_tflops()
    rate = measured[0] * 1e12 if measured else eff.compute * peak * 1e12
    bw = gpu.mem_bw_tbs * 1e12
    t_comm = 2 * m.layers * allreduce_time(batch * tokens * m.hidden * 2, tp, gpu, dep.term("allreduce_us")[0])
    t_over = fam.step_overhead_ms / 1e3 + m.layers * dep.term("prefill_layer_us")[0] * 1e-6   # once per pass
    st = Step(batch * tokens, wbytes, kvw, flops, wbytes / (eff.mem_bw * bw), kvw / (fam.kv_mem_bw * bw),
              flops / rate, t_comm, t_over, False, dep.layer_overhead_ms() * m.layers / 1e3, fam.launch_overlaps)
    dep._memo[key] = st
    return st


@dataclass(frozen=True)
class SpecStep:
    """One speculative round for a batch: target verify + drafting, and tokens it yields."""

    verify: Step
    draft: Step | None
    draft_steps: int
    draft_time: float
    expected_tokens: float

    @property
    def total(self) -> float:
        return self.verify.total + self.draft_time

    def why(self, spec: SpecConfig, plain: Step) -> list[Why]:
        """The round's terms, and its speedup against the `plain` step at the same batch."""
        return [
            Why("speculation: tokens per round", f"E = (1 - a^(g+1)) / (1 - a), g={spec.gamma}, {spec.words()}",
                self.expected_tokens, "tokens"),
            Why("speculation: verify pass", f"target scores {spec.verify_tokens or spec.gamma + 1} tokens per sequence",
                ms(self.verify.total), "ms"),
            Why("speculation: drafting", f"{spec.gamma} x draft step ({spec.draft_kind})", ms(self.draft_time), "ms"),
            Why("speculation: speedup at this batch", "E * plain step / (verify + drafting)",
                self.expected_tokens * plain.total / self.total, "x")]


def spec_step(dep: Deployment, batch: float, context: float) -> SpecStep:
    """verify(g+1 tokens per sequence, or `verify_tokens`) + g * draft step (draft kinds: SpecConfig)."""
    sp = dep.spec
    assert sp is not None
    vt = sp.verify_tokens or sp.gamma + 1
    verify = forward_cost(dep, dep.model, dep.precision, batch, context, vt)
    draft, dtime = None, 0.0
    if sp.draft_cost_ratio is not None:
        dtime = sp.gamma * sp.draft_cost_ratio * decode_step(dep, batch, context).total
    elif sp.draft_kind in ("model", "self"):
        dm = dep.draft or dep.model
        dp = sp.draft_precision or ("int4" if sp.draft_kind == "self" else dep.precision)
        draft = forward_cost(dep, dm, dp, batch, context, 1.0)
        dtime = sp.gamma * draft.total
    return SpecStep(verify, draft, sp.gamma if draft else 0, dtime, sp.expected_tokens)


@dataclass(frozen=True)
class RooflineSteps:
    """T(batch, gamma) of engine.common.step_model from this roofline: plain decode at gamma 0, else a
    speculative round of `gamma` drafts (spec_step). The server prices the same T from measured tables."""

    dep: Deployment
    context: float
    draft_row_s: float = 0.0   # the planner charges a draft's prefill in prefill_step, not in decode rounds

    def step_s(self, batch: int, gamma: int, rows: float | None = None) -> float:
        """rows: verified rows per sequence (None: the spec's, gamma + 1 or its tree's)."""
        if gamma == 0 or self.dep.spec is None:
            return decode_step(self.dep, batch, self.context).total
        spec = replace(self.dep.spec, gamma=gamma, **({} if rows is None else {"verify_tokens": rows}))
        return spec_step(replace(self.dep, spec=spec), batch, self.context).total


def per_token_step(dep: Deployment, batch: float, context: float) -> tuple[float, float]:
    """(seconds per round, tokens per sequence per round) for plain or speculative decoding."""
    sp = dep.spec
    if sp is None:
        return _step_time(_coef(dep, dep.model, dep.precision), batch, context), 1.0
    # Same arithmetic as spec_step, without building dataclasses (this runs in the solver loops).
    verify = _step_time(_coef(dep, dep.model, dep.precision), batch, context, sp.verify_tokens or sp.gamma + 1)
    if sp.draft_cost_ratio is not None:
        draft = sp.gamma * sp.draft_cost_ratio * _step_time(_coef(dep, dep.model, dep.precision), batch, context)
    elif sp.draft_kind in ("model", "self"):
        dp = sp.draft_precision or ("int4" if sp.draft_kind == "self" else dep.precision)
        draft = sp.gamma * _step_time(_coef(dep, dep.draft or dep.model, dp), batch, context)
    else:
        draft = 0.0
    return verify + draft, sp.expected_tokens


@dataclass(frozen=True)
class Memory:
    """Per-GPU memory of a replica (bytes) and what the KV budget allows."""

    usable: float
    weights: float
    draft_weights: float
    reserve: float
    kv_per_token: float          # per GPU, target + draft, every layer holding the token
    kv_budget_tokens: float      # tokens of KV the replica can hold (at kv_per_token each)
    fits: bool
    kv_windowed: tuple = ()      # (bytes per token, window) of sliding-window layers, part of kv_per_token

    def kv_bytes(self, tokens: float) -> float:
        """Per-GPU KV bytes of one request of `tokens` tokens: a sliding-window layer keeps at most
        its window of them."""
        return self.kv_per_token * tokens - sum(b * max(0.0, tokens - w) for b, w in self.kv_windowed)

    def max_concurrency(self, tokens_per_request: int) -> int:
        if not self.kv_windowed:
            return max(0, int(self.kv_budget_tokens // max(1, tokens_per_request)))
        free = self.kv_budget_tokens * self.kv_per_token
        return max(0, int(free // self.kv_bytes(max(1, tokens_per_request))))

    def to_dict(self) -> dict:
        return asdict(self)

    def why(self, dep: "Deployment", input_tokens: int, output_tokens: int) -> list[Why]:
        """Weights, KV per token, the KV budget and the concurrency it allows."""
        g, m = dep.gpu, dep.model
        kv = ((f"{m.layers} layers * ({m.kv_lora_rank} + {m.qk_rope_head_dim}) MLA latent" if m.is_mla
               else f"2 * {m.layers} layers * {m.kv_heads} KV heads * {m.head_dim}") + f" * bytes({dep.kv_dtype})"
              + (f"; {m.local_layers} layers keep only {m.sliding_window} tokens" if m.local_layers else "")
              + " (x draft, / TP shard)")
        return [
            Why("weights per GPU", f"weight_bytes({m.name}, {dep.precision}) / TP {dep.tp}", self.weights / 1e9, "GB"),
            Why("KV per token per GPU", kv, self.kv_per_token, "B"),
            Why("KV budget", f"({g.memory_gb:g} GiB * mem_util {self.usable / (g.memory_gb * GIB):.2f} - weights - "
                f"reserve {self.reserve / GIB:.1f} GiB) / KV per token", self.kv_budget_tokens, "tokens"),
            Why("max concurrency", f"KV budget / ({input_tokens} + {output_tokens}) tokens per request, capped at "
                f"max_batch {dep.max_batch}", min(dep.max_batch, self.max_concurrency(input_tokens + output_tokens)),
                "requests")]


def activation_reserve(model: ModelShape, tp: int) -> float:
    """Bytes held outside weights and KV: 1 GiB (CUDA context, graphs, workspaces; assumption) plus
    the activations of one PREFILL_CHUNK_TOKENS chunk: tokens*(2*ffn + 4*hidden + q + 2*kv)*2 B / tp,
    ffn = intermediate, or for MoE layers active_experts * expert width + shared expert width."""
    ffn = model.intermediate if model.moe_layers < model.layers else 0
    if model.is_moe:
        ffn = max(ffn, model.active_experts * model.expert_intermediate + model.shared_expert_intermediate)
    width = 2 * ffn + 4 * model.hidden + model.q_dim + 2 * model.kv_dim
    return GIB + PREFILL_CHUNK_TOKENS * width * 2 / tp


def memory(dep: Deployment) -> Memory:
    """Weights, reserve and KV budget of one GPU of the replica."""
    g, m, tp = dep.gpu, dep.model, dep.tp
    util = dep.mem_util if dep.mem_util is not None else DEFAULT_MEM_UTIL.get(g.kind, 0.9)
    usable = g.memory_gb * GIB * util
    w = counts.weight_bytes(m, dep.precision, dep.quantize_embeddings, dep.quantize_head, dep.group_size) / tp
    kvpt = counts.kv_bytes_per_token(m, dep.kv_dtype) * kv_shard(m, tp)
    windowed = _windowed(m, dep.kv_dtype, tp)
    dw = 0.0
    if dep.spec is not None and dep.spec.draft_kind in ("model", "self") and dep.spec.draft_cost_ratio is None:
        dm = dep.draft or m
        dp = dep.spec.draft_precision or ("int4" if dep.spec.draft_kind == "self" else dep.precision)
        dw = counts.weight_bytes(dm, dp, dep.quantize_embeddings, dep.quantize_head, dep.group_size) / tp
        kvpt += counts.kv_bytes_per_token(dm, dep.kv_dtype) * kv_shard(dm, tp)
        windowed += _windowed(dm, dep.kv_dtype, tp)
    reserve = dep.reserve_gib * GIB if dep.reserve_gib is not None else activation_reserve(m, tp)
    free = usable - w - dw - reserve
    return Memory(usable, w, dw, reserve, kvpt, max(0.0, free / kvpt), free > 0, windowed)


def _windowed(m: ModelShape, kv_dtype: str, tp: int) -> tuple:
    if not m.local_layers:
        return ()
    return ((counts.kv_layer_bytes(m, kv_dtype) * m.local_layers * kv_shard(m, tp), m.sliding_window),)
