"""presence_penalty, frequency_penalty, repetition_penalty and logit_bias: the adjustment against the
definitions, speculation staying lossless with them on the real 0.5B, and the server honouring them
(and refusing bad values by name) through the openai client."""
from __future__ import annotations

import httpx
import pytest
import torch

from engine.common.errors import UserError
from engine.infer import batch as batch_mod
from engine.infer.batch import Batch, Request
from engine.infer.generate import generate
from engine.infer.sampling import SamplingParams, penalize, probs_from_logits
from engine.infer.scheduler import BatchSettings, Scheduler
from engine.infer.speculative import generate_speculative, proposer_spec
from tests.test_serve_fields import server  # noqa: F401  (the real server on 127.0.0.1, module-scoped)

PENALTIES = dict(presence_penalty=0.4, frequency_penalty=0.6, repetition_penalty=1.3)


# ---------------------------------------------------------------- the formula

def _reference(logits, sp, tokens, n_prompt, drafts):
    """Row by row, token by token, from the definitions in penalize's docstring."""
    out = torch.empty_like(logits)
    bias = dict(sp.logit_bias)
    for j in range(logits.shape[0]):
        output = list(tokens[n_prompt:]) + list(drafts[:j])
        for t in range(logits.shape[1]):
            x = float(logits[j, t]) + bias.get(t, 0.0)
            if t in tokens[:n_prompt] or t in output:
                x = x / sp.repetition_penalty if x > 0 else x * sp.repetition_penalty
            x -= sp.frequency_penalty * output.count(t)
            x -= sp.presence_penalty * (t in output)
            out[j, t] = x
    return out


@pytest.mark.parametrize("seed", range(6))
def test_penalize_matches_the_definitions(seed):
    g = torch.Generator().manual_seed(seed)
    v, rows = 13, 4
    logits = torch.randn(rows, v, generator=g) * 3
    tokens = torch.randint(0, v, (9,), generator=g).tolist()
    n_prompt = 4
    drafts = torch.randint(0, v, (rows - 1,), generator=g).tolist()
    sp = SamplingParams(temperature=0.7, presence_penalty=0.5 - seed / 5, frequency_penalty=1.5 - seed / 3,
                        repetition_penalty=(0.5, 1.7, 3.0)[seed % 3],
                        logit_bias=((1, -100.0), (5, 2.5)) if seed % 2 else ()).validate()
    got = penalize(logits, sp, tokens, n_prompt, drafts)
    torch.testing.assert_close(got, _reference(logits, sp, tokens, n_prompt, drafts), rtol=0, atol=1e-5)
    seen = set(tokens) | set(drafts)
    assert any(logits[j, t] < 0 for j in range(rows) for t in seen)  # the negative-logit case is exercised
    assert any(logits[j, t] > 0 for j in range(rows) for t in seen)
    assert not torch.equal(got, logits)


def test_each_part_on_its_own():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    tokens, n_prompt = [0, 1, 2, 2], 2  # prompt [0, 1], output [2, 2]
    rep = penalize(logits, SamplingParams(repetition_penalty=2.0), tokens, n_prompt)
    assert rep.tolist() == [[1.0, -4.0, 0.5, 0.5]]  # positive divided, negative multiplied; prompt counts
    freq = penalize(logits, SamplingParams(frequency_penalty=0.5), tokens, n_prompt)
    assert freq.tolist() == [[2.0, -2.0, 0.0, 0.5]]  # output only: 2 occurrences of token 2
    pres = penalize(logits, SamplingParams(presence_penalty=0.5), tokens, n_prompt)
    assert pres.tolist() == [[2.0, -2.0, 0.5, 0.5]]
    bias = penalize(logits, SamplingParams(logit_bias=((3, 10.0),)), tokens, n_prompt)
    assert bias.tolist() == [[2.0, -2.0, 1.0, 10.5]]
    # order: bias before the repetition penalty (vLLM's): token 3 is not seen, token 2 is
    both = penalize(logits, SamplingParams(repetition_penalty=2.0, logit_bias=((2, -3.0),)), tokens, n_prompt)
    assert both.tolist() == [[1.0, -4.0, -4.0, 0.5]]


