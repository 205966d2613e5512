"""logprobs, top_logprobs, echo (lm-evaluation-harness's loglikelihood call) and n, against the real
server on 127.0.0.1: the 0.5B at fp32, so the values can be checked against transformers' own forward
pass of the same checkpoint; a second server with an n-gram draft shows speculation changes nothing."""
from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serving import served

PROMPT = "1, 2, 3, 4, 5,"
CODE = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
        "def mul(a, b):\n    return a * b\n\n\n"
        "def div(a, b):\n    return")
OPEN = "Here is a list of my favourite words:"
COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
TOL = 1e-4  # fp32 against fp32: the engine's kernels and transformers' round differently by ~1e-6


def _serve(*extra: str):
    return served("--model", "default-draft", "--precision", "fp32", "--max-seqs", "4", "--max-model-len", "256",
                  "--prefill-chunk", "16", "--kv-cache", "slots", *extra)
# The slot cache: with the paged one an n-choice follower's fp32 prompt logprobs differ from a lone request's
# by ~5e-7 (the PyTorch path's rows; open since the paged KV cache landed), where this module checks them equal.


@pytest.fixture(scope="module")
def server():
    with _serve() as s:
        yield s


@pytest.fixture(scope="module")
def spec_server():
    with _serve("--draft", "ngram", "--gamma", "3") as s:
        yield s


@pytest.fixture(scope="module")
def reference():
    """ids -> log_softmax of transformers' logits [len(ids), V] for the same checkpoint at fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.infer import catalog

    model = AutoModelForCausalLM.from_pretrained(catalog.resolve("default-draft"), dtype=torch.float32).eval()

    def lp(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return lp


def _post(server, path, **body):
    r = httpx.post(server.url + path, json={"model": server.model, "temperature": 0, **body}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def _ids(server, text: str) -> list[int]:
    return list(server.loop.tokenizer(text)["input_ids"])


def _greedy(reference, ids: list[int], k: int) -> list[int]:
    out = list(ids)
    for _ in range(k):
        out.append(int(reference(out)[-1].argmax()))
    return out[len(ids):]


def test_completion_logprobs_are_the_models_own_log_softmax(server, reference):
    r = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=8, logprobs=2, ignore_eos=True)
    c = r["choices"][0]
    lp, text = c["logprobs"], c["text"]
    ids = _ids(server, PROMPT)
    out = _greedy(reference, ids, 8)
    assert text == server.loop.tokenizer.decode(out)  # the same greedy tokens as transformers
    ref = reference(ids + out)
    want = [float(ref[len(ids) - 1 + i, t]) for i, t in enumerate(out)]
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == r["usage"]["completion_tokens"] == 8
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"], want)) < TOL
    for i, (tok, top) in enumerate(zip(lp["tokens"], lp["top_logprobs"])):
        vals = list(top.values())
        assert len(top) == 2 and vals == sorted(vals, reverse=True)  # greedy: the chosen token is one of the top 2
        assert top[tok] == lp["token_logprobs"][i] == max(vals)  # and it is the top one
        best2 = ref[len(ids) - 1 + i].topk(2).values.tolist()
        assert max(abs(a - b) for a, b in zip(vals, best2)) < TOL
    assert "".join(lp["tokens"]) == text  # plain ASCII: each token's text, in order, is the text
    offs = lp["text_offset"]
    assert offs[0] == 0 and offs == sorted(offs) and all(text[o:].startswith(t) for o, t in zip(offs, lp["tokens"]))
    # the reported distribution is the model's, whatever the sampling settings: the first token's top 2
    # at temperature 0.8 and top_k 5 are those of the greedy request
    hot = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=1, logprobs=2, temperature=0.8, top_k=5, seed=3)
    first = dict(hot["choices"][0]["logprobs"]["top_logprobs"][0])
    assert first.keys() >= lp["top_logprobs"][0].keys()
    assert all(abs(first[k] - v) < 1e-6 for k, v in lp["top_logprobs"][0].items())


@pytest.mark.parametrize("as_batch", [False, True])
def test_echo_with_max_tokens_0_is_the_prompts_loglikelihood(server, reference, as_batch):
    """lm-evaluation-harness's local-completions body; the prompt (token ids) spans three prefill chunks."""
    ids = _ids(server, CODE)
    assert len(ids) > 2 * 16
    r = _post(server, "/v1/completions", prompt=[ids] if as_batch else ids, max_tokens=0, echo=True, logprobs=1)
    c = r["choices"][0]
    assert c["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 0
    assert c["text"] == server.loop.tokenizer.decode(ids)
    lp = c["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = reference(ids)
    want = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:], want)) < TOL
    assert abs(sum(lp["token_logprobs"][1:]) - sum(want)) < len(ids) * TOL  # the loglikelihood
    for i in range(1, len(ids)):  # is_greedy as the harness reads it: the top entry against the token's
        greedy = int(ref[i - 1].argmax()) == ids[i]
        assert (lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values())) == greedy
    # the newer harness sends max_tokens 1 and drops the last entry: the same prompt values
    one = _post(server, "/v1/completions", prompt=ids, max_tokens=1, echo=True, logprobs=1)["choices"][0]["logprobs"]
    assert len(one["token_logprobs"]) == len(ids) + 1
    assert max(abs(a - b) for a, b in zip(one["token_logprobs"][1:len(ids)], want)) < TOL
    assert one["text_offset"][:len(ids)] == lp["text_offset"]


