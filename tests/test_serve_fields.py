"""The request fields clients send, against the real server on 127.0.0.1 (the 0.5B at int4, an n-gram
draft so several tokens can land in one step): stop strings and stop token ids end the text where the
client asked, streaming or not, through httpx and the `openai` package; every field we do not honour is
refused by name (docs/SERVING.md has the table)."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.serving import served

PROMPT = "1, 2, 3, 4, 5,"
COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]


@pytest.fixture(scope="module")
def server():
    with served("--model", "default-draft", "--precision", "int4", "--draft", "ngram", "--gamma", "3",
                "--max-seqs", "2", "--max-model-len", "256", "--prefill-chunk", "64") as s:
        yield s


def _post(server, path, **body):
    return httpx.post(server.url + path, json={"model": server.model, "temperature": 0, **body}, timeout=120)


def _complete(server, **body):
    r = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=16, **body)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(server, path, **body):
    """(text, finish reason, usage, pieces) of a streamed answer."""
    pieces, finish, usage = [], None, None
    with httpx.stream("POST", server.url + path, timeout=120,
                      json={"model": server.model, "temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            usage = ev.get("usage") or usage
            for c in ev["choices"]:
                piece = c["text"] if "text" in c else c["delta"].get("content")
                if piece:
                    pieces.append(piece)
                finish = c["finish_reason"] or finish
    return "".join(pieces), finish, usage, pieces


@pytest.fixture(scope="module")
def counted(server):
    """The greedy continuation of PROMPT with no stop: it must pass ' 8' for the stop tests to mean anything."""
    full = _complete(server)
    text = full["choices"][0]["text"]
    assert " 8" in text, text
    return text, full["usage"]["completion_tokens"]


def _tokens_to(server, text: str, stop: str) -> int:
    """How many generated tokens it takes to complete the first `stop` in `text`."""
    ids = server.loop.tokenizer(text, add_special_tokens=False)["input_ids"]
    return next(k for k in range(1, len(ids) + 1) if stop in server.loop.tokenizer.decode(ids[:k]))


# -- stop and stop_token_ids: honoured

def test_completion_ends_before_the_stop_string_and_the_engine_stops_there(server, counted):
    full, n_full = counted
    r = _complete(server, stop=[" 8", "never"])
    c = r["choices"][0]
    assert c["text"] == full[:full.index(" 8")] and c["finish_reason"] == "stop"
    # the engine stopped at the token that completed " 8" (a speculative round's later tokens are dropped)
    assert r["usage"]["completion_tokens"] == _tokens_to(server, full, " 8") < n_full
    assert server.loop.gauges()["running"] == 0  # the slot is free


def test_streaming_holds_back_a_partial_stop_and_never_leaks_it(server, counted):
    full, _ = counted
    text, finish, usage, pieces = _stream(server, "/v1/completions", prompt=PROMPT, max_tokens=16, stop=" 8",
                                          stream_options={"include_usage": True})
    assert text == full[:full.index(" 8")] and finish == "stop"
    assert not text.endswith(" ")  # the " " of " 8" was held back, then dropped with the stop
    assert usage["completion_tokens"] == _tokens_to(server, full, " 8")


def test_continuous_usage_stats_counts_every_chunk_up_to_the_final_usage(server, counted):
    """vLLM's stream_options.continuous_usage_stats (GuideLLM sends it): the usage so far in every chunk,
    never past what the client gets (tokens a round committed past a stop are not counted)."""
    full, _ = counted
    seen = []
    with httpx.stream("POST", server.url + "/v1/completions", timeout=120, json={
            "model": server.model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stop": " 8", "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                seen.append(json.loads(line[6:]))
    counts = [ev["usage"]["completion_tokens"] for ev in seen]
    assert all("usage" in ev for ev in seen) and counts == sorted(counts)
    assert counts[-1] == _tokens_to(server, full, " 8") and seen[-1]["choices"] == []
    assert {ev["usage"]["prompt_tokens"] for ev in seen} == {seen[-1]["usage"]["prompt_tokens"]}
    bad = _post(server, "/v1/completions", prompt=PROMPT, stream=True,
                stream_options={"continuous_usage_stats": True})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream_options"


def test_stop_token_ids_end_the_text_without_the_token(server, counted):
    full, _ = counted
    eight = server.loop.tokenizer("8", add_special_tokens=False)["input_ids"]
    assert len(eight) == 1
    c = _complete(server, stop_token_ids=eight)["choices"][0]
    assert c["text"] == full[:full.index("8")] and c["finish_reason"] == "stop"


def test_chat_stop_with_the_openai_client_streaming_and_not(server):
    import openai  # a test dependency (pyproject test extra)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    ask = dict(model=server.model, messages=COUNT, max_tokens=24, temperature=0)
    free = client.chat.completions.create(**ask).choices[0].message.content
    assert "5" in free, free  # without a stop the answer passes 5
    got = client.chat.completions.create(**ask, stop=["5"]).choices[0]
    assert got.message.content == free[:free.index("5")] and got.finish_reason == "stop"
    chunks = list(client.chat.completions.create(**ask, stop=["5"], stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == got.message.content and "5" not in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    # completions through the client too
    c = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=16, temperature=0, stop=[" 8"])
    assert " 8" not in c.choices[0].text and c.choices[0].finish_reason == "stop"


def test_max_completion_tokens_is_max_tokens_for_chat(server):
    r = _post(server, "/v1/chat/completions", messages=COUNT, max_completion_tokens=3, ignore_eos=True)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_harmless_fields_and_off_values_are_accepted(server):
    r = _post(server, "/v1/chat/completions", messages=COUNT, max_tokens=2, user="u-1", metadata={"k": "v"},
              store=False, n=1, logprobs=False, top_logprobs=0, presence_penalty=0, frequency_penalty=0.0,
              logit_bias={}, response_format={"type": "text"}, tools=[], tool_choice="none")
    assert r.status_code == 200, r.text


# -- everything else: a 400 naming the field

@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 4', None),  # malformed JSON
    ("/v1/completions", '{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}', "stop"),
    ("/v1/completions", '{"prompt": "hi", "stop": ""}', "stop"),
    ("/v1/completions", '{"prompt": "hi", "stop": ["a", ""]}', "stop"),
    ("/v1/completions", '{"prompt": "hi", "stop": 7}', "stop"),
    ("/v1/completions", '{"prompt": "hi", "stop_token_ids": [-1]}', "stop_token_ids"),
    ("/v1/completions", '{"prompt": "hi", "frobnicate": 1}', "frobnicate"),
    ("/v1/completions", '{"prompt": "hi", "n": 1000}', "n"),
    ("/v1/completions", '{"prompt": "hi", "n": 0}', "n"),
    ("/v1/completions", '{"prompt": "hi", "temperature": NaN}', "temperature"),
    ("/v1/completions", '{"prompt": "hi", "logprobs": 21}', "logprobs"),
    ("/v1/completions", '{"prompt": "hi", "logprobs": true}', "logprobs"),
    ("/v1/completions", '{"prompt": "hi", "top_logprobs": 2}', "top_logprobs"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", '{"prompt": "hi", "n": 9}', "n"),
    ("/v1/completions", '{"prompt": "hi", "best_of": 2}', "best_of"),
    ("/v1/completions", '{"prompt": "hi", "logit_bias": {"15": -101}}', "logit_bias"),
    ("/v1/completions", '{"prompt": "hi", "presence_penalty": 2.5}', "presence_penalty"),
    ("/v1/completions", '{"prompt": "hi", "frequency_penalty": NaN}', "frequency_penalty"),
    ("/v1/completions", '{"prompt": "hi", "repetition_penalty": 0}', "repetition_penalty"),
    ("/v1/completions", '{"prompt": "hi", "max_completion_tokens": 4}', "max_completion_tokens"),
    ("/v1/completions", '{"prompt": "hi", "stream_options": {"include_usage": true}}', "stream_options"),
    ("/v1/completions", '{"prompt": "hi", "seed": 1e30}', "seed"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "tools": '
                             '[{"type": "function", "function": {"name": "f"}}]}', "tools"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], '
                             '"response_format": {"type": "json_object"}}', "response_format"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}',
     "functions"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, '
                             '"top_logprobs": 21}', "top_logprobs"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}',
     "top_logprobs"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "logprobs": 2}', "logprobs"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "echo": true}', "echo"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, '
                             '"max_completion_tokens": 5}', "max_completion_tokens"),
    ("/v1/chat/completions", '{"messages": "hi"}', "messages"),
    ("/v1/chat/completions", '{"prompt": "hi"}', "prompt"),
])
def test_what_we_do_not_honour_is_a_400_naming_the_field(server, path, body, param):
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    if param is not None:
        assert param in err["message"]


def test_not_implemented_yet_says_so(server, monkeypatch):
    """The NOT_YET table's refusal (empty once every field is built; a stand-in entry shows it)."""
    from engine.serve import protocol as P

    monkeypatch.setitem(P.NOT_YET, "frobnicate", (lambda v: v is None or v == 0, "frobnication", "0"))
    assert _post(server, "/v1/completions", prompt="hi", max_tokens=1, frobnicate=0).status_code == 200
    r = _post(server, "/v1/completions", prompt="hi", frobnicate=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate"
    assert "not implemented yet" in r.json()["error"]["message"] and "send 0" in r.json()["error"]["message"]


def test_the_openai_client_gets_bad_request_errors_naming_the_field(server):
    import openai  # a test dependency (pyproject test extra)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.model, prompt="hi", max_tokens=2, extra_body={"frobnicate": True})
    assert e.value.body["param"] == "frobnicate" and "frobnicate" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model, messages=COUNT, max_tokens=2, tools=[
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}])
    assert e.value.body["param"] == "tools"


