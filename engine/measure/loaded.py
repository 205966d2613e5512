"""What the pages ask of a loaded model: load it into the pool, describe it, score its quality.

Pages never touch the live engine; they call these with names and precisions and draw the dicts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from engine.infer.catalog import list_models
from engine.infer.loader import make_spec, resolve_device
from engine.measure.quality import ensure_reference, evaluate, fp32_for_reference


def model_facts(lm) -> dict:
    """Plain facts about a loaded model: sizes, shape, dtype, the quantized layers' share."""
    c = lm.cfg
    return {"name": lm.name, "label": lm.label, "precision": lm.spec.label, "spec": lm.spec, "device": lm.device,
            "weights": dict(lm.weights), "weight_bytes": lm.weight_bytes, "load_s": lm.load_s,
            "num_layers": c.num_layers, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "num_heads": c.num_heads, "hidden": c.hidden_size, "intermediate": c.intermediate_size,
            "vocab": c.vocab_size, "max_position": c.max_position,
            "dtype_bytes": torch.finfo(lm.model.compute_dtype).bits // 8, "dtype": str(lm.model.compute_dtype),
            "quantized": dict(getattr(lm, "quantized", None) or {})}


def facts_json(lm) -> dict:
    """model_facts as JSON (the backend's /v1/info and a load job's result): without the spec object."""
    facts = {k: v for k, v in model_facts(lm).items() if k != "spec"}
    return {**facts, "device": str(facts["device"])}


def load_into_pool(pool, model: str, precision: str, group_size: int = 64, quantize_embeddings: bool = False,
                   quantize_head: bool = True, device: str = "auto", progress=None) -> dict:
    """Load (or reuse) `model` at a precision in the pool; returns model_facts."""
    spec = make_spec(precision, group_size, quantize_embeddings, quantize_head)
    lm = pool.get(model, spec, resolve_device(device), progress=progress)
    return model_facts(lm)


def quality_in_pool(pool, facts: dict, tokens: int, progress=None, on_tokens=None) -> dict:
    """llama.cpp-style quality of the model `facts` describes against fp32 (engine.measure.quality.evaluate).

    A missing fp32 reference is computed with the pool's fp32 copy (loaded into the pool if needed).
    """
    lm = pool.get(facts["name"], facts["spec"], facts["device"])
    ref = fp32_for_reference(pool, lm, int(tokens), progress)
    return evaluate(lm, int(tokens), ref_lm=ref, progress=progress, on_tokens=on_tokens)


def reference_in_pool(pool, facts: dict, tokens: int, progress=None) -> None:
    """Make sure the fp32 reference of this model on `tokens` eval tokens is cached (the llama.cpp peer reads it)."""
    from engine.measure.eval_text import eval_docs

    lm = pool.get(facts["name"], facts["spec"], facts["device"])
    ref = fp32_for_reference(pool, lm, int(tokens), progress)
    ensure_reference(lm.name, lm.folder, eval_docs(lm.tokenizer, int(tokens)), ref or (lm if lm.spec.precision ==
                                                                                      "fp32" else None), progress)


@dataclass
class LoadItem:
    """A work item (engine.measure.runner.run_many): `setup`'s target loaded into the pool (or found there) and
    kept for later work. No measurement, so no record: its facts are the `result`. A GPTQ/AWQ calibration (minutes
    the first time) stops at its next layer when should_cancel() turns true, so it owns its progress."""
    setup: object  # engine.common.setup.EngineSetup
    result: dict | None = field(default=None, compare=False, repr=False)
    owns_progress: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return f"load {self.setup.label}"

    def measure(self, pool, store=None, progress=None, *, should_cancel=None, on_record=None):
        from engine.infer.calibrate import Cancelled
        from engine.infer.loader import target_spec

        try:
            lm = pool.get(self.setup.model, target_spec(self.setup), resolve_device(self.setup.device), progress,
                          should_stop=should_cancel or (lambda: False))
        except Cancelled:
            return []
        self.result = facts_json(lm)
        return None


__all__ = ["LoadItem", "list_models", "model_facts", "facts_json", "load_into_pool", "quality_in_pool",
           "reference_in_pool"]
