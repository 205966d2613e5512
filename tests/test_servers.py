"""The peer-server launcher: real servers started on 127.0.0.1, ready on /health, stopped by PID;
missing peers reported with the reason and the fix; a server that cannot start fails clearly."""
from __future__ import annotations

import os

import httpx
import pytest

from engine.common.errors import UserError
from engine.peers import servers
from engine.peers.servers import ServerSpec


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; it only waits to be reaped
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_specs_are_validated_with_the_fix():
    for spec, word in [(ServerSpec.of("tgi"), "unknown server"), (ServerSpec.of("url"), "needs its URL"),
                       (ServerSpec.of("llama-server", precision="int4"),
                        "Q4_K_M, Q4_K_M-requant, Q4_K_M-imatrix, IQ4_XS, IQ4_XS-imatrix, Q8_0, BF16"),
                       (ServerSpec.of("vllm", draft="ngram"), "without a draft"),
                       (ServerSpec.of("vllm", precision="int4"), "AWQ or GPTQ checkpoint"),
                       (ServerSpec.of("llama-server", slots=0), "slots"),
                       # a folder has no shipped GGUF: refused before an accuracy run's other configurations run (it
                       # failed after them, 2026-12-08), with llama.cpp's quantizer on the folder as the fix
                       (ServerSpec.of("llama-server", model="/tmp/some-folder"), "Q4_K_M-requant")]:
        with pytest.raises(UserError, match=word):
            spec.validate()
    assert ServerSpec.of("llama-server", model="/tmp/some-folder", precision="Q4_K_M-requant").validate()


def test_our_kv_cache_is_typed_labelled_and_passed_refused_for_peers():
    spec = ServerSpec.of("serving-cost-lab", precision="int4", kv_dtype="int8", kv_cache_gib=0.25).validate()
    cmd = spec.command(8000)
    assert cmd[cmd.index("--kv-dtype") + 1] == "int8" and cmd[cmd.index("--kv-cache-gib") + 1] == "0.25"
    assert spec.label == "serving-cost-lab int4 (8 seqs, KV int8 in 0.25 GiB)"
    slots = ServerSpec.of("serving-cost-lab", precision="int4", kv_cache="slots").validate()
    assert slots.command(8000)[-2:] == ["--kv-cache", "slots"] and slots.label.endswith("(8 seqs, slot KV cache)")
    plain = ServerSpec.of("serving-cost-lab", precision="int4").validate()
    assert "--kv-dtype" not in plain.command(8000) and plain.label == "serving-cost-lab int4 (8 seqs)"
    assert ServerSpec.from_dict(spec.to_dict()).label == spec.label
    for bad, word in [(dict(kv_dtype="int3"), "unknown KV-cache dtype 'int3'"), (dict(kv_cache_gib=-1), "out of range"),
                      (dict(kv_cache="ring"), "unknown KV cache .ring."),
                      (dict(kv_cache="slots", kv_dtype="int8"), "need the paged KV cache"),
                      (dict(extra_args=["--kv-dtype", "int8"]), "label does not say")]:
        with pytest.raises(UserError, match=word):
            ServerSpec.of("serving-cost-lab", precision="int4", **bad).validate()
    with pytest.raises(UserError, match="its own server only, not llama-server's"):
        ServerSpec.of("llama-server", kv_dtype="int8").validate()


def test_vllm_runs_the_precision_its_label_says():
    """vLLM used to get --dtype bfloat16 whatever the spec said: each precision now has its own arguments."""
    for prec, want in [("bf16", ["--dtype", "bfloat16"]), ("fp32", ["--dtype", "float32"]),
                       ("int8", ["--quantization", "int8_per_channel_weight_only"])]:
        spec = ServerSpec.of("vllm", precision=prec).validate()
        cmd = spec.command(8000)
        assert " ".join(want) in " ".join(cmd) and prec in spec.label
        assert cmd.count("--dtype") == 1


