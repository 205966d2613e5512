"""Problem by problem: session 38's GPTQ-mixed run (int8 linears on fp32 activations) against this session's (the
same codes, int8 activations): which problems flipped. Reads the two accuracy progress logs."""
import re
import sys

PAT = re.compile(r"\[(.*?): judged \d+/164: (HumanEval/\d+) (passed|failed)\]")


def results(path, want):
    out = {}
    for line in open(path):
        m = PAT.search(line)
        if m and want in m.group(1):
            out[m.group(2)] = m.group(3) == "passed"
    return out


a = results(sys.argv[1], "gptq-mixed g32")
b = results(sys.argv[2], "gptq-mixed g32")
assert len(a) == len(b) == 164, (len(a), len(b))
lost = sorted(k for k in a if a[k] and not b[k])
gained = sorted(k for k in a if b[k] and not a[k])
print(f"session 38 mixed {sum(a.values())}/164, session 39 mixed {sum(b.values())}/164; "
      f"lost {len(lost)} {lost}, gained {len(gained)} {gained}")
