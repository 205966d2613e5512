"""`python -m tests.tiny_app [streamlit run options]`: the dashboard driving a backend that serves the tiny test
models (`python -m tests.tiny_backend`), for trying the pages by hand in seconds. The dashboard registers no
model: it learns them from the backend's /v1/info. Both stop together (Ctrl-C)."""
import os
import sys
import tempfile
from pathlib import Path

from tests.test_browser_e2e import running_dashboard

if __name__ == "__main__":
    data = Path(tempfile.mkdtemp(prefix="scl-tiny-app-"))
    with running_dashboard(data, {"SCL_CACHE_DIR": str(data / "cache")}, tiny=True) as app:
        print(f"dashboard {app['url']} driving the tiny backend {app['backend']['url']} (store {data}); "
              "Ctrl-C stops both", flush=True)
        try:
            os.waitpid(app["pid"], 0)
        except KeyboardInterrupt:
            pass
    sys.exit(0)
