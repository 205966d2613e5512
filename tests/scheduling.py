"""Requests through a real Scheduler in tests: submit them as they arrive, step until idle, read each sequence."""
from __future__ import annotations

from engine.infer.batch import Request
from engine.infer.sampling import SamplingParams


def requests(ids, max_new: int, sp: SamplingParams | None = None) -> list[Request]:
    """One request per prompt of `ids` (request id its index), greedy unless `sp`, never stopped early by EOS."""
    return [Request(list(x), max_new, sp or SamplingParams(), stop_at_eos=False, request_id=str(i))
            for i, x in enumerate(ids)]


def run_to_end(sched, reqs: list[Request], stagger: int = 0) -> list:
    """Submit `reqs` (one more every `stagger` steps; 0: all at once) and step `sched` until it is idle.
    Returns each request's sequence, in the order of `reqs` (their on_token callbacks are replaced)."""
    seqs: dict[int, object] = {}
    for i, r in enumerate(reqs):
        r.on_token = lambda s, *a, i=i: seqs.setdefault(i, s)
    pending = list(reqs)
    if not stagger:
        for r in pending:
            sched.submit(r)
        pending = []
    steps = 0
    while pending or sched.has_work():
        if pending and steps % stagger == 0:
            sched.submit(pending.pop(0))
        sched.step()
        steps += 1
    return [seqs[i] for i in range(len(reqs))]