def test_stop_text_releases_all_before_the_first_stop_and_nothing_after(server):
    """The engine's matcher on its own, over text where stops straddle tokens and characters span several."""
    from engine.infer.batch import StopText
    from engine.infer.tokens import StreamDecoder

    tok = server.loop.tokenizer
    text = "def f(x):\n    return x + 1\n\nprint(f(2))  # 中文 ok"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for stops in [("\n\n",), ("print", "return"), ("中文",), ("+ 1\n",), ("absent",), ("xx", "x)"), ("ok",)]:
        st, out = StopText(StreamDecoder(tok), stops), []
        for t in ids:
            out.append(st.push(t))
            if st.stopped:
                break
        out.append(st.flush())
        hits = [text.find(s) for s in stops if s in text]
        assert "".join(out) == (text[:min(hits)] if hits else text), stops
        assert st.stopped == bool(hits)


def test_a_step_that_commits_tokens_past_the_stop_drops_them(server):
    """A speculative round can commit several tokens in one step: the ones after the stop are not the
    client's (not streamed, not counted); min_tokens holds the stop off."""
    from engine.infer.batch import Request, Sequence, StopText, stream
    from engine.infer.tokens import StreamDecoder

    tok = server.loop.tokenizer
    ids = tok(" 6, 7, 8, 9, 10", add_special_tokens=False)["input_ids"]
    upto = _tokens_to(server, " 6, 7, 8, 9, 10", " 8")
    assert upto < len(ids)
    for min_tokens, want_text, want_ids in [(0, " 6, 7,", ids[:upto]), (len(ids), " 6, 7, 8, 9, 10", ids)]:
        pieces = []
        req = Request([1, 2], 32, stop=(" 8",), min_tokens=min_tokens,
                      on_token=lambda s, t, piece, origin, pieces=pieces: pieces.append(piece))
        seq = Sequence(req=req, slot=0, vocab=len(tok), tokens=[1, 2, *ids], n_prompt=2, out=list(ids),
                       trace=["accepted"] * len(ids), token_times=[0.0] * len(ids),
                       pending=[(t, "accepted") for t in ids], stream=StopText(StreamDecoder(tok), req.stop))
        stream(seq)
        assert "".join(pieces) + seq.stream.flush() == want_text
        assert seq.out == want_ids and seq.tokens == [1, 2, *want_ids] and len(pieces) == len(want_ids)
        assert seq.finish == ("stop" if min_tokens == 0 else None) and not seq.pending


