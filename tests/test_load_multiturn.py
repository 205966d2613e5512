"""The multi-turn workload (multiturn:N[:TURNS]): its selection, its requests, and a load point that replays
conversations turn by turn at concurrency 2, against a stub that records what it received and against our
own server on 127.0.0.1."""
from __future__ import annotations

import json

import pytest

from engine.common.errors import UserError
from engine.load import client
from engine.load.requests import cycle, fresh, from_conversations, load_tokenizer
from engine.load.run import LoadConfig, prepare, run, run_point
from engine.measure import conversations, workloads
from tests.test_load import Stub, _serve, stub  # noqa: F401  (stub: the stub server fixture)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("default-draft")


def _is_prefix(short: list, long: list) -> bool:
    return long[:len(short)] == short


# ---------------------------------------------------------------- the selection and the requests

def test_selection_is_deterministic_and_capped():
    a, b = conversations.load("multiturn:5:3"), conversations.load("multiturn:5:3")
    assert [c.id for c in a] == [c.id for c in b] and len({c.id for c in a}) == 5
    assert [c.id for c in conversations.load("multiturn:3:3")] == [c.id for c in a[:3]]  # a prefix of the order
    assert conversations.parse("multiturn") == (conversations.DEFAULT_COUNT, conversations.DEFAULT_TURNS)
    assert conversations.canonical(" MultiTurn:5 ") == "multiturn:5:4"
    raw = workloads.sharegpt()
    for c in a:
        assert len(c.exchanges) == 3  # the cap: longer conversations replay their first three exchanges only
        assert len(raw[c.id.removeprefix("sharegpt:")]["conversations"]) >= 6
        m = [c.messages(k) for k in range(3)]
        assert [x["role"] for x in m[2]] == ["user", "assistant", "user", "assistant", "user"]
        assert m[1][1]["content"] == c.exchanges[0].assistant  # the recorded answer is replayed
        assert _is_prefix(m[0], m[1]) and _is_prefix(m[1], m[2])


@pytest.mark.parametrize("spec, word", [
    ("multiturn:abc", "not a whole number"), ("multiturn:2:1", "out of range"), ("multiturn:2:99", "out of range"),
    ("multiturn:0", "asks for 0 conversations"), ("multiturn:2:3:4", "too many parts"),
    ("chat:2,multiturn:2", "cannot be mixed")])
def test_bad_multiturn_specs(spec, word):
    with pytest.raises(UserError, match=word) as e:
        conversations.parse(spec)
    assert "multiturn:" in e.value.fix


def test_a_misspelt_workload_names_the_valid_ones():
    assert not conversations.is_multiturn("multi-turn:2")
    with pytest.raises(UserError, match="unknown workload 'multi-turn'") as e:
        workloads.parse("multi-turn:2")
    assert "chat, code" in e.value.fix and "multiturn:N[:TURNS]" in e.value.fix
    with pytest.raises(UserError, match="out of range"):  # before anything is sent
        LoadConfig(url="http://127.0.0.1:9", workload="multiturn:2:40").validate()
    with pytest.raises(UserError, match="only the lab's client"):
        LoadConfig(url="http://127.0.0.1:9", workload="multiturn:2", generator="guidellm").validate()


def test_turns_extend_the_previous_prompt_and_the_context_cuts_them(tok):
    reqs, cut = from_conversations("multiturn:4:3", tok, max_output_len=16)
    assert cut == {"conversations": 4, "turns_per_conversation": 3, "turns_cut_by_context": 0,
                   "conversations_dropped": 0}
    assert [r.turn for r in reqs] == [0, 1, 2] * 4
    for a, b in zip(reqs, reqs[1:]):
        if a.conversation != b.conversation:
            continue
        assert _is_prefix(a.messages, b.messages) and b.prompt_tokens > a.prompt_tokens
        text = [tok.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False) for r in (a, b)]
        assert text[1].startswith(text[0])  # the prompt text a prefix cache sees
    assert all(1 <= r.max_tokens <= 16 and r.max_tokens == min(r.reference_tokens, 16) for r in reqs)
    ctx = sorted(r.prompt_tokens for r in reqs)[6]  # a context that some later turns cannot fit
    short, cut = from_conversations("multiturn:4:3", tok, max_output_len=16, max_model_len=ctx)
    assert all(r.prompt_tokens + r.max_tokens <= ctx for r in short)
    assert cut["turns_cut_by_context"] == 12 - len(short) > 0
    kept = {(r.conversation, r.turn) for r in short}
    assert all((r.conversation, r.turn - 1) in kept for r in short if r.turn)  # cut at the end, never in the middle


