"""The backend: one long-lived process that owns the models, the kernels and the runs (docs/BACKEND.md).

client.py (the pages' side: httpx and engine.common only, no torch), contract.py (what both sides
agree on), validate.py (a submission checked field by field), jobs.py (the FIFO queue and its one
worker thread), app.py (the HTTP API), cli.py (`python -m engine backend`). This module imports only
the client, so `import engine.backend` stays torch-free.
"""
from engine.backend.client import (Backend, BackendAuthError, BackendError, BackendJobUnknown, BackendRejected,
                                   BackendUnavailable, BackendVersionMismatch)
from engine.backend.contract import API_VERSION, DEFAULT_PORT, DEFAULT_URL

__all__ = ["Backend", "BackendAuthError", "BackendError", "BackendJobUnknown", "BackendRejected",
           "BackendUnavailable", "BackendVersionMismatch", "API_VERSION", "DEFAULT_PORT", "DEFAULT_URL"]