def test_all_off_is_todays_path():
    logits = torch.randn(3, 7)
    assert penalize(logits, SamplingParams(temperature=0.5, top_k=3, seed=1), [1, 2, 3], 2, [4, 5]) is logits
    assert SamplingParams(0.7, 5, 0.9, 3).to_dict() == {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 3}
    on = SamplingParams(frequency_penalty=0.5, logit_bias=((7, -1.0),)).to_dict()
    assert on["frequency_penalty"] == 0.5 and on["logit_bias"] == {"7": -1.0} and "presence_penalty" not in on


@pytest.mark.parametrize("bad", [dict(presence_penalty=2.5), dict(frequency_penalty=float("nan")),
                                 dict(repetition_penalty=0.0), dict(repetition_penalty=11.0),
                                 dict(logit_bias=((1, 101.0),)), dict(logit_bias=((-1, 1.0),)),
                                 dict(logit_bias=((1, 1.0), (1, 2.0)))])
def test_validate_refuses_out_of_range(bad):
    name = next(iter(bad))
    with pytest.raises(UserError, match=name):
        SamplingParams(**bad).validate()


# ---------------------------------------------------------------- speculation stays lossless

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "List the numbers from 1 to 20, separated by commas."]


@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_greedy_with_penalties_is_identical_with_and_without_speculation(small_int4, small_int8, kind):
    """int4 rows are batch-invariant, so the greedy tokens must match exactly; the penalties must change them."""
    lm = small_int4
    plain = generate(lm, PROMPTS, 32, stop_at_eos=False).new_tokens
    firsts = [p[0] for p in plain]
    sp = SamplingParams(**PENALTIES, logit_bias=tuple((t, -100.0) for t in sorted(set(firsts))))
    ref = generate(lm, PROMPTS, 32, sp, stop_at_eos=False).new_tokens
    assert all(r != p for r, p in zip(ref, plain))
    assert all(r[0] not in firsts for r in ref)  # the biased first tokens are gone
    draft = small_int8 if kind == "self" else None
    out = generate_speculative(lm, proposer_spec(kind, draft, lm), PROMPTS, 32, gamma=4, sampling=sp,
                               stop_at_eos=False)
    assert out.new_tokens == ref
    assert out.spec["accepted"] > 0  # drafts were accepted, so rows after drafts were adjusted and used


def test_verify_rows_are_the_non_speculative_distributions(small_fp32, monkeypatch):
    """Sampled: every row the verifier gets is the target's own distribution at that position, with the
    drafts before it counted as output (computed here from scratch, one position at a time)."""
    lm = small_fp32
    sp = SamplingParams(temperature=0.8, seed=3, **PENALTIES,
                        logit_bias=((16, 3.0), (11, -2.0)))
    rounds, snap = [], {}
    orig_commit, orig_verify = Batch._verify_and_commit, batch_mod.verify

    def commit(self, s, logits, d, q, st, *rest):
        snap["tokens"], snap["n_prompt"], snap["d"] = list(s.tokens), s.n_prompt, list(d)
        return orig_commit(self, s, logits, d, q, st, *rest)

    def verify(p, q, d, sp_, gen):
        rounds.append((snap["tokens"], snap["n_prompt"], snap["d"], p[0].clone()))
        return orig_verify(p, q, d, sp_, gen)

    monkeypatch.setattr(Batch, "_verify_and_commit", commit)
    monkeypatch.setattr(batch_mod, "verify", verify)
    ids = lm.tokenizer("1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,")["input_ids"]
    sched = Scheduler(lm, BatchSettings(max_seqs=1, max_model_len=128, max_batched_tokens=68, prefill_chunk=64),
                      proposer_spec("ngram", None, lm), 3)
    sched.submit(Request(list(ids), 16, sp, stop_at_eos=False))
    while sched.has_work():
        sched.step()
    assert rounds and any(len(d) >= 2 for _, _, d, _ in rounds)
    m = lm.model
    for tokens, n_prompt, d, p in rounds:
        for j in range(len(d) + 1):
            ctx = tokens + d[:j]
            with torch.inference_mode():
                last = m(torch.tensor([ctx]), 0, m.new_cache(1, len(ctx)))[:, -1]
            want = probs_from_logits(penalize(last, sp, ctx, n_prompt), sp)[0]
            torch.testing.assert_close(p[j], want, rtol=0, atol=2e-4)