def _counter(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_per_request_speculative_stats_are_vllms_and_add_up_to_the_servers(server, monkeypatch):
    """--per-request-spec-decode-metrics summary (vLLM's): each response carries its own rounds, drafts and
    acceptance histogram, equal to what the server's counters grew by; streamed, on the last chunk."""
    monkeypatch.setattr(server.loop, "per_request_spec", "summary")  # what the CLI flag sets
    drafts0 = _counter(server, "vllm:spec_decode_num_draft_tokens_total")
    rounds0 = _counter(server, "vllm:spec_decode_num_drafts_total")
    r = _post(server, "/v1/completions", prompt="a b c d a b c d a b c d a b c d a b", max_tokens=24)
    assert r.status_code == 200, r.text
    m = r.json()["metrics"]["speculative_decoding"]
    assert m["policy"] == "adaptive" and m["num_spec_tokens"] == 3 and len(m["acceptance_histogram"]) == 4
    assert m["num_draft_tokens"] == _counter(server, "vllm:spec_decode_num_draft_tokens_total") - drafts0 > 0
    assert m["num_spec_steps"] == _counter(server, "vllm:spec_decode_num_drafts_total") - rounds0
    assert sum(m["acceptance_histogram"]) == m["num_spec_steps"]
    assert sum(j * n for j, n in enumerate(m["acceptance_histogram"])) == m["num_accepted_draft_tokens"]
    assert m["mean_acceptance_length"] == pytest.approx(1 + m["num_accepted_draft_tokens"] / m["num_spec_steps"])
    last = None
    with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                      json={"model": server.model, "prompt": "a b c d a b c d a b", "max_tokens": 12,
                            "temperature": 0, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
    assert last["choices"] == [] and "usage" not in last and last["metrics"]["speculative_decoding"]["policy"]


def test_speculative_stats_from_a_server_not_speculating_are_zeros_naming_the_policy():
    from engine.serve.protocol import spec_metrics

    m = spec_metrics([{"prompt_tokens": 3, "completion_tokens": 5}], "off", 0)
    assert m == {"mean_acceptance_length": 0.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [0],
                 "num_spec_steps": 0, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0, "num_spec_tokens": 0,
                 "policy": "off"}
