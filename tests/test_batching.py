"""Continuous batching in the engine: per-sequence slots, chunked prefill beside decodes, speculation
per sequence, cancellation and capacity — on the real 0.5B model."""
import pytest

from engine.common.errors import UserError
from engine.infer.batch import Request
from engine.infer.proposers import proposer_spec
from engine.infer.sampling import SamplingParams
from engine.infer.scheduler import BatchSettings, QueueFull, Scheduler
from engine.infer.tokens import encode_prompts
from tests.scheduling import requests, run_to_end

PROMPTS = ["Write a Python function that reverses a list.", "What is a KV cache?",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Translate to French: the cat sleeps on the mat, and the dog sleeps on the rug.",
           "List three prime numbers.", "x = [1, 2, 3]\ny = [a * 2 for a in x]\nprint(y)\n# prints",
           "Explain recursion in one sentence.", "SELECT name FROM users WHERE"]
N_NEW = 20
# Small chunks so prompts prefill over several steps, interleaved with other sequences' decodes.
SETTINGS = BatchSettings(max_seqs=8, max_model_len=256, max_batched_tokens=8 * 5 + 16, prefill_chunk=16)


def _ids(lm, prompts=PROMPTS):
    return encode_prompts(lm.tokenizer, prompts, chat=True)


def _alone(lm, ids, spec=None, gamma=0, sp=None):
    return [list(run_to_end(Scheduler(lm, SETTINGS, spec, gamma), requests([x], N_NEW, sp))[0].out) for x in ids]


def _together(lm, ids, spec=None, gamma=0, stagger=2, sp=None):
    sched = Scheduler(lm, SETTINGS, spec, gamma)
    seqs = run_to_end(sched, requests(ids, N_NEW, sp), stagger)
    return [list(s.out) for s in seqs], sched, seqs


@pytest.fixture(scope="module")
def plain_alone(small_int4):
    """Each request's greedy tokens alone, without speculation: what every kind below must give in a batch."""
    return _alone(small_int4, _ids(small_int4))


@pytest.mark.parametrize("kind", ["none", "ngram", "suffix", "model", "self"])
def test_greedy_batch_is_token_identical_to_each_request_alone(kind, small_int4, small_int8, plain_alone):
    """8 requests joining a running batch two steps apart, prefilled in chunks beside the others' decodes
    and verified per sequence, give exactly the tokens each gives alone without speculation (greedy
    speculation is lossless and int4 rows are batch-invariant); the speculative kinds are checked against
    that one reference (each kind's own runs alone took 9-15 s more per kind on a 2-core AVX2 host)."""
    lm = small_int4
    draft = {"model": small_int4, "self": small_int8}.get(kind)
    spec = None if kind == "none" else proposer_spec(kind, draft, lm)
    gamma = 0 if kind == "none" else 3
    alone = plain_alone
    together, sched, seqs = _together(lm, _ids(lm), spec, gamma)
    assert together == alone
    assert all(len(o) == N_NEW for o in together)
    if kind != "none":  # the proposer really drafted, per sequence
        assert sum(s.spec_stats.drafted for s in seqs) > 0 and sum(s.spec_stats.rounds for s in seqs) >= len(seqs)
    assert len(sched.free_slots) == SETTINGS.max_seqs  # every slot came back


def test_sequences_keep_their_own_acceptance(small_int4):
    """With n-gram drafts one copy-heavy request accepts far more than a plain one in the same batch."""
    lm = small_int4
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 3
    ids = encode_prompts(lm.tokenizer, ["Repeat exactly: " + text, "Name a colour."], chat=True)
    seqs = run_to_end(Scheduler(lm, SETTINGS, proposer_spec("ngram"), 4), requests(ids, 24))
    rates = [s.spec_stats.acceptance_rate or 0.0 for s in seqs]
    assert len(seqs) == 2 and max(rates) > min(rates)
    assert sum(s.spec_stats.rounds for s in seqs) > 0


def test_sampled_requests_do_not_depend_on_their_neighbours(small_int4):
    lm = small_int4
    ids = _ids(lm)[:4]
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    alone = _alone(lm, ids, sp=sp)
    together, _, _ = _together(lm, ids, sp=sp)
    assert together == alone


def test_cancel_frees_the_slot_and_others_go_on(small_int4):
    lm = small_int4
    ids = _ids(lm)[:3]
    sched = Scheduler(lm, BatchSettings(max_seqs=2, max_model_len=256, max_batched_tokens=2 + 16, prefill_chunk=16),
                      None, 0)
    reqs = [Request(list(x), 40, stop_at_eos=False) for x in ids]
    for r in reqs:
        sched.submit(r)
    sched.step()
    sched.step()
    assert len(sched.running) == 2 and len(sched.waiting) == 1
    sched.cancel(reqs[0])
    sched.step()  # retired at the step boundary; the waiting request takes the slot
    assert sched.sequence(reqs[0]) is None and sched.sequence(reqs[2]) is not None
    while sched.has_work():
        sched.step()
    assert len(sched.free_slots) == 2


