"""The engine setup a stored record was measured with, from its config of any readable schema.

Pure (no torch), so the planner reads records' setups the way the lab writes them:
- now: `config.setup` holds the EngineSetup fields (engine.measure.record_config writes it);
- schema 2 bench records: `config.run_config` holds the run's config flat, setup fields at the top;
- older and other records: `config.model`, `config.precision` (a label such as 'int4-g64'),
  `config.quant` (the loaded QuantSpec) and `config.draft` (kind, model, precision, gamma, adaptive).
"""
from __future__ import annotations

from dataclasses import fields
from typing import Mapping

from engine.common.setup import NO_DRAFT, EngineSetup

SETUP_FIELDS = tuple(f.name for f in fields(EngineSetup))


def base_precision(label) -> str:
    """'int4-g64' -> 'int4': a precision label without its group suffix."""
    return str(label or "").lower().split("-g")[0]


def _group_of(label) -> int | None:
    """'int4-g32' -> 32; None when the label has no group suffix."""
    _, _, g = str(label or "").lower().partition("-g")
    return int(g) if g.isdigit() else None


def setup_from_record(config: Mapping) -> EngineSetup:
    """The setup a record's config describes (not validated: a stored record is read as it was measured).

    A UserError names an unknown field of a nested setup; missing fields take the setup's defaults.
    """
    config = config or {}
    nested = config.get("setup")
    if isinstance(nested, Mapping):
        return EngineSetup.from_dict(dict(nested))
    flat = config.get("run_config")
    if isinstance(flat, Mapping):
        inner = flat.get("setup")
        if isinstance(inner, Mapping):
            return EngineSetup.from_dict(dict(inner))
        return EngineSetup(**{k: flat[k] for k in SETUP_FIELDS if k in flat})
    quant = config.get("quant") if isinstance(config.get("quant"), Mapping) else {}
    draft = config.get("draft") if isinstance(config.get("draft"), Mapping) else {}
    d: dict = {}
    if config.get("model"):
        d["model"] = config["model"]
    precision = quant.get("precision") or config.get("precision")
    if precision:
        d["precision"] = base_precision(precision)
    group = quant.get("group_size") or config.get("group_size") or _group_of(config.get("precision"))
    if group:
        d["group_size"] = int(group)
    for k in ("quantize_embeddings", "quantize_head"):
        v = quant.get(k, config.get(k))
        if isinstance(v, bool):
            d[k] = v
    if isinstance(config.get("device"), str):
        d["device"] = config["device"]
    if draft.get("kind") and draft["kind"] != NO_DRAFT:
        d["draft"] = draft["kind"]
        if draft.get("model"):
            d["draft_model"] = draft["model"]
        if draft.get("precision"):
            d["draft_precision"] = base_precision(draft["precision"])
        if isinstance(draft.get("gamma"), int):
            d["gamma"] = draft["gamma"]
        if isinstance(draft.get("adaptive"), bool):
            d["adaptive_gamma"] = draft["adaptive"]
    return EngineSetup(**d)
