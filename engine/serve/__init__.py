"""Serving: the engine behind an OpenAI-compatible HTTP server with continuous batching.

loop.py runs the scheduler (engine.infer.scheduler) on its own thread; protocol.py is the OpenAI
API's request checks and response shapes; app.py the FastAPI app; stats.py the server's counters
and their Prometheus text; cli.py `python -m engine serve`.
"""
