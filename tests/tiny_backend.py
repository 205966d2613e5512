"""`python -m tests.tiny_backend [--api-version N] BACKEND ARGS...`: the backend with the tiny test models registered.

Production code registers no models; the backend tests need "tiny" and "tiny-draft" inside the
backend process, as tests/conftest.py registers them in the test process. `--api-version N` makes
this backend claim another API version (the version-mismatch test).
"""
import sys
import warnings

warnings.filterwarnings("ignore", message="The pynvml package is deprecated")

from tests.tiny import register  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--api-version"]:
        from engine.backend import contract

        contract.API_VERSION = int(args[1])
        args = args[2:]
    register()
    from engine.__main__ import main

    sys.exit(main(["backend", *args]))
