"""The engine setup a stored record was measured with, from its config of any readable schema.

Pure (no torch), so the planner reads records' setups the way the lab writes them:
- now: `config.setup` holds the EngineSetup fields (engine.measure.record_config writes it);
- schema 2 bench records: `config.run_config` holds the run's config flat, setup fields at the top;
- a calibrated int4 (GPTQ, AWQ) also keeps `config.calibration` (calibrate.Calibrated.facts): which version of
  the algorithm made its codes, on which text. The setup cannot say it, so `stale_calibration` does;
- older and other records: `config.model`, `config.precision` (a label such as 'int4-g64'),
  `config.quant` (the loaded QuantSpec) and `config.draft` (kind, model, precision, gamma, adaptive).
"""
from __future__ import annotations

import re
from dataclasses import fields
from typing import Mapping

from engine.common.setup import NO_DRAFT, EngineSetup
from engine.common.vocab import CALIBRATION_VERSIONS, QUANT_METHODS, SPEC_POLICIES

SETUP_FIELDS = tuple(f.name for f in fields(EngineSetup))


def base_precision(label) -> str:
    """'int4-g64' -> 'int4', 'int4-gptq-g64' -> 'int4': a precision label without its method and group."""
    return str(label or "").lower().split("-")[0]


def _group_of(label) -> int | None:
    """'int4-g32' -> 32, 'int4-gptq-g32' -> 32; None when the label has no group suffix."""
    m = re.search(r"-g(\d+)$", str(label or "").lower())
    return int(m.group(1)) if m else None


def _method_of(label) -> str | None:
    """'int4-gptq-g32' -> 'gptq'; None for a label without a method (round-to-nearest)."""
    parts = re.sub(r"-g\d+$", "", str(label or "").lower()).split("-", 1)
    return parts[1] if len(parts) == 2 and parts[1] in QUANT_METHODS else None


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
    method = quant.get("method") or _method_of(config.get("precision"))
    if method:
        d["method"] = method
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
        if draft.get("policy") in SPEC_POLICIES:
            d["spec_policy"] = draft["policy"]
    return EngineSetup(**d)


def calibration_of(config: Mapping) -> Mapping:
    """A record config's calibration facts (calibrate.Calibrated.facts); {} where it has none."""
    cal = config.get("calibration") if isinstance(config, Mapping) else None
    return cal if isinstance(cal, Mapping) else {}


def stale_calibration(config: Mapping) -> str | None:
    """Why a record's calibrated int4 is not the lab's current one, in a few words; None when it is, or when its
    int4 is not calibrated (round-to-nearest, a checkpoint's codes, another precision). Two records of one setup
    calibrated by different versions of GPTQ are different configurations: the label and the planner say so."""
    try:
        setup = setup_from_record(config)
    except (TypeError, ValueError):  # a setup this lab cannot read has nothing to say about calibration
        return None
    method = setup.method.removesuffix("-mixed")
    if base_precision(setup.precision) != "int4" or method not in CALIBRATION_VERSIONS:
        return None
    version = calibration_of(config).get("version")
    now = CALIBRATION_VERSIONS[method]
    if version == now:
        return None
    if version is None:
        return f"{method} version not recorded (records kept it from 2026-12-07; the lab's {method} is v{now})"
    return f"{method} v{version}, the lab's is v{now}"


def calibration_suffix(config: Mapping) -> str:
    """What a label appends for a stale calibration (stale_calibration, bracketed); '' for a current one."""
    stale = stale_calibration(config)
    return f" [{stale}]" if stale else ""
