"""`python -m engine plan` and its subcommands; regressions found through the CLI."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import planner  # noqa: E402
from engine.planner import shapes  # noqa: E402
from engine.planner import PlanError, Workload, calibrate, plan  # noqa: E402
from engine.planner.gpus import load_gpus  # noqa: E402

MODELS = shapes.load_models()
GPUS = load_gpus()


# ---------------------------------------------------------------- CLI

def _cli(argv):
    from engine.present import plan_cli
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    plan_cli.add_parser(sub)
    a = ap.parse_args(argv)
    return a.fn(a)


def test_cli_table_json_and_errors(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path))
    rc = _cli(["plan", "--model", "llama-3.1-8b", "--rate", "3", "--gpus", "L4,H100 SXM", "--precisions", "int4,fp8",
               "--tp", "1,2", "--spec", "off", "--why"])
    out = capsys.readouterr().out
    assert rc == 0 and "$/1M out" in out and "why " in out and "TTFT p90" in out
    rc = _cli(["plan", "--model", "llama-3.1-8b", "--rate", "3", "--gpus", "L4", "--precisions", "int4",
               "--spec", "off", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["best"]["gpu"] == "L4" and d["best"]["why"]
    rc = _cli(["plan", "--model", "nope", "--rate", "-2", "--gpus", "H300"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown model 'nope'" in err and "request_rate" in err and "unknown GPU 'H300'" in err
    rc = _cli(["plan", "--model", "qwen2.5-7b", "sweep", "L40S", "--precisions", "bf16,int4", "--batches", "1,64",
               "--acceptance", "0.7"])
    assert rc == 0 and "spec speedup" in capsys.readouterr().out
    rc = _cli(["plan", "tables", "gpus"])
    assert rc == 0 and "spread" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # a mode that was a flag: refused with its subcommand
        _cli(["plan", "--gpus-table"])
    assert e.value.code == 2 and "python -m engine plan tables gpus" in capsys.readouterr().err


# ---------------------------------------------------------------- regressions

def _spec_record(run_id, model, precision, draft_model, draft_precision, acceptance, kind="model"):
    """A speculative run record as RunRecord.to_dict() stores it."""
    return {"run_id": run_id, "kind": "generate", "machine": {"device": "cpu"},
            "config": {"model": model, "precision": precision, "device": "cpu",
                       "draft": {"kind": kind, "model": draft_model, "precision": draft_precision, "gamma": 4}},
            "metrics": {"decode_tok_s": 20.0, "spec": {"acceptance_rate": acceptance, "gamma": 4,
                                                       "draft_kind": kind, "drafted": 200}}}


def test_acceptance_is_never_borrowed_from_an_unrelated_or_self_identical_run():
    # Defect 4: after one run of the 0.5B drafting for itself (acceptance 1.0), llama-3.1-8b planned
    # speculation with "acceptance 1.000 (measured by the lab ...: qwen2.5-coder-0.5b + model
    # qwen2.5-coder-0.5b)", i.e. E = 5 tokens per step.
    identical = _spec_record("self-0.5b", "qwen2.5-coder-0.5b", "fp32", "qwen2.5-coder-0.5b", "fp32", 1.0)
    cal = calibrate([identical])
    assert cal.acceptance_for("qwen2.5-coder-0.5b", "model", "qwen2.5-coder-0.5b") is None
    assert cal.acceptance_for("llama-3.1-8b", "model", "llama-3.2-1b") is None
    w = Workload("llama-3.1-8b", 2, 512, 256, gpus=["L4"], precisions=["int4"], tp_options=[1], spec="on")
    res = plan(w, GPUS, MODELS, calibration=cal)
    assert all(p.spec_config["acceptance_rate"] == planner.ASSUMED_ACCEPTANCE for p in res.plans)
    note = next(n for n in res.notes if n.startswith("speculation"))
    assert "acceptance 0.6: assumed default, no matching measurement" in note, note
    assert "ignored" in note and "E = 2.31" in note
    assert res.best is not None and any("assumed default" in x for x in res.best.assumptions)
    # A genuine pair measured on another target does not transfer either; on its own target it does.
    pair = _spec_record("coder-pair", "qwen2.5-coder-1.5b", "int8", "qwen2.5-coder-0.5b", "int4-g64", 0.8)
    cal = calibrate([identical, pair])
    res = plan(w, GPUS, MODELS, calibration=cal)
    note = next(n for n in res.notes if n.startswith("speculation"))
    assert "assumed default" in note and "qwen2.5-coder-1.5b + model qwen2.5-coder-0.5b" in note
    a, g, n, desc = cal.acceptance_for("qwen2.5-coder-1.5b", "model", "qwen2.5-coder-0.5b")
    assert (a, n) == (0.8, 1) and "measured by the lab" in desc
    assert cal.acceptance_for("qwen2.5-coder-1.5b", "ngram") is None          # another draft kind
    assert cal.acceptance_for("qwen2.5-coder-1.5b", "model", "qwen2.5-0.5b") is None   # another draft model


def test_absurd_inputs_are_refused_with_the_field_and_the_fix(capsys, monkeypatch, tmp_path):
    # Defect 5: `plan --rate 1e12` answered with 256,880,463,609 L4 GPUs.
    with pytest.raises(PlanError) as e:
        plan(Workload("llama-3.1-8b", 1e12, 512, 256, gpus=["L4"]), GPUS, MODELS)
    msg = dict(e.value.problems)["request_rate"]
    assert "beyond any deployment" in msg and "at most 1e+06" in msg and "requests per second" in msg
    bad = Workload("gpt-9", 1e-300, 10 ** 8, 10 ** 12, price_overrides={"L4": 1e9})
    with pytest.raises(PlanError) as e:
        bad.validate(MODELS, GPUS)
    msgs = dict(e.value.problems)
    assert "below any deployment" in msgs["request_rate"]
    assert "beyond any model's context" in msgs["input_tokens"] and "10,000,000" in msgs["input_tokens"]
    assert "beyond any model's context" in msgs["output_tokens"]
    assert "beyond any GPU's price" in msgs["price_overrides[L4]"]
    # Sane inputs whose answer is beyond any fleet: infeasible, never a count of millions of GPUs.
    w = Workload("llama-3.1-405b", 1e6, 4096, 1024, gpus=["H100 SXM"], precisions=["fp8"], tp_options=[8],
                 spec="off")
    res = plan(w, GPUS, MODELS)
    assert res.best is None and "beyond any fleet" in res.plans[0].reasons[0]
    assert all(p.gpus_total <= planner.MAX_GPUS_PER_PLAN for p in res.plans)
    monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path))
    assert _cli(["plan", "--model", "llama-3.1-8b", "--rate", "1e12"]) == 2
    err = capsys.readouterr().err
    assert "request_rate: 1e+12 requests/s is beyond any deployment" in err
    assert _cli(["plan", "--model", "llama-3.1-8b", "sweep", "L4", "--batches", "0,8"]) == 2
    assert "batches" in capsys.readouterr().err
    assert _cli(["plan", "packing", "L4", "--model", "llama-3.1-8b", "--input", "-5"]) == 2
    assert "input_tokens" in capsys.readouterr().err


def test_cli_gets_stored_runs_and_overrides_from_its_caller(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path))
    from engine.present import plan_cli
    pair = _spec_record("coder-pair", "qwen2.5-coder-1.5b", "int8", "qwen2.5-coder-0.5b", "int4-g64", 0.8)
    calls = []

    def runs():
        calls.append("runs")
        return [pair]

    def overrides():
        calls.append("overrides")
        return [{"name": "L4", "price_usd_per_hr": 0.5, "price_source": "our contract"}]

    def cli(argv):
        ap = argparse.ArgumentParser()
        plan_cli.add_parser(ap.add_subparsers(dest="cmd", required=True), runs, overrides)
        a = ap.parse_args(argv)
        return a.fn(a)

    argv = ["plan", "--model", "qwen2.5-coder-1.5b", "--gpus", "L4", "--precisions", "int8", "--tp", "1",
            "--spec", "on", "--json"]
    assert cli(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["spec_config"]["acceptance_rate"] == 0.8 and d["best"]["usd_per_hr"] == 0.5
    assert calls == ["runs", "overrides"]
    assert cli(argv + ["--no-store"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["spec_config"]["acceptance_rate"] == planner.ASSUMED_ACCEPTANCE
    assert calls == ["runs", "overrides"]                  # --no-store reads nothing

    def broken():
        raise OSError("disk gone")

    ap = argparse.ArgumentParser()
    plan_cli.add_parser(ap.add_subparsers(dest="cmd", required=True), broken, broken)
    a = ap.parse_args(argv)
    assert a.fn(a) == 0                                     # a broken store must not stop planning
