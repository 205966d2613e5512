"""`python -m engine` as a new user would run it."""
import json
import os
import subprocess
import sys

import pytest

from engine.measure.records import SCHEMA_VERSION

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_generate_json_record():
    r = cli("generate", "--model", "default-draft", "--precision", "int4", "--max-new-tokens", "8",
            "--prompt", "Say hi.", "--draft", "ngram", "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["schema_version"] == SCHEMA_VERSION and rec["config"]["precision"] == "int4-g64"
    assert rec["metrics"]["new_tokens"] >= 1
    runs = cli("runs", "--json")
    assert rec["run_id"] in runs.stdout


@pytest.mark.parametrize("args,msg", [
    (["--model", "qwen-9000"], "unknown model 'qwen-9000'"),
    (["--precision", "fp9"], "unknown precision 'fp9'"),
    (["--precision", "fp8"], "fp8 needs an NVIDIA GPU"),
    (["--max-new-tokens", "40000"], "beyond the model's context"),
    (["--draft", "self", "--gamma", "0"], "gamma 0 is out of range"),
    (["--temperature", "-1"], "temperature -1.0 is out of range"),
])
def test_bad_input_gets_clear_errors(args, msg):
    r = cli("generate", "--model", "default-draft", "--prompt", "hi", *args)
    assert r.returncode == 2
    assert msg in r.stderr and "Traceback" not in r.stderr
    assert "Fix:" in r.stderr


def test_models_lists_catalog():
    r = cli("models", "--json")
    assert r.returncode == 0
    names = {m["name"] for m in json.loads(r.stdout)}
    assert names == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
