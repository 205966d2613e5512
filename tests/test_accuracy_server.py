"""HumanEval pass@1 through a server: llama-server's Q4_K_M answering several problems at once (apart from
test_accuracy.py, whose pages' environment points the cache, and so llama-server's build, at a scratch dir)."""
import pytest

from engine.measure import accuracy
from tests.test_accuracy import IDS, TOKENS


@pytest.fixture(scope="module")
def q4km_server():
    """llama-server serving the 0.5B's shipped Q4_K_M GGUF in 2 slots on 127.0.0.1, for this module's tests."""
    from engine.peers import servers

    spec = servers.ServerSpec.of("llama-server", model="default-draft", precision="Q4_K_M", slots=2, max_model_len=1024)
    why = servers.unavailable_reason(spec)
    if why:
        pytest.skip(why)
    with servers.start(spec) as rs:
        yield spec, rs


def test_a_server_answers_concurrently_in_problem_order(q4km_server):
    """2 slots, 2 requests in flight: every answer lands on its own problem."""
    spec, rs = q4km_server
    rec = accuracy.evaluate_endpoint(rs.url, "llama-server Q4_K_M", "qwen2.5-coder-0.5b", "Q4_K_M",
                                     spec.served_name, ids=IDS, max_new_tokens=TOKENS, concurrency=2,
                                     server=rs.facts())
    a = rec.metrics["accuracy"]
    assert [o["task_id"] for o in a["outcomes"]] == IDS and rec.config["batch_size"] == 2
    assert all(o["completion"].strip() for o in a["outcomes"]), a["outcomes"]
    assert a["solved"] >= 1 and "2 slots" in rec.config["label"] + rec.config["server"]["label"]


def test_llama_server_rows_find_llama_cpp_kld_of_the_same_gguf(q4km_server):
    """A stored llama.cpp quality run (the shipped Q4_K_M, scored by llama-cpp-python) is the KLD beside
    llama-server's accuracy row of the same GGUF; another model's is not."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (`make peers`)")
    from engine.peers.quality_worker import llama_cpp_quality, llama_cpp_record
    from engine.present.accuracy_view import accuracy_rows

    spec, rs = q4km_server
    acc = accuracy.evaluate_endpoint(rs.url, "llama-server Q4_K_M", "qwen2.5-coder-0.5b", "Q4_K_M",
                                     spec.served_name, ids=IDS[:1], max_new_tokens=16, server=rs.facts())
    q = llama_cpp_quality("default-draft", 64)
    assert "failed" not in q and "unavailable" not in q, q
    (row,) = accuracy_rows([acc], [llama_cpp_record("default-draft", q)])
    assert row["KLD mean"] == f"{q['kld_mean']:.5f}" and row["KLD p99"] == f"{q['kld_p99']:.4f}"
    (row,) = accuracy_rows([acc], [llama_cpp_record("default", q)])  # the 1.5B's: not this row's
    assert row["KLD mean"] == "–"


def test_a_server_that_never_answers_is_named_with_the_fix():
    """A request past its timeout ends the run with the server, the problem and the timeout named (was a bare
    httpx traceback after 600 s, seen with a 2-core host shared with a compile)."""
    import socket

    from engine.common.errors import UserError

    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        _, probs = accuracy.select(ids=IDS[:1])
        with pytest.raises(UserError, match=r"no answer to HumanEval/\d+ within 1 s") as e:
            accuracy.complete_endpoint(url, None, probs, 4, timeout_s=1.0)
    assert "--batch" in e.value.fix
