"""The candidates every planner mode weighs, GPU x precision x speculation x tensor parallelism in one order, and
why one cannot run at all. The search sizes each of them (one that cannot run ranks last, with its reason); batch
jobs, fleets and sweeps keep those that can."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from engine.planner.efficiency import compute_dtype
from engine.planner.gpus import GPU
from engine.planner.shapes import ModelShape
from engine.planner.speculation import SpecConfig

__all__ = ["Candidate", "candidates", "cannot_run", "runnable"]

NO_SPEC: tuple[tuple[SpecConfig | None, ModelShape | None], ...] = ((None, None),)


@dataclass(frozen=True)
class Candidate:
    gpu: GPU
    precision: str
    tp: int = 1
    spec: SpecConfig | None = None
    draft: ModelShape | None = None  # the draft model of a model-drafted spec


def candidates(gpus: Iterable[GPU], precisions: Sequence[str], tps: Sequence[int] = (1,),
               specs: Sequence[tuple[SpecConfig | None, ModelShape | None]] = NO_SPEC) -> list[Candidate]:
    """Every combination, GPU-major, then precision, speculation (spec, draft) and TP."""
    return [Candidate(g, p, tp, sc, dm) for g in gpus for p in precisions for sc, dm in specs for tp in tps]


def cannot_run(model: ModelShape, gpu: GPU, precision: str, tp: int = 1) -> str | None:
    """Why `model` cannot run on `tp` x `gpu` at `precision` whatever the load, or None: the GPU has no compute
    path for the precision, the TP does not divide the heads, or the node holds fewer GPUs."""
    cdt, cnote = compute_dtype(gpu, precision)
    if cdt is None:
        return cnote
    if model.heads % tp or (model.kv_heads % tp and tp % model.kv_heads):
        return f"TP {tp} does not divide {model.name}'s {model.heads} attention / {model.kv_heads} KV heads"
    if tp > gpu.max_gpus_per_node:
        return f"{gpu.name} has at most {gpu.max_gpus_per_node} GPU(s) per node for tensor parallelism"
    return None


def runnable(cands: Iterable[Candidate], model: ModelShape) -> list[Candidate]:
    """The candidates that can run `model` (cannot_run says None), in their order."""
    return [c for c in cands if cannot_run(model, c.gpu, c.precision, c.tp) is None]
