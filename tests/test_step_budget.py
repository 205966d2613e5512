"""The step's token budget (issue 41, item 1): decodes first, then whole prompt chunks sized to the budget, both
chosen from the step costs the server measures when it starts; on the real 0.5B."""
import pytest

from engine.common.errors import UserError
from engine.infer.batch import Request
from engine.infer.scheduler import BatchSettings, Scheduler
from engine.infer.step_budget import as_cost
from tests.test_batching import SETTINGS, _ids


def prompt_rows(decode_s, with_rows, factor, most):
    return as_cost(7, decode_s, with_rows).rows_within(7, factor, most)


def test_prompt_rows_are_the_most_within_the_factor():
    """The step-cost model's table (seconds by rows: 7 decode rows, plus r prompt rows) read for the budget."""
    table = {8: 0.07, 16: 0.10, 32: 0.16, 64: 0.30}
    # 3 x 0.04 = 0.12 lies between 16 rows (0.10) and 32 (0.16): 16 + 0.02 / (0.06 / 16) = 21.3 rows
    assert prompt_rows(0.04, table, 3.0, 64) == 21
    assert prompt_rows(0.04, table, 100.0, 64) == 64       # everything measured fits: the most asked
    assert prompt_rows(0.04, table, 1.01, 64) == 1         # nothing fits: one row, so prompts still advance
    assert prompt_rows(0.04, table, 1.75, 64) == 8         # exactly on a point
    # a noisy point cheaper than a smaller chunk is lifted to it: 16 rows cost at least 8's 0.07
    assert prompt_rows(0.04, {8: 0.07, 16: 0.05, 32: 0.16}, 1.75, 32) == 16


def test_no_step_carries_more_rows_than_its_budget(small_int4):
    ids = _ids(small_int4)[:4]
    sched = Scheduler(small_int4, BatchSettings(max_seqs=4, max_model_len=256, max_batched_tokens=4 + 7,
                                                prefill_chunk=7), None, 0)
    for x in ids:
        sched.submit(Request(list(x), 8, stop_at_eos=False))
    seen = []
    sched.run_until_done(lambda st: seen.append((st.decode_rows, st.prefill_rows)))
    assert all(d + p <= 11 for d, p in seen) and any(d > 0 and p == 7 for d, p in seen)  # decodes beside a chunk


def test_the_budget_is_chosen_from_measured_steps(small_int4):
    """prepare() times a decode step of 7 sequences alone and carrying 4-64 prompt rows, keeps the most rows
    within 3 decode steps and sizes the chunk (and the budget) to them; the scheduler is empty after, and serves
    as before."""
    st = BatchSettings(max_seqs=8, max_model_len=320, max_batched_tokens=8 + 64, prefill_chunk=64, step_factor=3.0)
    sched = Scheduler(small_int4, st, None, 0)
    sched.prepare()
    sb = sched.step_budget
    assert sb is not None and sb.decode_seqs == 7 and sb.decode_s > 0
    timed = sorted(sb.with_rows_s)  # from the fewest rows up, until the first past the factor
    assert timed and timed == [4, 8, 16, 32, 64][:len(timed)]
    assert all(sb.with_rows_s[r] <= 3.0 * sb.decode_s for r in timed[:-1])
    assert sb.prompt_rows == prompt_rows(sb.decode_s, sb.with_rows_s, 3.0, 64)
    chunk = min(sb.prompt_rows, 64)
    assert sched.settings.prefill_chunk == sb.prefill_chunk == chunk
    assert sched.settings.max_batched_tokens == sb.max_batched_tokens == 8 + chunk
    assert sb.with_rows_s[timed[-1]] > sb.decode_s      # prompt rows cost time: the tail the budget bounds
    assert not sched.has_work() and len(sched.free_slots) == 8
    assert sb.to_dict()["with_rows_s"][str(timed[-1])] == sb.with_rows_s[timed[-1]]
    ids = _ids(small_int4)[:2]
    reqs = [Request(list(x), 4, stop_at_eos=False) for x in ids]
    for r in reqs:
        sched.submit(r)
    sched.run_until_done()
    assert not sched.has_work() and len(sched.free_slots) == 8


def test_a_budget_too_small_or_beyond_the_cache_is_refused_naming_both(small_int4):
    with pytest.raises(UserError, match=r"max_batched_tokens 20 is smaller than a decode round of 8 sequences "
                                        r"\(gamma 0: 8 rows\) plus one prefill chunk of 16"):
        BatchSettings(max_seqs=8, max_batched_tokens=20, prefill_chunk=16).validate()
    with pytest.raises(UserError, match=r"gamma 3: 32 rows\) plus one prefill chunk of 16.*at least 48"):
        BatchSettings(max_seqs=8, max_batched_tokens=40, prefill_chunk=16).validate(3)
    with pytest.raises(UserError, match=r"max_batched_tokens 600 leaves 598 prompt rows a step, more than the KV "
                                        r"cache holds \(512 positions\)"):
        Scheduler(small_int4, BatchSettings(max_seqs=2, max_model_len=256, max_batched_tokens=600,
                                            prefill_chunk=16), None, 0)
    with pytest.raises(UserError, match="step_factor 0.5"):
        BatchSettings(step_factor=0.5).validate()
    assert SETTINGS.validate().step_factor == 0.0      # off unless asked: a budget as given
