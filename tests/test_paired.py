"""McNemar's exact test and Wilson's interval against hand computations."""
import pytest

from engine.common.errors import UserError
from engine.common.paired import compare, mcnemar_exact, wilson


def test_mcnemar_matches_hand_computation():
    # b=1, c=5: n=6, P[X<=1] = (C(6,0)+C(6,1))/64 = 7/64; two-sided 14/64 = 0.21875
    assert mcnemar_exact(1, 5) == pytest.approx(14 / 64)
    assert mcnemar_exact(5, 1) == pytest.approx(14 / 64)
    # b=0, c=6: 2 * 1/64
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)
    # b=2, c=10: n=12, (1 + 12 + 66) / 4096 * 2 = 158/4096
    assert mcnemar_exact(2, 10) == pytest.approx(158 / 4096)
    # balanced flips: the tail passes one half, p is capped at 1
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0


def test_compare_counts_flips_each_way_and_says_not_significant():
    a = {"t0": True, "t1": True, "t2": False, "t3": False, "t4": True, "only_a": True}
    b = {"t0": True, "t1": False, "t2": True, "t3": False, "t4": True, "only_b": False}
    p = compare(a, b)
    assert (p.problems, p.both_pass, p.both_fail, p.lost, p.gained) == (5, 2, 1, 1, 1)
    assert p.p_value == 1.0 and not p.significant and "not significant" in p.verdict
    assert compare(a, a).verdict == "identical outcomes"
    with pytest.raises(UserError, match="share no problem"):
        compare({"x": True}, {"y": True})


def test_wilson_interval_by_hand():
    # k=8, n=20, z=1.96: centre (0.4 + 0.09604)/1.19208 = 0.41612, half 1.96*sqrt(0.012+0.0024010)/1.19208 = 0.19729
    lo, hi = wilson(8, 20)
    assert lo == pytest.approx(0.2188, abs=1e-3) and hi == pytest.approx(0.6134, abs=1e-3)
    assert wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and wilson(10, 10)[1] == pytest.approx(1.0)