def test_missing_peers_say_why_and_how_to_get_them(monkeypatch, tmp_path):
    monkeypatch.setattr(servers, "VLLM_VENV", tmp_path / "no-venv")
    problem, fix = servers.unavailable(ServerSpec.of("vllm"))
    assert "not installed" in problem and "make peers-vllm" in fix
    monkeypatch.setenv("SCL_LLAMA_SERVER", str(tmp_path / "absent"))
    monkeypatch.setenv("SCL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    problem, fix = servers.unavailable(ServerSpec.of("llama-server"))
    assert "not built" in problem and "make peers" in fix
    with pytest.raises(servers.ServerUnavailable, match="make peers"):
        servers.start(ServerSpec.of("llama-server"))


def test_commands_name_the_model_slots_and_context():
    spec = ServerSpec.of("serving-cost-lab", precision="int4", draft="model", gamma=3, slots=4, max_model_len=1024)
    cmd = spec.command(8123)
    assert cmd[1:4] == ["-m", "engine", "serve"] and cmd[cmd.index("--max-seqs") + 1] == "4"
    assert cmd[cmd.index("--gamma") + 1] == "3" and cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--spec-policy") + 1] == "fixed"  # the setup's, not the serve CLI's default (adaptive)
    assert cmd[cmd.index("--per-request-spec-decode-metrics") + 1] == "summary"  # acceptance per category
    assert spec.setup.to_record()["draft"] == {"kind": "model", "model": "default-draft", "precision": "int4",
                                               "gamma": 3, "adaptive": False, "policy": "fixed"}
    assert spec.label == "serving-cost-lab int4 + default-draft@int4 g=3 (4 seqs)"
    if servers.llama_server_binary() is not None:
        cmd = ServerSpec.of("llama-server", slots=8, max_model_len=2048).command(8124)
        assert cmd[cmd.index("-np") + 1] == "8" and cmd[cmd.index("-c") + 1] == str(8 * 2048)  # c is split by np
        assert cmd[cmd.index("-m") + 1].endswith(".gguf") and "--metrics" in cmd


def test_url_peer_that_does_not_answer():
    with pytest.raises(UserError, match="did not answer"):
        servers.start(ServerSpec.of("url", url=f"http://127.0.0.1:{servers.free_port()}", startup_timeout_s=1.5))


@pytest.fixture(scope="module")
def llama():
    spec = ServerSpec.of("llama-server", model="default-draft", slots=2, max_model_len=512)
    reason = servers.unavailable_reason(spec)
    if reason:
        pytest.skip(reason)
    rs = servers.start(spec)
    yield rs
    rs.stop()


def test_llama_server_runs_with_its_prompt_cache_off(llama):
    """Issue 23: comparisons run with every prompt cache off (our engine has none). The same prompt sent twice
    to llama-server is prefilled in full both times: its own timings say no token came from a cache."""
    body = {"prompt": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "n_predict": 2,
            "temperature": 0}
    answers = [httpx.post(llama.url + "/completion", json=body, timeout=60).json() for _ in range(2)]
    t0, t1 = (a["timings"] for a in answers)
    assert t0["prompt_n"] > 10 and t1["prompt_n"] == t0["prompt_n"], (t0, t1)
    assert t1.get("cache_n", 0) == 0, t1
    assert llama.facts()["prompt_cache"].startswith("off")


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_llama_server_runs_its_own_speculative_decoding(draft):
    """Issue 23: llama-server at its best drafts natively (-md with the 0.5B GGUF, or its n-gram lookup). The
    server's own timings and /metrics say it drafted, and the load record's acceptance reads its counters."""
    from engine.load import server_metrics

    spec = ServerSpec.of("llama-server", model="default-draft", slots=1, max_model_len=512, draft=draft, gamma=3)
    if servers.unavailable_reason(spec):
        pytest.skip(servers.unavailable_reason(spec))
    assert ("-md" in spec.command(1)) is (draft == "model") and "g=3" in spec.label
    with servers.start(spec) as rs:
        before = httpx.get(rs.url + "/metrics").text
        body = {"prompt": "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return", "n_predict": 24,
                "temperature": 0}
        t = httpx.post(rs.url + "/completion", json=body, timeout=120).json()["timings"]
        after = httpx.get(rs.url + "/metrics").text
    assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"], t
    spec_stats = server_metrics.spec_from(server_metrics.diff(server_metrics.parse(before),
                                                              server_metrics.parse(after)))
    assert spec_stats["drafted"] == t["draft_n"] and spec_stats["accepted"] == t["draft_n_accepted"]


def test_llama_server_runs_the_precision_its_label_says():
    """Issue 23.2: llama-server at our precision. Q8_0 is the catalog weights (those our int8 quantizes)
    converted by llama.cpp's own converter (no F32 GGUF in between); the server reports that file as its model,
    and answers."""
    spec = ServerSpec.of("llama-server", model="default-draft", precision="Q8_0", slots=1, max_model_len=256)
    if servers.unavailable_reason(spec):
        pytest.skip(servers.unavailable_reason(spec))
    gguf = spec.llama_gguf()
    assert gguf.name == "model-Q8_0.gguf" and gguf.stat().st_size > 0
    assert gguf != ServerSpec.of("llama-server", model="default-draft").llama_gguf()
    with servers.start(spec) as rs:
        assert httpx.get(rs.url + "/props", timeout=30).json()["model_path"] == str(gguf)
        body = {"prompt": "def add(a, b):", "n_predict": 4, "temperature": 0}
        assert httpx.post(rs.url + "/completion", json=body, timeout=60).json()["tokens_predicted"] == 4
        assert "Q8_0" in rs.spec.label and rs.facts()["weights"].startswith("converted to Q8_0 by llama.cpp")


def test_llama_server_drafts_are_refused_by_name_where_it_has_none():
    with pytest.raises(UserError, match="no 'self' draft"):
        ServerSpec.of("llama-server", draft="self", draft_precision="int4").validate()
    with pytest.raises(UserError, match="as shipped"):
        ServerSpec.of("llama-server", draft="model", draft_precision="int4").validate()
    with pytest.raises(UserError, match="without a draft"):
        ServerSpec.of("vllm", draft="ngram").validate()


def test_llama_server_starts_answers_and_stops_by_pid(llama):
    assert _alive(llama.pid) and httpx.get(llama.url + "/health").status_code == 200
    facts = llama.facts()
    assert facts["launch"]["port"] == llama.port and facts["launch"]["pid"] == llama.pid
    assert os.path.exists(facts["launch"]["log"]) and facts["launch"]["ready_s"] > 0
    assert facts["model"] == "qwen2.5-coder-0.5b" and facts["slots"] == 2
    models = httpx.get(llama.url + "/v1/models").json()
    assert models["data"][0]["id"] == "qwen2.5-coder-0.5b"  # --alias: the served name
    # the URL peer wraps a running server without owning it
    other = servers.start(ServerSpec.of("url", url=llama.url))
    other.stop()
    assert _alive(llama.pid)
    pid = llama.pid
    llama.stop()
    assert not _alive(pid)


def test_a_server_that_cannot_start_fails_with_its_log(tmp_path):
    spec = ServerSpec.of("llama-server", model="default-draft", slots=1, max_model_len=256,
                      extra_args=["--no-such-flag"], startup_timeout_s=60)
    if servers.unavailable_reason(spec):
        pytest.skip(servers.unavailable_reason(spec))
    with pytest.raises(servers.ServerFailed, match="exited with status"):
        servers.start(spec, log_dir=tmp_path)
    assert any("no-such-flag" in p.read_text() for p in tmp_path.iterdir())


def test_our_server_is_started_with_the_int4_method_it_is_labelled_with():
    spec = ServerSpec.of("serving-cost-lab", precision="int4-gptq-g32").validate()
    cmd = spec.command(8000)
    assert cmd[cmd.index("--precision") + 1] == "int4-gptq-g32" and spec.label.startswith("serving-cost-lab int4 gptq")
    plain = ServerSpec.of("serving-cost-lab", precision="int4").validate().command(8000)
    assert plain[plain.index("--precision") + 1] == "int4-g64"
