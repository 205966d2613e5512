"""`python -m engine serve`: the real server on 127.0.0.1, started and stopped by these tests (by PID)."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [f"Write a short Python function number {i} that" for i in range(8)]
N = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, log: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "engine", "serve", "--model", "default-draft", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the server did not answer within 300 s: {log.read_text()[-2000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """int4 0.5B with an n-gram draft, 4 slots and a queue of 4: small enough to overload."""
    s = Server("--precision", "int4", "--draft", "ngram", "--gamma", "3", "--max-seqs", "4", "--max-waiting", "4",
               "--max-model-len", "512", log=tmp_path_factory.mktemp("serve") / "server.log")
    yield s
    s.stop()


def _complete(url, prompt, n=N, **kw):
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                  "ignore_eos": True, **kw}, timeout=300)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


async def _stream_one(client, url, prompt, n=N):
    """Stream a chat completion; returns (text, chunks, usage)."""
    text, chunks, usage = [], 0, None
    async with client.stream("POST", url + "/v1/chat/completions", timeout=300,
                             json={"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                                   "temperature": 0, "ignore_eos": True, "stream": True,
                                   "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj["usage"]
            for c in obj["choices"]:
                text.append(c["delta"].get("content") or "")
                chunks += 1
    return "".join(text), chunks, usage


def test_eight_concurrent_streams_match_each_request_alone(server):
    async def main():
        async with httpx.AsyncClient() as c:
            alone = [await _stream_one(c, server.url, p) for p in PROMPTS]
            together = await asyncio.gather(*[_stream_one(c, server.url, p) for p in PROMPTS])
        return alone, together

    alone, together = asyncio.run(main())
    assert [t for t, _, _ in together] == [t for t, _, _ in alone]
    assert all(u["completion_tokens"] == N for _, _, u in together)
    assert all(n > 2 for _, n, _ in together)  # streamed in pieces, not in one block


def test_completions_and_models(server):
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "default-draft"
    a = _complete(server.url, "def add(a, b):")
    assert a == _complete(server.url, "def add(a, b):") and len(a) > 0


def test_a_disconnect_frees_its_slot(server):
    def running():
        return httpx.get(server.url + "/health").json()["running"]

    with httpx.Client() as c:
        r = c.send(c.build_request("POST", server.url + "/v1/completions", timeout=60,
                                   json={"prompt": "Count from 1 to 1000:", "max_tokens": 400, "ignore_eos": True,
                                         "temperature": 0, "stream": True}), stream=True)
        lines = r.iter_lines()  # kept alive: the connection stays open while we look
        for _ in range(6):
            next(lines)
        assert running() == 1
        r.close()  # the client goes away mid-stream
    deadline = time.time() + 30
    while running() and time.time() < deadline:
        time.sleep(0.2)
    assert running() == 0
    m = httpx.get(server.url + "/metrics").text
    assert 'finished_reason="abort"' in m


@pytest.mark.parametrize("body, param", [
    ('{"prompt": "hi", "max_tokens": 4', None),  # malformed JSON
    ('{"prompt": "hi", "model": "gpt-9"}', "model"),
    ('{"prompt": "hi", "max_tokens": 100000}', "max_tokens"),
    ('{"prompt": "hi", "temperature": -0.5}', "temperature"),
    ('{"prompt": "hi", "top_p": 0}', "top_p"),
    ('{"prompt": ""}', "prompt"),
    ('{"max_tokens": 4}', "prompt"),
    ('{"prompt": "hi", "max_tokens": "many"}', "max_tokens"),
    ('{"prompt": "hi", "n": 1000}', "n"),
    ('{"prompt": "hi", "max_tokens": -1}', "max_tokens"),
    ('{"prompt": "hi", "temperature": NaN}', "temperature"),
    ('{"prompt": "hi", "colour": "blue"}', "colour"),  # an unknown field
    (b'{"prompt": "caf\xe9 \xff"}', None),  # not UTF-8: the body is not JSON
    ('{"prompt": "' + "hello " * 100_000 + '"}', "prompt"),  # 100k tokens, beyond any context here
])
def test_bad_requests_get_openai_style_400s(server, body, param):
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


@pytest.mark.parametrize("messages", [[{"role": "wizard", "content": "x"}], "hi", {"role": "user"}, [],
                                      [{"role": "user", "content": "hello " * 100_000}]])
def test_bad_chat_messages_name_the_field(server, messages):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_overload_queues_or_answers_429_and_finishes_every_accepted_request(server):
    """4 slots and 4 queued: 64 at once means some get 429 with Retry-After; /health answers throughout;
    every accepted request finishes with the tokens it gives alone."""
    expected = _complete(server.url, PROMPTS[0])

    async def main():
        async with httpx.AsyncClient() as c:
            async def one():
                return await c.post(server.url + "/v1/completions", timeout=300,
                                    json={"prompt": PROMPTS[0], "max_tokens": N, "temperature": 0, "ignore_eos": True})

            tasks = [asyncio.create_task(one()) for _ in range(64)]
            health = []
            while not all(t.done() for t in tasks):
                health.append((await c.get(server.url + "/health", timeout=10)).status_code)
                await asyncio.sleep(0.2)
            return [t.result() for t in tasks], health

    res, health = asyncio.run(main())
    codes = sorted(r.status_code for r in res)
    assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 8
    assert all(r.headers.get("retry-after", "").isdigit() for r in res if r.status_code == 429)
    assert all(r.json()["choices"][0]["text"] == expected for r in res if r.status_code == 200)
    assert health and set(health) == {200}


def test_metrics_use_vllm_names_and_count_speculation(server):
    _complete(server.url, "a b c a b c a b c a b c a b c")
    m = httpx.get(server.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
                 "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_count"):
        assert name in m, name
    drafts = next(float(line.split()[-1]) for line in m.splitlines()
                  if line.startswith("vllm:spec_decode_num_draft_tokens_total"))
    assert drafts > 0
    # the default policy, adaptive, counts its steps by the draft length it chose; it drafted on this prompt
    steps = {line.split('gamma="')[1].split('"')[0]: float(line.split()[-1]) for line in m.splitlines()
             if line.startswith("scl:spec_decode_steps_total{") and 'policy="adaptive"' in line}
    assert set(steps) == {"0", "1", "2", "3"} and sum(n for g, n in steps.items() if g != "0") > 0
    # rounds that asked for drafts: at least vLLM's drafts (a lookup that found nothing is a round, not a draft)
    asked = _counter(m, "scl:spec_decode_asked_rounds_total")
    assert asked >= _counter(m, "vllm:spec_decode_num_drafts_total") > 0


def _counter(m: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in m.splitlines() if line.startswith(name + "{"))


def test_prefix_cache_on_by_default_reuses_a_prompt_and_counts_it(server):
    """serve's paged cache with prefix caching (the default): the second send of a 200-token prompt reuses its
    3 whole blocks (192 tokens, vLLM's prefix-cache counters), with the same text as the first."""
    prompt = "def add(a, b):\n    return a + b\n\n" * 20
    before = httpx.get(server.url + "/metrics").text
    first = _complete(server.url, prompt)
    mid = httpx.get(server.url + "/metrics").text
    second = _complete(server.url, prompt)
    after = httpx.get(server.url + "/metrics").text
    assert second == first
    q = "vllm:prefix_cache_queries_total"
    h = "vllm:prefix_cache_hits_total"
    n = _counter(mid, q) - _counter(before, q)
    assert n > 128 and _counter(after, q) - _counter(mid, q) == n  # the prompt's tokens, looked up each time
    assert _counter(after, h) - _counter(mid, h) == n // 64 * 64 - (64 if n % 64 == 0 else 0)
    assert "vllm:num_preemptions_total" in after and "vllm:kv_cache_usage_perc" in after
    lab = httpx.get(server.url + "/v1/models").json()["data"][0]["lab"]
    assert lab["kv"]["kv_cache"] == "paged" and lab["kv"]["prefix_caching"] is True
    # the step's token budget, chosen at start (issue 41): 4 slots verifying 3 drafts each, plus the prompt rows
    # that kept a step of 3 decoding sequences within 2.5 of its decode steps, as timed
    sb, st = lab["step_budget"], lab["settings"]
    assert st["step_factor"] == 2.5 and sb["factor"] == 2.5 and sb["decode_seqs"] == 3 and sb["decode_s"] > 0
    chunk = min(sb["prompt_rows"], 64)  # the server's --prefill-chunk, or the rows when fewer
    assert 1 <= sb["prompt_rows"] <= 128 and st["prefill_chunk"] == sb["prefill_chunk"] == chunk
    assert st["max_batched_tokens"] == sb["max_batched_tokens"] == 16 + chunk


def test_a_step_budget_too_small_is_refused_naming_both_numbers():
    """Before any weight loads: the numbers and the fix, exit 2."""
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--model", "default-draft", "--max-seqs", "8",
                          "--max-batched-tokens", "6", "--port", str(_free_port())], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    assert "max_batched_tokens 6 is smaller than a decode round of 8 sequences (gamma 0: 8 rows) plus one prefill " \
           "chunk of 64" in out.stderr and "raise max_batched_tokens to at least 72" in out.stderr, out.stderr[-800:]


def test_binds_loopback_and_logs_no_text_by_default(server):
    listening = {c.laddr.ip for c in psutil.Process(server.proc.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {"127.0.0.1"}
    _complete(server.url, "The secret word is xylophone. Repeat it:")
    time.sleep(0.5)
    log = server.log.read_text()
    assert "request cmpl-" in log and "xylophone" not in log
