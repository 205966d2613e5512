"""bench/quant_spec.py's table (issue 39.8): one row per target precision and draft from the bench's records."""
import pytest

from tests.bench_scripts import bench_script


def _rec(precision, draft, batch, accept, speedup, code=None, edit=None, kld=None, method="rtn", group=64):
    """A bench record's shape: the precision's label in config (with its method and group, 'int4-gptq-g32'), the
    setup beside it."""
    spec = {"acceptance_rate": accept, "mean_acceptance_length": 1 + 4 * accept, "speedup": speedup}
    cats = {"code": {"spec": {"speedup": code}}, "edit": {"spec": {"speedup": edit}}} if code else {}
    label = precision if precision != "int4" else "int4" + (f"-{method}" if method != "rtn" else "") + f"-g{group}"
    setup = {"model": "default", "precision": precision, "method": method, "group_size": group}
    return {"label": f"{label} + {draft}", "config": {"precision": label, "method": method, "group_size": group,
                                                      "batch_size": batch, "draft": {"kind": draft}, "setup": setup},
            "metrics": {"spec": spec, "by_category": cats, "quality": {"kld_median": kld, "top1_agreement": 0.9}}}


def test_the_table_shows_what_quantizing_the_target_does_to_acceptance():
    qs = bench_script("quant_spec")
    recs = [_rec("int8", "ngram", 1, 0.50, 1.40, code=1.6, edit=1.3, kld=0.001),
            _rec("int8", "ngram", 8, 0.50, 1.05, kld=0.001),
            _rec("int4", "ngram", 1, 0.45, 1.30, code=1.4, edit=1.2, kld=0.02),
            _rec("int4", "ngram", 8, 0.44, 0.95, kld=0.02),
            _rec("int4", "model", 1, 0.70, 1.10, code=1.2, edit=1.1, kld=0.02, method="gptq", group=32)]
    rows = qs.rows_of(recs)
    # each configuration named by its precision token once (the GPTQ row read 'int4-gptq-g32-gptq' before)
    assert [(r["precision"], r["draft"]) for r in rows] == [("int8", "ngram"), ("int4-g64", "ngram"),
                                                             ("int4-gptq-g32", "model")]
    assert rows[1]["acceptance_b8"] == 0.44 and rows[1]["speedup_b1"] == 1.30 and rows[1]["kld_median"] == 0.02
    md = qs.markdown({"rows": rows, "batch_sizes": [1, 8], "precisions": ["int8", "int4"], "command": "c",
                      "model": "m", "workload": "code:2,edit:2", "max_new_tokens": 8, "reps": 1, "wall_s": 60,
                      "left_out": ["int4 + self"]})
    assert "- ngram: int8 0.500 -> int4-g64 0.450 (-0.050)" in md
    assert "best on code at batch 1: 1.60x (int8 + ngram; target >= 1.5x: met)" in md
    assert "best on edit at batch 1: 1.30x (int8 + ngram; target >= 1.5x: missed)" in md
    assert "| int4-g64 | ngram | 0.450 | 1.30 | 0.440 | 0.95 | 1.40 | 1.20 | 0.02000 | 0.900 |" in md
    assert "left out: int4 + self" in md
    with pytest.raises(KeyError):  # a record without a precision is not a bench record: it fails loudly
        qs.rows_of([{"config": {}, "metrics": {}}])
