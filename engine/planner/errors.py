"""PlanError: every invalid planner input at once, each as (field, message)."""
from __future__ import annotations

from engine.common.errors import UserError


class PlanError(UserError):
    """Invalid planner input. `problems` lists every (field, message) found, not just the first.

    PlanError("rate", "must be > 0") or PlanError([("rate", "..."), ("model", "...")]).
    """

    def __init__(self, field_or_problems, message: str | None = None):
        if isinstance(field_or_problems, str):
            problems = [(field_or_problems, message or "invalid")]
        else:
            problems = list(field_or_problems)
        self.problems: list[tuple[str, str]] = problems
        self.field, self.message = problems[0] if problems else ("", "")
        text = "; ".join(f"{f}: {m}" for f, m in problems)
        super().__init__(f"invalid plan input: {text}", "correct the fields named above")

    def to_dict(self) -> dict:
        return {"error": "invalid input", "problems": [{"field": f, "message": m} for f, m in self.problems]}