# ---------------------------------------------------------------- the server

REPEAT = "the cat the cat the cat the cat the cat the cat the cat the cat"


def _client(server):  # noqa: F811
    import openai  # a test dependency (pyproject test extra)
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _first_token(server, text):  # noqa: F811
    tok = server.loop.tokenizer
    first = tok(text, add_special_tokens=False)["input_ids"][0]
    assert text.startswith(tok.decode([first]))
    return first


def test_logit_bias_removes_the_greedy_first_token(server):  # noqa: F811
    c = _client(server)
    ask = dict(model=server.model, prompt="1, 2, 3, 4, 5,", max_tokens=6, temperature=0)
    free = c.completions.create(**ask).choices[0].text
    first = _first_token(server, free)
    biased = c.completions.create(**ask, logit_bias={str(first): -100}).choices[0].text
    assert biased != free and _first_token(server, biased) != first
    # chat, streaming: the same through the chat template and SSE
    chat = dict(model=server.model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=6, temperature=0)
    free = c.chat.completions.create(**chat).choices[0].message.content
    first = _first_token(server, free)
    chunks = c.chat.completions.create(**chat, logit_bias={str(first): -100}, stream=True)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text and _first_token(server, text) != first


def _repeats(server, text):  # noqa: F811
    ids = server.loop.tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(ids) - len(set(ids))


def test_frequency_penalty_reduces_repeats(server):  # noqa: F811
    c = _client(server)
    ask = dict(model=server.model, prompt=REPEAT, max_tokens=32, temperature=0, extra_body={"ignore_eos": True})
    free = c.completions.create(**ask).choices[0].text
    pen = c.completions.create(**ask, frequency_penalty=2).choices[0].text
    assert _repeats(server, free) > _repeats(server, pen), (free, pen)
    # streamed, sampled, with the n-gram draft: the same request runs to its length
    ask.update(temperature=0.8, extra_body={"ignore_eos": True, "repetition_penalty": 1.2})
    chunks = list(c.completions.create(**ask, seed=1, frequency_penalty=2, presence_penalty=1, stream=True,
                                       stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 32


@pytest.mark.parametrize("field, value", [
    ("presence_penalty", 2.5), ("presence_penalty", -3), ("frequency_penalty", 2.01),
    ("repetition_penalty", 0), ("repetition_penalty", -1), ("repetition_penalty", 11),
    ("logit_bias", {"abc": 1}), ("logit_bias", {"-1": 1}), ("logit_bias", {"15": 101}),
    ("logit_bias", {"15": "high"}), ("logit_bias", {"999999999": 1}), ("logit_bias", {"7": 1, "07": 2}),
    ("logit_bias", {str(i): 1 for i in range(301)}), ("logit_bias", [15]),
])
def test_bad_values_are_a_400_naming_the_field(server, field, value):  # noqa: F811
    import openai
    c = _client(server)
    extra = {field: value} if field == "repetition_penalty" else {}
    kw = {} if extra else {field: value}
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=server.model, prompt="hi", max_tokens=2, extra_body=extra, **kw)
    assert e.value.body["param"] == field and field in e.value.message


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty", "repetition_penalty"])
def test_nan_is_a_400_naming_the_field(server, field):  # noqa: F811
    r = httpx.post(server.url + "/v1/chat/completions", content='{"messages": [{"role": "user", "content": "hi"}], '
                   f'"{field}": NaN}}', headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == field
