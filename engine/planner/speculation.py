"""Speculative decoding in a plan: which draft and acceptance rate a plan uses (typed in, measured
by the lab for the same target and draft, else an assumed default that the plan says it assumed).
The closed-form formulas (tokens per target step, its variance, speedup) live in planner.acceptance.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Mapping

from engine.common.vocab import PRECISIONS
from engine.planner import counts, shapes
from engine.planner.acceptance import expected_tokens_per_step, relation
from engine.planner.errors import PlanError
from engine.planner.shapes import ModelShape

if TYPE_CHECKING:  # annotations only; calibration reads the acceptance formulas from planner.acceptance, not here
    from engine.planner.calibration import Calibration

ASSUMED_ACCEPTANCE = 0.6         # used only when nothing is typed in or measured for the same relation
ASSUMED_GAMMA = 4
ASSUMED_SOURCE = "assumed default"
HEADS_DRAFT_COST_RATIO = 0.06
SPEC_DRAFT_KINDS = ("model", "self", "ngram", "suffix", "heads")


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings for a plan.

    draft_kind: model (a smaller model, `draft_model`), self (the target's own weights at
    `draft_precision`), ngram (prompt lookup) and suffix (suffix decoding): no model cost, heads
    (Medusa/EAGLE-style: cost `draft_cost_ratio` of a plain step). draft_precision None = the target's
    precision (self: int4).
    verify_tokens: tokens per sequence the target scores per step (default gamma + 1; a tree is more).
    source: where acceptance_rate comes from, in words ("typed in", "measured by the lab (...)",
    "assumed default, no matching measurement (...)").
    """

    acceptance_rate: float
    gamma: int = ASSUMED_GAMMA
    draft_kind: str = "model"
    draft_model: str | None = None
    draft_precision: str | None = None
    draft_cost_ratio: float | None = None
    verify_tokens: int | None = None
    source: str = "user"

    @property
    def expected_tokens(self) -> float:
        return expected_tokens_per_step(self.acceptance_rate, self.gamma)

    def words(self) -> str:
        """'acceptance 0.72: measured by the lab (...)': the rate a plan uses and where it comes from."""
        return f"acceptance {self.acceptance_rate:.3g}: {self.source}"

    @property
    def assumed(self) -> bool:
        return self.source.startswith(ASSUMED_SOURCE)

    def __post_init__(self):
        a = self.acceptance_rate
        if isinstance(a, bool) or not isinstance(a, (int, float)) or math.isnan(a) or not 0 <= a <= 1:
            raise PlanError("acceptance_rate", f"must be in [0, 1], got {a!r}")
        if self.gamma < 1:
            raise PlanError("gamma", f"must be >= 1, got {self.gamma}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["expected_tokens_per_step"] = self.expected_tokens
        return d


def default_draft(model: ModelShape, models: Mapping[str, ModelShape]) -> ModelShape | None:
    """A usable draft from the catalog: same family and tokenizer, at most half the target's
    active parameters (an MoE target's per-token cost is its active part); a sibling of the same line
    (qwen2.5-coder-* for qwen2.5-coder-*) first, then the
    smallest. None when the catalog has none (plans then use n-gram drafting)."""
    prefix = model.name.rsplit("-", 1)[0]
    # Same tokenizer: vocab sizes may differ by padding (Qwen2.5: 151936 small, 152064 large).
    same = [m for m in models.values() if m.family == model.family and abs(m.vocab - model.vocab) <= 0.01 * model.vocab
            and m.name != model.name and counts.param_count(m, True) * 2 <= counts.param_count(model, True)
            and m.extra_linear_params == 0]
    if not same:
        return None
    return min(same, key=lambda m: (m.name.rsplit("-", 1)[0] != prefix, counts.param_count(m)))


def choose_spec(w, model: ModelShape, models: Mapping[str, ModelShape], calibration: Calibration | None = None
                ) -> tuple[SpecConfig, ModelShape | None]:
    """The speculation a workload plans with, and its draft shape (None for ngram/heads).

    `w` is a Workload (draft_model, draft_kind, gamma, acceptance_rate). Acceptance: typed in, else
    measured by the lab for the same target and draft relation (Calibration.acceptance_for), else
    ASSUMED_ACCEPTANCE; SpecConfig.source says which, and why nothing measured applied.
    """
    draft_m = shapes.get_model(w.draft_model, models) if w.draft_model else default_draft(model, models)
    kind = w.draft_kind or ("model" if draft_m is not None else "ngram")
    if kind != "model":
        draft_m = None if kind != "self" else model
    draft_name = draft_m.name if draft_m else None
    gamma = w.gamma or ASSUMED_GAMMA
    # Medusa/EAGLE-style heads: ~6% of a plain step per round (Medusa's 5 heads on Vicuna-7B read
    # 1.48 GB against the 13.5 GB backbone; docs/PLANNER.md); n-gram lookup costs no model pass.
    ratio = HEADS_DRAFT_COST_RATIO if kind == "heads" else None
    if w.acceptance_rate is not None:
        return SpecConfig(float(w.acceptance_rate), gamma, kind, draft_name, draft_cost_ratio=ratio,
                          source="typed in"), draft_m
    meas = calibration.acceptance_for(model.name, kind, draft_name) if calibration else None
    if meas is not None:
        a, g, _, desc = meas
        dp = calibration.draft_precision_for(model.name, kind) if kind == "self" else None
        return SpecConfig(a, w.gamma or max(1, int(round(g))), kind, draft_name,
                          draft_precision=dp if dp in PRECISIONS else None, draft_cost_ratio=ratio,
                          source=desc), draft_m
    why = (calibration.why_no_acceptance(model.name, kind, draft_name) if calibration
           else "no lab measurements given")
    return SpecConfig(ASSUMED_ACCEPTANCE, gamma, kind, draft_name, draft_cost_ratio=ratio,
                      source=f"{ASSUMED_SOURCE}, no matching measurement (no lab run of "
                             f"{relation(model.name, kind, draft_name)}; {why})"), draft_m