def test_fresh_tags_a_conversation_once(tok):
    reqs, _ = from_conversations("multiturn:2:2", tok, max_output_len=8)
    reqs = cycle(reqs, 6)  # the third conversation is the first again: a conversation of its own
    assert [u[0].conversation for u in client.users(reqs)] == [reqs[0].conversation, reqs[2].conversation,
                                                               reqs[0].conversation + "#1"]
    a, b = fresh(reqs, "s.0", tok), fresh(reqs, "s.1", tok)
    for u in client.users(a):
        assert len({r.messages[0]["content"] for r in u}) == 1
        assert all(_is_prefix(x.messages, y.messages) for x, y in zip(u, u[1:]))
    firsts = [u[0].messages[0]["content"] for u in client.users(a) + client.users(b)]
    assert len(set(firsts)) == 6  # no two conversations, and no two points, begin alike


# ---------------------------------------------------------------- a load point, turn by turn

def _check_samples(rec, reqs_sent):
    """Every turn was answered, each conversation's turns were sent in order, each only after the last ended."""
    samples = rec.output["samples"]
    m = rec.metrics["load"]
    assert m["requests"] == m["completed"] == len(reqs_sent) == len(samples)
    assert rec.config["workload"]["requests"] == len(reqs_sent)
    by_conv: dict[str, list] = {}
    for s in sorted(samples, key=lambda s: s["t_send_s"]):
        by_conv.setdefault(s["conversation"], []).append(s)
    assert len(by_conv) == rec.config["workload"]["conversations"]
    for turns in by_conv.values():
        assert [s["turn"] for s in turns] == list(range(len(turns)))
        assert all(b["t_send_s"] >= a["t_end_s"] for a, b in zip(turns, turns[1:]))
    ends = sorted((s["t_send_s"], s["t_end_s"]) for s in samples)
    assert all(sum(a <= t < b for a, b in ends) <= 2 for t, _ in ends)  # concurrency 2: never 3 in flight
    return by_conv




def test_concurrent_conversations_against_a_stub(stub):
    Stub.prompts.clear()
    Stub.refuse_forcing, Stub.honor_forcing, Stub.max_in_flight = False, True, 100
    cfg = LoadConfig(url=stub, profile="concurrent:2", workload="multiturn:3:3", max_output_len=3,
                     max_model_len=4096, max_seconds=60, request_timeout_s=30)
    rec = run(cfg)[0]
    by_conv = _check_samples(rec, [None] * 9)
    assert len(by_conv) == 3 and rec.config["workload"]["turns_cut_by_context"] == 0
    sent = [json.loads(p) for p in Stub.prompts if p != '"Hello"']
    assert len(sent) == 9
    groups: dict[str, list] = {}  # what the server received, in its arrival order, per conversation
    for m in sent:
        groups.setdefault(m[0]["content"], []).append(m)
    assert len(groups) == 3
    for turns in groups.values():
        assert [len(m) for m in turns] == [1, 3, 5]  # arrived in order
        assert all(_is_prefix(x, y) for x, y in zip(turns, turns[1:]))
        assert turns[0][0]["content"].startswith("[" + rec.config["workload"]["fresh_tag"] + ".")


# ---------------------------------------------------------------- our server on 127.0.0.1

def test_multiturn_point_against_our_server():
    from engine.peers.servers import ServerSpec

    cfg = LoadConfig(url="", profile="concurrent:2", workload="multiturn:3:2", max_output_len=4, max_seconds=300,
                     request_timeout_s=120)
    sent = []

    def send(ep, reqs, profile, limits, s):
        sent.extend(reqs)
        return client.run_point(ep, reqs, profile, limits, s)

    with _serve(ServerSpec.of("serving-cost-lab", model="default-draft", precision="int4", slots=2,
                              max_model_len=1024, draft="ngram")) as rs:
        cfg.url = rs.url
        prepared = prepare(cfg)
        rec = run_point(cfg, cfg.parsed_profile(), prepared, send=send)
    by_conv = _check_samples(rec, sent)
    w = rec.config["workload"]
    assert w["spec"] == "multiturn:3:2" and w["turns_per_conversation"] == 2
    assert len(sent) == 3 * 2 - w["turns_cut_by_context"]
    assert all(s["server_output_tokens"] == s["max_tokens"] for s in rec.output["samples"])
    for a, b in zip(sent, sent[1:]):
        if a.conversation == b.conversation:
            assert b.turn == a.turn + 1 and _is_prefix(a.messages, b.messages)
    # the server counted the same prompts the client did (the chat template applied to the whole conversation)
    assert all(s["server_prompt_tokens"] == s["prompt_tokens"] for s in rec.output["samples"])
    assert len(by_conv) == w["conversations"]
    # acceptance under load for the workload's category, from each answer's own stats: together they are the
    # server's counters over the point (no warm-up, nothing else sent)
    cat, spec = rec.metrics["load"]["spec_by_category"]["multiturn"], rec.metrics["spec"]
    assert list(rec.metrics["load"]["spec_by_category"]) == ["multiturn"]
    assert cat["requests"] == len(sent) and cat["policies"] == ["fixed"]
    assert (cat["rounds"], cat["drafted"], cat["accepted"]) == (spec["rounds"], spec["drafted"], spec["accepted"])
    assert cat["drafted"] > 0 and cat["acceptance_rate"] == pytest.approx(cat["accepted"] / cat["drafted"])
