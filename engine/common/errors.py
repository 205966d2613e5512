"""One exception type for mistakes a user can fix; its message names the problem and the fix."""


class UserError(ValueError):
    def __init__(self, problem: str, fix: str = ""):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. Fix: {fix}" if fix else problem)


def read_object(d, what: str, known, send: str) -> dict:
    """`d` as a dict whose keys are all `known`; a UserError names what is not an object, or the first unknown
    key and the fields there are (so a typo is refused, never read as a default)."""
    if not isinstance(d, dict):
        raise UserError(f"{what} must be an object, got {type(d).__name__}", send)
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise UserError(f"unknown {what} field '{unknown[0]}'", f"fields are: {', '.join(sorted(known))}")
    return d
