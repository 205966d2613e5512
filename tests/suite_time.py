"""Where the suite's time goes, from pytest's junit file: seconds per module (--durations lists the slowest).

    .venv/bin/python tests/suite_time.py .venv/last-test-run.xml      (make test runs it after every run)

junit times include each test's setup and teardown, so a module-scoped fixture counts in its first test.
"""
from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def main(path: str, top: int = 20) -> int:
    root = ET.parse(path).getroot()
    per_module: collections.Counter = collections.Counter()
    tests = []
    for tc in root.iter("testcase"):
        t, cls = float(tc.get("time") or 0), tc.get("classname", "")
        per_module[cls.split(".")[1] if "." in cls else cls] += t
        tests.append((t, f"{cls.split('.')[-1]}::{tc.get('name')}"))
    total = sum(t for t, _ in tests)
    print(f"suite time: {len(tests)} tests, {total:.0f} s in junit times; seconds per module (top {top}):")
    for m, t in per_module.most_common(top):
        print(f"{t:8.1f}  {100 * t / total:4.1f}%  {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
