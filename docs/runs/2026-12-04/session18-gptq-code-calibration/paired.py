"""Pair two `engine accuracy` progress logs problem by problem: each configuration's judged outcomes, the flips
against the first configuration of the first log, and McNemar's exact test (engine.common.paired)."""
import re
import sys

from engine.common.paired import mcnemar_exact, wilson

# "[configuration 2/2 (default@fp32): judged 1/164: HumanEval/0 passed]", or without "configuration i/n (...)"
# when the run had one configuration
LINE = re.compile(r"\[(?:configuration \d+/\d+ \()?(?P<config>[^:()\[]+)\)?: judged \d+/\d+: (?P<task>\S+) "
                  r"(?P<out>\w+)\]")  # passed, failed, timeout...


def outcomes(path):
    out = {}
    for line in open(path, encoding="utf-8"):
        m = LINE.search(line)
        if m:
            out.setdefault(m["config"], {})[m["task"]] = m["out"] == "passed"
    return out


first = outcomes(sys.argv[1])
ref_name, ref = next(iter(first.items()))
rows = [(ref_name, ref)] + [kv for path in sys.argv[2:] for kv in outcomes(path).items()]
for name, got in rows:
    assert set(got) == set(ref), f"{name} judged other problems than {ref_name}"
    k, n = sum(got.values()), len(got)
    lo, hi = wilson(k, n)
    lost = sum(ref[t] and not got[t] for t in ref)
    gained = sum(got[t] and not ref[t] for t in ref)
    p = mcnemar_exact(lost, gained) if name != ref_name else float("nan")
    print(f"{name}: {k}/{n} = {100 * k / n:.1f}% [{100 * lo:.1f}%, {100 * hi:.1f}%] lost {lost} gained {gained} "
          f"McNemar p {p:.4f}")
