"""One exception type for mistakes a user can fix; its message names the problem and the fix."""


class UserError(ValueError):
    def __init__(self, problem: str, fix: str = ""):
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. Fix: {fix}" if fix else problem)
