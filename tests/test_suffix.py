"""Suffix decoding (engine/infer/suffix.py): the suffix tree's counts, the drafts it proposes, and the draft
kind end to end on the real 0.5B (lossless: tests/test_batching.py runs it with every other kind)."""
import pytest

from engine.common.errors import UserError
from engine.common.setup import EngineSetup
from engine.infer.batch import Request
from engine.infer.proposers import proposer_spec
from engine.infer.scheduler import BatchSettings, Scheduler
from engine.infer.suffix import SuffixProposer, SuffixTree
from engine.infer.tokens import encode_prompts


def test_the_tree_counts_every_suffix_to_its_depth_and_takes_them_out_again():
    t = SuffixTree(depth=3)
    t.add([1, 2, 1, 2, 3])
    assert t.root.kids[1].count == 2 and t.root.kids[1].kids[2].count == 2
    assert t.root.kids[1].kids[2].kids[3].count == 1 and not t.root.kids[1].kids[2].kids[3].kids  # depth 3
    assert t.root.kids[2].kids[1].kids[2].count == 1 and 3 not in t.root.kids[2].kids[1].kids[2].kids
    t.add([1, 2, 1, 2, 3], sign=-1)
    assert not t.root.kids


def test_the_draft_follows_the_most_frequent_continuation_of_the_longest_match():
    t = SuffixTree(depth=8)
    t.add([5, 6, 7, 8, 9, 5, 6, 7, 8, 4, 5, 6, 7, 8, 9])
    # "5 6 7 8" went on to 9 twice and to 4 once; a match of 4 tokens drafts at most 4 (spec factor 1)
    tokens, score = t.draft([1, 5, 6, 7, 8], limit=16)
    assert tokens[:2] == [9, 5] and len(tokens) <= 4 and score == pytest.approx(2 / 3 * (1 + len(tokens) - 1))
    assert t.draft([1, 5, 6, 7, 8], limit=1)[0] == [9]  # gamma caps it
    assert t.draft([42], limit=8) == ([], 0.0)  # never seen: no draft
    rare = SuffixTree(depth=8)
    for nxt in range(20, 30):  # ten different continuations of "1 2": none reaches min_prob 0.1 with the next
        rare.add([1, 2, nxt, 1, 2, nxt + 100])
    assert rare.draft([1, 2], limit=8)[0] == []


def test_a_request_drafts_from_its_own_tokens_and_from_earlier_outputs():
    p = SuffixProposer(slots=2, depth=8)

    class Seq:
        def __init__(self, slot, tokens, n_prompt):
            self.slot, self.tokens, self.n_prompt = slot, tokens, n_prompt

    s = Seq(0, [1, 2, 3, 4, 1, 2], 4)
    assert p.propose([s], [4])[0] == [[3, 4]]  # its own prompt: "1 2" went on "3 4"
    s.tokens += [3, 4, 7, 8, 9]
    p.propose([s], [0])
    p.free(0)  # its output 1 2 3 4 7 8 9 joins the global tree
    other = Seq(1, [50, 51, 3, 4, 7], 3)
    assert p.propose([other], [4])[0] == [[8, 9]]  # learnt from the earlier request's output


def test_suffix_is_a_draft_kind_with_gamma_checked(small_int4):
    assert EngineSetup(draft="suffix", gamma=4).validate().label == "default@fp32 + suffix g=4"
    with pytest.raises(UserError, match="gamma 17 is out of range"):
        EngineSetup(draft="suffix", gamma=17).validate()
    lm = small_int4
    text = "def area(r):\n    return 3.14159 * r * r\n\ndef perimeter(r):\n    return 2 * 3.14159 * r\n"
    ids = encode_prompts(lm.tokenizer, ["Repeat this code exactly:\n" + text], chat=True)[0]
    outs = {}
    for kind in ("none", "suffix"):
        spec = None if kind == "none" else proposer_spec(kind, None, lm)
        sched = Scheduler(lm, BatchSettings(max_seqs=1, max_model_len=256, max_batched_tokens=5 + 64,
                                            prefill_chunk=64), spec, 0 if kind == "none" else 4)
        seqs = []
        r = Request(list(ids), 40, stop_at_eos=False)
        r.on_token = lambda s, *a, seqs=seqs: None if seqs else seqs.append(s)
        sched.submit(r)
        while sched.has_work():
            sched.step()
        outs[kind] = seqs[0]
    assert outs["suffix"].out == outs["none"].out  # lossless
    st = outs["suffix"].spec_stats
    assert st.accepted / st.drafted > 0.5 and st.emitted / st.rounds > 2  # the copy is drafted from the prompt
