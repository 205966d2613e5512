"""A server that fails loudly: the real app on 127.0.0.1 (uvicorn in a thread) over a tiny random qwen2.

Faults are injected through Batch.fault_injection, the engine's test hook (off by default): raising
for one sequence must end that request alone; raising before the forward kills the engine loop, and
then every request in flight gets an error, new ones and /health get 503, and the server shuts down.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from tests import families as F
from tests import serving

# Refuses two turns of one role in a row, as many real templates do.
TEMPLATE = ("{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] %}"
            "{{ raise_exception('conversation roles must alternate') }}{% endif %}"
            "<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant: {% endif %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from transformers import AutoTokenizer

    path = F.build("qwen2", tmp_path_factory.mktemp("failures") / "qwen2")
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return path


@pytest.fixture
def served(folder):
    """The app and engine loop for the tiny folder, with the CLI's stop-on-death wired (1.5 s grace)."""
    from engine.serve import cli

    with serving.served("--model", str(folder), "--precision", "fp32", "--max-seqs", "4", "--max-model-len", "256",
                        "--prefill-chunk", "64",
                        on_server=lambda loop, srv: cli.stop_when_engine_dies(loop, srv, 1.5)) as s:
        # The first step may build the CPU kernels (minutes on a busy machine): not what these tests time.
        httpx.post(s.url + "/v1/completions", json=_body(n=1), timeout=600).raise_for_status()
        yield s


def _body(n=40, **kw):
    return {"prompt": "the quick brown fox", "max_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


async def _stream(c, url, body, on_token=None):
    """Stream a completion; returns (text pieces, the error object or None, whether [DONE] came, usage)."""
    pieces, err, done, usage = [], None, False, None
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with c.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                err = ev["error"]
            elif ev.get("usage"):
                usage = ev["usage"]
            elif ev["choices"] and ev["choices"][0]["text"]:
                pieces.append(ev["choices"][0]["text"])
                if on_token is not None:
                    on_token()
    return pieces, err, done, usage


def test_one_failing_sequence_ends_alone(served):
    def fault(seq):  # the request with seed 13 fails after its third token: its sampling "raised"
        if seq is not None and seq.req.sampling.seed == 13 and len(seq.out) >= 3:
            raise RuntimeError("injected: this sequence's sampling failed")
    served.loop.scheduler.batch.fault_injection = fault

    async def main():
        async with httpx.AsyncClient() as c:
            return await asyncio.gather(_stream(c, served.url, _body(seed=13, temperature=1.0)),
                                        *(_stream(c, served.url, _body(prompt=f"import numpy as np # {i}"))
                                          for i in range(3)),
                                        c.post(served.url + "/v1/completions", json=_body(seed=13, temperature=1.0),
                                               timeout=60))
    bad, *good, bad_plain = asyncio.run(main())
    pieces, err, done, usage = bad
    assert err is not None and "this request failed in the engine" in err["message"] and "injected" in err["message"]
    assert err["type"] == "server_error" and done and usage is None and len(pieces) <= 3
    assert bad_plain.status_code == 500 and "injected" in bad_plain.json()["error"]["message"]
    for pieces, err, done, usage in good:  # the others ran to their full length
        assert err is None and done and pieces and usage["completion_tokens"] == 40
    served.loop.scheduler.batch.fault_injection = None
    assert httpx.get(served.url + "/health").status_code == 200
    r = httpx.post(served.url + "/v1/completions", json=_body(n=5), timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    assert served.loop.stats.finished.get("error") == 2


def test_a_dead_engine_fails_every_request_in_flight_and_answers_503(served):
    deaths = []
    on_death = served.loop.on_death
    served.loop.on_death = lambda e: (deaths.append(e), on_death(e))
    started = threading.Event()
    n_streams = 3

    async def main():
        async with httpx.AsyncClient() as c:
            counts = [0] * n_streams

            def seen(i):
                def f():
                    counts[i] += 1
                    if all(counts):
                        started.set()
                return f
            streams = [asyncio.create_task(_stream(c, served.url, _body(n=200, prompt=f"def f{i}():"), seen(i)))
                       for i in range(n_streams)]
            plain = asyncio.create_task(c.post(served.url + "/v1/completions", json=_body(n=200), timeout=60))
            while not started.is_set():
                await asyncio.sleep(0.01)

            def fault(seq):
                if seq is None:
                    raise RuntimeError("injected: the forward pass failed")
            served.loop.scheduler.batch.fault_injection = fault
            t0 = time.perf_counter()
            results = await asyncio.wait_for(asyncio.gather(*streams, plain), timeout=10)  # no request hangs
            return results, time.perf_counter() - t0
    (*streams, plain), waited = asyncio.run(main())
    # Heard at once, not at the end of their work: each stream ends with the error long before its 200 tokens
    # (the 10 s wait_for above is the hang guard; no wall-clock bound on 2 busy cores).
    print(f"in-flight requests heard that the engine died after {waited:.2f} s")
    for pieces, err, done, _ in streams:
        assert pieces and err is not None and done and len(pieces) < 100, len(pieces)
        assert "the engine stopped" in err["message"] and "injected: the forward pass failed" in err["message"]
    assert plain.status_code == 503 and "the engine stopped" in plain.json()["error"]["message"]
    h = httpx.get(served.url + "/health")
    assert h.status_code == 503 and "injected: the forward pass failed" in h.json()["error"]
    for path, body in (("/v1/completions", _body(n=5)), ("/v1/completions", _body(n=5, stream=True)),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})):
        r = httpx.post(served.url + path, json=body, timeout=10)
        assert r.status_code == 503 and "injected: the forward pass failed" in r.json()["error"]["message"]
    assert len(deaths) == 1
    served.thread.join(10)  # the CLI's policy: after the grace, the server shuts down (and the CLI exits 1)
    assert not served.thread.is_alive()


