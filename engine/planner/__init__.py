"""The cost & capacity planner: pure functions of model shapes, GPU specs and workloads; nothing of the live engine."""