def test_echo_streams_the_prompt_first_and_keeps_text_and_logprobs_together(server):
    text, entries, usage = "", [], None
    with httpx.stream("POST", server.url + "/v1/completions", timeout=600, json={
            "model": server.model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "echo": True, "logprobs": 1,
            "stop": " 8", "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            usage = ev.get("usage") or usage
            for c in ev["choices"]:
                if not text:
                    assert c["text"] == PROMPT  # the echoed prompt comes first, with its logprobs
                text += c["text"]
                if c["logprobs"]:
                    assert all(o <= len(text) for o in c["logprobs"]["text_offset"])
                    entries += c["logprobs"]["token_logprobs"]
    full = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=16, echo=True, logprobs=1, stop=" 8")
    assert text == full["choices"][0]["text"] and text.startswith(PROMPT) and " 8" not in text
    # every prompt token and every counted completion token has its entry, and nothing after the stop
    assert len(entries) == len(_ids(server, PROMPT)) + usage["completion_tokens"]
    assert entries == full["choices"][0]["logprobs"]["token_logprobs"]


def test_chat_logprobs_with_the_openai_client_streaming_and_not(server):
    import openai  # a test dependency (pyproject test extra)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    ask = dict(model=server.model, messages=COUNT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    got = client.chat.completions.create(**ask).choices[0]
    content = got.logprobs.content
    assert len(content) == 8 and "".join(t.token for t in content) == got.message.content
    for t in content:
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == t.logprob >= t.top_logprobs[1].logprob
        assert bytes(t.bytes).decode() == t.token
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == got.message.content


def test_speculation_changes_no_logprob(server, spec_server):
    ask = dict(prompt=CODE, max_tokens=24, logprobs=3, ignore_eos=True)
    before = spec_server.loop.stats.num_accepted_tokens
    plain = _post(server, "/v1/completions", **ask)["choices"][0]
    spec = _post(spec_server, "/v1/completions", **ask)["choices"][0]
    assert spec_server.loop.stats.num_accepted_tokens > before  # drafts were accepted in verify passes
    assert spec["text"] == plain["text"] and spec["logprobs"]["tokens"] == plain["logprobs"]["tokens"]
    a, b = plain["logprobs"], spec["logprobs"]
    assert max(abs(x - y) for x, y in zip(a["token_logprobs"], b["token_logprobs"])) < TOL
    for x, y in zip(a["top_logprobs"], b["top_logprobs"]):
        assert x.keys() == y.keys() and all(abs(x[k] - y[k]) < TOL for k in x)


def test_n_choices_sample_with_seed_plus_index_whatever_shares_the_batch(server):
    ask = dict(prompt=OPEN, max_tokens=6, temperature=1.0, seed=11, ignore_eos=True)
    r = _post(server, "/v1/completions", n=2, **ask)
    texts = [c["text"] for c in r["choices"]]
    assert [c["index"] for c in r["choices"]] == [0, 1] and texts[0] != texts[1]
    assert r["usage"]["completion_tokens"] == 12 and r["usage"]["prompt_tokens"] == len(_ids(server, OPEN))
    # choice i is the n=1 request with seed + i, and the same again while other requests share the steps
    with ThreadPoolExecutor(4) as pool:
        busy = [pool.submit(_post, server, "/v1/completions", prompt=f"Write a function number {i}", max_tokens=12,
                            temperature=0.8) for i in range(2)]
        again = pool.submit(_post, server, "/v1/completions", n=2, **ask)
        alone = [_post(server, "/v1/completions", **{**ask, "seed": 11 + i})["choices"][0]["text"] for i in range(2)]
        assert [c["text"] for c in again.result()["choices"]] == texts == alone
        [b.result() for b in busy]
    greedy = _post(server, "/v1/chat/completions", messages=COUNT, max_tokens=4, n=3)
    assert len({c["message"]["content"] for c in greedy["choices"]}) == 1 and len(greedy["choices"]) == 3


def test_n_streams_interleave_with_their_index(server):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    chunks = list(client.completions.create(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0.8,
                                            seed=11, n=2, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
    full = client.completions.create(model=server.model, prompt=PROMPT, max_tokens=5, temperature=0.8, seed=11, n=2,
                                     extra_body={"ignore_eos": True})
    assert [texts[0], texts[1]] == [c.text for c in full.choices]
    assert chunks[-1].usage.completion_tokens == 10


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "n": 1000}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 3}, "best_of"),
    ("/v1/chat/completions", {"messages": COUNT, "echo": True}, "echo"),
    ("/v1/chat/completions", {"messages": COUNT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_out_of_range_is_a_400_naming_the_field(server, path, body, param):
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and param in r.json()["error"]["message"]


def test_best_of_equal_to_n_is_accepted(server):
    r = _post(server, "/v1/completions", prompt=PROMPT, max_tokens=2, n=2, best_of=2)
    assert len(r["choices"]) == 2 and not math.isnan(r["usage"]["completion_tokens"])


PLANETS = "🪐" * 6  # one character, three byte-level tokens each (two of them partial UTF-8)
OMEGAS = "ꙮ" * 3  # two tokens each; the 0.5B copies it in chat (it answers 🪐 with 🎉, a single token)


def _events(server, path: str, **body):
    with httpx.stream("POST", server.url + path, timeout=600, json={
            "model": server.model, "temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def test_streamed_logprobs_across_a_multi_byte_character(server):
    ask = dict(prompt=PLANETS, max_tokens=9, logprobs=2, ignore_eos=True)
    text, entries, names = "", [], []
    for ev in _events(server, "/v1/completions", **ask):
        for c in ev["choices"]:
            assert "\ufffd" not in c["text"]  # a chunk never carries half a character
            text += c["text"]
            if c["logprobs"]:
                assert all(o <= len(text) for o in c["logprobs"]["text_offset"])
                entries += c["logprobs"]["token_logprobs"]
                names += c["logprobs"]["tokens"]
    full = _post(server, "/v1/completions", **ask)["choices"][0]
    assert "🪐" in text and text == full["text"]
    assert entries == full["logprobs"]["token_logprobs"] and names == full["logprobs"]["tokens"]
    assert any("\ufffd" in n for n in names)  # the test did split a character across tokens

    chat = dict(messages=[{"role": "user", "content": f"Copy this line: {OMEGAS}"}], max_tokens=12,
                logprobs=True, top_logprobs=2)
    content, raw = "", b""
    special = set(server.loop.tokenizer.all_special_tokens)  # the end token has an entry (as vLLM's), not text
    for ev in _events(server, "/v1/chat/completions", **chat):
        for c in ev["choices"]:
            content += c["delta"].get("content") or ""
            for t in (c.get("logprobs") or {}).get("content") or []:
                raw += b"" if t["token"] in special else bytes(t["bytes"])
                assert len(raw.decode("utf-8", errors="ignore")) <= len(content)  # no entry ahead of its text
    whole = _post(server, "/v1/chat/completions", **chat)["choices"][0]
    assert content == whole["message"]["content"] and raw.decode("utf-8") == content and "ꙮ" in content
    assert any("\ufffd" in t["token"] for t in whole["logprobs"]["content"])  # a character was split


def test_n_choices_share_the_prompt_and_its_logprobs(server):
    """Choice 1 copies choice 0's prompt K/V (all chunks of 16 but the last) and its prompt logprobs."""
    before = server.loop.scheduler.shared_prompt_tokens
    r = _post(server, "/v1/completions", prompt=CODE, max_tokens=3, echo=True, logprobs=1, n=2)
    a, b = (c["logprobs"] for c in r["choices"])
    n = len(_ids(server, CODE))
    assert a["token_logprobs"][:n] == b["token_logprobs"][:n] and a["text_offset"] == b["text_offset"]
    c = server.loop.scheduler.settings.prefill_chunk  # 16, or fewer where the step budget sized it down
    assert server.loop.scheduler.shared_prompt_tokens - before == (n - 1) // c * c > 0
    one = _post(server, "/v1/completions", prompt=CODE, max_tokens=3, echo=True, logprobs=1)["choices"][0]
    assert one["logprobs"]["token_logprobs"] == a["token_logprobs"] == b["token_logprobs"]  # greedy
