"""Seconds per test module and the slowest tests of a pytest junit file: python3 junit_summary.py JUNIT.xml"""
import collections
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
mods, tests, bad = collections.Counter(), [], []
for tc in root.iter("testcase"):
    t, cls = float(tc.get("time") or 0), tc.get("classname", "")
    mods[cls.split(".")[1] if "." in cls else cls] += t
    tests.append((t, f"{cls}::{tc.get('name')}"))
    if tc.find("failure") is not None or tc.find("error") is not None:
        bad.append(tests[-1][1])
    if tc.find("skipped") is not None:
        bad.append("SKIPPED " + tests[-1][1])
print(f"{len(tests)} test cases, {sum(t for t, _ in tests):.0f} s in all (junit times; setup and teardown included by pytest)")
print("\nseconds per module (top 25):")
for m, t in mods.most_common(25):
    print(f"{t:8.1f}  {m}")
print("\nslowest tests (top 25):")
for t, n in sorted(tests, reverse=True)[:25]:
    print(f"{t:8.1f}  {n}")
print("\nfailed, errored or skipped:", *bad or ["none"], sep="\n  ")