def test_a_chat_template_that_raises_is_a_400_naming_messages(served):
    bad = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    r = httpx.post(served.url + "/v1/chat/completions", json={"messages": bad, "max_tokens": 4}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "roles must alternate" in err["message"]
    ok = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
          {"role": "user", "content": "x"}]
    r = httpx.post(served.url + "/v1/chat/completions", json={"messages": ok, "max_tokens": 4, "ignore_eos": True},
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_tokenizing_runs_off_the_event_loop(served):
    """A slow chat template must not stall /health (nor any stream): it runs on a worker thread."""
    tok = served.loop.tokenizer
    real = tok.apply_chat_template

    template_done = []

    def slow(*a, **kw):
        time.sleep(1.5)
        template_done.append(time.perf_counter())
        return real(*a, **kw)
    tok.apply_chat_template = slow
    try:
        async def main():
            async with httpx.AsyncClient() as c:
                chat = asyncio.create_task(c.post(served.url + "/v1/chat/completions", timeout=30, json={
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True}))
                await asyncio.sleep(0.3)
                h = await c.get(served.url + "/health", timeout=5)
                return h, time.perf_counter(), await chat
        h, health_at, chat = asyncio.run(main())
    finally:
        del tok.apply_chat_template
    # Ordering, not a wall-clock bound: /health was answered while the template was still running.
    assert h.status_code == 200 and template_done and health_at < template_done[0], "/health waited for the template"
    assert chat.status_code == 200


def test_request_ids_are_unique_and_a_cancel_reaches_only_its_own_request(folder):
    from engine.common.setup import EngineSetup
    from engine.infer.batch import Request
    from engine.infer.loader import load_setup
    from engine.infer.scheduler import BatchSettings, Scheduler

    uids, addresses = set(), set()
    for _ in range(1000):  # CPython reuses the address of a freed object; the uid is never reused
        r = Request([1, 2, 3], 4)
        uids.add(r.uid)
        addresses.add(id(r))
        del r
    assert len(uids) == 1000 and len(addresses) < 1000

    target = load_setup(EngineSetup(model=str(folder), precision="fp32", device="cpu").validate()).target
    sched = Scheduler(target, BatchSettings(max_seqs=1, max_model_len=64, max_batched_tokens=65, prefill_chunk=64))
    first = Request([5, 6, 7], 3, stop_at_eos=False)
    twin_a, twin_b = Request([5, 6, 7], 3, stop_at_eos=False), Request([5, 6, 7], 3, stop_at_eos=False)
    for r in (first, twin_a, twin_b):
        sched.submit(r)
    assert sched.cancel(twin_b) is True  # still waiting: removed, and only it
    assert [r.uid for r in sched.waiting] == [first.uid, twin_a.uid]
    done = []
    while sched.has_work():
        done += sched.step()[1]
    assert {(s.req.uid, s.finish) for s in done} == {(first.uid, "length"), (twin_a.uid, "length")}
    later = Request([5, 6, 7], 3, stop_at_eos=False)
    assert sched.cancel(first) is False  # finished: a late cancel is a no-op, never aimed at a later request
    sched.submit(later)
    done = []
    while sched.has_work():
        done += sched.step()[1]
    assert [(s.req is later, s.finish, len(s.out)) for s in done] == [(True, "length", 3)]


def test_the_cli_exits_1_after_the_engine_dies(folder, monkeypatch):
    """`python -m engine serve`'s run(): after the grace it shuts the server down and returns 1."""
    from engine.serve import cli

    built, real_build = [], cli.build
    monkeypatch.setattr(cli, "build", lambda a: built.append(real_build(a)) or built[-1])
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    p = argparse.ArgumentParser()
    cli.add_parser(p.add_subparsers())
    a = p.parse_args(["serve", "--model", str(folder), "--precision", "fp32", "--max-seqs", "2",
                      "--max-model-len", "128", "--prefill-chunk", "64", "--port", str(number)])
    code = []
    thread = threading.Thread(target=lambda: code.append(cli.run(a)), daemon=True)
    thread.start()
    url, deadline = f"http://127.0.0.1:{number}", time.time() + 120
    while time.time() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    loop = built[0][0]

    def fault(seq):
        if seq is None:
            raise RuntimeError("injected: the device is gone")
    loop.scheduler.batch.fault_injection = fault
    r = httpx.post(url + "/v1/completions", json=_body(n=5), timeout=30)
    assert r.status_code == 503 and "the device is gone" in r.json()["error"]["message"]
    thread.join(15)
    assert not thread.is_alive() and code == [1]