def test_capacity_queues_then_refuses_with_retry_after(small_int4):
    lm = small_int4
    x = _ids(lm)[0]
    sched = Scheduler(lm, BatchSettings(max_seqs=1, max_model_len=256, max_batched_tokens=1 + 16, prefill_chunk=16,
                                        max_waiting=1), None, 0)
    sched.submit(Request(list(x), 8))
    sched.step()  # admitted: the slot is taken
    sched.submit(Request(list(x), 8))  # queued
    with pytest.raises(QueueFull) as e:
        sched.submit(Request(list(x), 8))
    assert e.value.retry_after_s >= 1


def test_requests_that_cannot_fit_are_refused_before_queueing(small_int4):
    sched = Scheduler(small_int4, SETTINGS, None, 0)
    with pytest.raises(UserError, match="at most 236 new tokens"):
        sched.submit(Request(list(range(1, 21)), 500))
    with pytest.raises(UserError, match="empty"):
        sched.submit(Request([], 5))
    with pytest.raises(UserError, match="max_batched_tokens 16 is smaller than a decode round of 8 sequences "
                                        r"\(gamma 0: 8 rows\) plus one prefill chunk of 16"):
        Scheduler(small_int4, BatchSettings(max_seqs=8, max_batched_tokens=16, prefill_chunk=16), None, 0)
    with pytest.raises(UserError, match="policy"):
        BatchSettings(policy="random").validate()


def test_static_generate_batch_matches_each_prompt_alone(small_int4):
    """generate() runs a static batch through the scheduler (prefill-first): each row equals its prompt alone."""
    from engine.infer.generate import generate

    ids = _ids(small_int4)[:3]
    res = generate(small_int4, None, N_NEW, prompt_ids=ids, stop_at_eos=False)
    alone = [generate(small_int4, None, N_NEW, prompt_ids=[x], stop_at_eos=False).new_tokens[0] for x in ids]
    assert res.new_tokens == alone
    assert res.settings["policy"] == "prefill-first" and len(res.step_s) == N_NEW - 1


@pytest.mark.parametrize("kind", ["none", "model"])
def test_choices_of_one_request_prefill_its_prompt_once(kind, small_int4):
    """n choices (choice i > 0 with prefix_from = choice 0): every whole chunk but the prompt's last is
    copied from choice 0, K/V and the draft's cache, and each choice still gives the tokens it gives alone
    with its own seed; a choice whose leader was cancelled prefills by itself."""
    lm = small_int4
    spec, gamma = (proposer_spec("model", small_int4, lm), 3) if kind == "model" else (None, 0)
    ids = _ids(lm, [PROMPTS[2] * 4])[0]  # ~100 tokens: several chunks of 16
    shared = (len(ids) - 1) // SETTINGS.prefill_chunk * SETTINGS.prefill_chunk
    assert shared >= 4 * SETTINGS.prefill_chunk
    seeds = [SamplingParams(temperature=0.9, seed=5 + i) for i in range(3)]

    def alone(sp, n):
        return run_to_end(Scheduler(lm, SETTINGS, spec, gamma), requests([ids], n, sp))[0].out

    sched = Scheduler(lm, SETTINGS, spec, gamma)
    reqs, seqs, rows = [], {}, []
    for i, sp in enumerate(seeds):
        reqs.append(Request(list(ids), 8, sp, stop_at_eos=False, prefix_from=reqs[0] if reqs else None,
                            on_token=lambda q, *a, i=i: seqs.setdefault(i, q)))
    for r in reqs:
        sched.submit(r)
    while sched.has_work():
        st, _ = sched.step()
        rows.append(st.prefill_rows if st else 0)
    assert [seqs[i].out for i in range(3)] == [alone(sp, 8) for sp in seeds]
    assert sched.shared_prompt_tokens == 2 * shared
    assert sum(rows) == len(ids) + 2 * (len(ids) - shared)

    sched, out = Scheduler(lm, SETTINGS, spec, gamma), []  # the leader cancelled while the other waits for it
    reqs = [Request(list(ids), 4, seeds[0], stop_at_eos=False)]
    reqs.append(Request(list(ids), 4, seeds[1], stop_at_eos=False, prefix_from=reqs[0],
                        on_token=lambda q, *a: out.append(q) if not out else None))
    for r in reqs:
        sched.submit(r)
    sched.step()
    sched.cancel(reqs[0])
    while sched.has_work():
        sched.step()
    assert sched.shared_prompt_tokens == 0 and out[0].out == alone(seeds[1], 4)
