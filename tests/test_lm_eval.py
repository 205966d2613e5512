"""lm-evaluation-harness (`lm_eval`, the `eval` extra) against our real server on 127.0.0.1, scored against
what `lm_eval` gets from transformers on the same model: the 0.5B ("default-draft") at fp32 without a
draft on both sides, greedy. Two local tasks ship in tests/lm_eval_tasks/ (JSONL, nothing downloaded):
scl_gen (generate_until with `until` stop strings, exact match) through `local-completions` and
`local-chat-completions`, and scl_mc (multiple_choice: loglikelihood, which needs echo + logprobs)
through `local-completions`. Every answer and every log-likelihood is compared, not only the scores."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.serving import served

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: `make eval` "
                                                "(pip install -e '.[eval]', lm_eval==0.4.13)")

TASKS = Path(__file__).parent / "lm_eval_tasks"
MAX_LEN = 512


@pytest.fixture(scope="module", autouse=True)
def offline():
    """Nothing may come from the hub: the data are local JSONL, the tokenizer the catalog folder."""
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({k: "1" for k in saved})
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def folder():
    from engine.infer import catalog

    return str(catalog.resolve("default-draft"))


@pytest.fixture(scope="module")
def server():
    with served("--model", "default-draft", "--precision", "fp32", "--draft", "none", "--max-seqs", "2",
                "--max-model-len", str(MAX_LEN), "--prefill-chunk", "256") as s:
        yield s


def _task(name: str) -> dict:
    """The task's YAML with its JSONL path made absolute (the YAML's is relative to the repo root)."""
    import yaml

    cfg = yaml.safe_load((TASKS / f"{name}.yaml").read_text())
    cfg["dataset_kwargs"] = {"data_files": {"test": str(TASKS / f"{name.removeprefix('scl_')}.jsonl")}}
    return cfg


def _tasks(metadata: dict | None = None):
    """lm_eval's task manager without its built-in tasks: ours are passed as configs, and indexing the thousands
    of built-in YAMLs took 3-6 s per run (simple_evaluate makes one per call when given none)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_defaults=False, metadata=metadata)


def _evaluate(task: str, model: str, model_args: dict, chat: bool = False) -> tuple[dict, dict]:
    """(metrics, {doc_id: responses}) of one lm_eval run."""
    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[_task(task)], batch_size=1,
                                  task_manager=_tasks(model_args),
                                  apply_chat_template=chat, bootstrap_iters=0, log_samples=True,
                                  random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    return out["results"][task], {s["doc_id"]: s["resps"] for s in out["samples"][task]}


@pytest.fixture(scope="module")
def hf(folder):
    """lm_eval's transformers model on the same folder (fp32, cpu), built once for every task."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=folder, dtype="float32", device="cpu", batch_size=1, max_length=MAX_LEN)


def _api(server, folder, chat: bool) -> dict:
    if chat:  # lm_eval sends the messages; the server applies the chat template
        return {"model": server.model, "base_url": f"{server.url}/v1/chat/completions", "max_retries": 1,
                "max_length": MAX_LEN, "timeout": 300}
    # Token ids, as lm_eval tokenized them: the server scores exactly the tokens transformers scores.
    return {"model": server.model, "base_url": f"{server.url}/v1/completions", "tokenizer_backend": "huggingface",
            "tokenizer": folder, "tokenized_requests": True, "max_retries": 1, "max_length": MAX_LEN,
            "timeout": 300}


def _same_answers(ours: dict, theirs: dict) -> int:
    """How many documents got a different greedy answer (fp32 on both sides: ties may flip at most one)."""
    assert ours.keys() == theirs.keys()
    return sum(ours[d] != theirs[d] for d in ours)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_generate_until_matches_transformers(server, folder, hf, chat):
    ours, our_answers = _evaluate("scl_gen", "local-chat-completions" if chat else "local-completions",
                                  _api(server, folder, chat), chat)
    theirs, their_answers = _evaluate_hf("scl_gen", hf, chat)
    print(f"scl_gen ({'chat' if chat else 'completions'}): ours {ours['exact_match,none']}, "
          f"transformers {theirs['exact_match,none']}; answers {our_answers}")
    n = len(our_answers)
    assert _same_answers(our_answers, their_answers) <= 1, (our_answers, their_answers)
    assert abs(ours["exact_match,none"] - theirs["exact_match,none"]) <= 1 / n + 1e-9
    assert theirs["exact_match,none"] > 0  # the task means something for this model
    # the stop strings were honoured: no answer runs past a newline or into the next question
    for (text,) in (r[0] for r in our_answers.values()):
        assert "\n" not in text and "Question:" not in text, text


def _echo_refused() -> bool:
    from engine.serve import protocol

    return "echo" in getattr(protocol, "NOT_YET", {})


@pytest.mark.xfail(_echo_refused(), strict=True, reason="the server refuses echo (not implemented yet), which "
                                                         "lm_eval's loglikelihood request needs")
def test_loglikelihood_matches_transformers(server, folder, hf):
    ours, our_ll = _evaluate("scl_mc", "local-completions", _api(server, folder, chat=False))
    theirs, their_ll = _evaluate_hf("scl_mc", hf)
    n = len(our_ll)
    print(f"scl_mc: ours acc {ours['acc,none']} acc_norm {ours['acc_norm,none']}, transformers acc "
          f"{theirs['acc,none']} acc_norm {theirs['acc_norm,none']}")
    assert abs(ours["acc,none"] - theirs["acc,none"]) <= 1 / n + 1e-9
    assert abs(ours["acc_norm,none"] - theirs["acc_norm,none"]) <= 1 / n + 1e-9
    assert 0 < theirs["acc,none"]  # the model gets some right: the comparison means something
    worst = 0.0
    for d in our_ll:  # every choice's log-likelihood of every document (fp32 both sides)
        for (ll_ours, _), (ll_theirs, _) in zip((r[0] for r in our_ll[d]), (r[0] for r in their_ll[d])):
            worst = max(worst, abs(ll_ours - ll_theirs))
    print(f"largest log-likelihood difference: {worst:.2e}")
    assert worst < 1e-3


def _evaluate_hf(task: str, hf, chat: bool = False) -> tuple[dict, dict]:
    out = lm_eval.simple_evaluate(model=hf, tasks=[_task(task)], task_manager=_tasks(), apply_chat_template=chat,
                                  bootstrap_iters=0, log_samples=True, random_seed=0, numpy_random_seed=0,
                                  torch_random_seed=0, fewshot_random_seed=0)
    return out["results"][task], {s["doc_id"]: s["resps"] for s in out["samples"][task]}
