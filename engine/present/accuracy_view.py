"""Task accuracy beside KLD: one row per accuracy record, paired against a reference configuration.

Reads accuracy records (metrics.accuracy) and, where the store has them, the quality statistics of the
same model and precision (metrics.quality of a generate/bench record); never runs a model. A difference
from the reference is called significant only when McNemar's exact test says so (engine.common.paired).
"""
from __future__ import annotations

from engine.common.errors import UserError
from engine.common.fields import A, PR, Q
from engine.common.record_setup import calibration_suffix, setup_from_record
from engine.common.vocab import OUR_SYSTEMS as OURS, canonical_model_name
from engine.common.paired import compare

COLUMNS = ("config", "problems", "pass@1", "95% interval", "lost", "gained", "McNemar p", "vs reference",
           "KLD mean", "KLD p99", "gen tok/s", "$/1k solved")


# llama-server and llama-cpp-python (engine quality) run the same llama.cpp on the same shipped GGUF
PEER_ENGINE = {"llama-server": "llama.cpp"}


def _key(rec) -> tuple[str, str, str]:
    """(engine, model, precision label) of a record: how an accuracy row finds its KLD."""
    c = rec.config or {}
    if c.get("system") not in OURS:
        system = str(c.get("system"))
        return PEER_ENGINE.get(system, system), canonical_model_name(c.get("model") or ""), str(c.get("precision"))
    s = setup_from_record(c)
    return "ours", canonical_model_name(s.model), s.precision_label + s.draft_label + calibration_suffix(c)


def outcomes(rec) -> dict[str, bool]:
    """{task id: passed} of an accuracy record."""
    acc = (rec.metrics or {}).get("accuracy") or {}
    return {o[PR.task_id]: bool(o[PR.passed]) for o in acc.get(A.outcomes) or []}


def _quality_by_key(records) -> dict:
    """The newest quality statistics per (model, precision): records come newest first from the store."""
    out: dict = {}
    for r in records:
        q = (r.metrics or {}).get("quality")
        if r.kind != "accuracy" and q and q.get(Q.kld_mean) is not None:
            out.setdefault(_key(r), q)
    return out


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _num(x, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def accuracy_rows(acc_records, quality_records=(), reference: int = 0) -> list[dict]:
    """Rows (COLUMNS) for accuracy records, each paired with records[reference] on their common problems."""
    acc_records = [r for r in acc_records if r.kind == "accuracy"]
    if not acc_records:
        return []
    if not 0 <= reference < len(acc_records):
        raise UserError(f"reference {reference} is not one of the {len(acc_records)} accuracy runs",
                        "pick the reference by its position in the table")
    ref = outcomes(acc_records[reference])
    kld = _quality_by_key(quality_records)
    rows = []
    for i, r in enumerate(acc_records):
        a = r.metrics["accuracy"]
        p = compare(ref, outcomes(r))
        q = kld.get(_key(r)) or {}
        rows.append({
            "config": r.label,
            "problems": f"{a[A.solved]}/{a[A.problems]} ({a[A.subset]})", "pass@1": _pct(a.get(A.pass_at_1)),
            "95% interval": f"[{_pct(a.get(A.pass_at_1_lo))}, {_pct(a.get(A.pass_at_1_hi))}]",
            "lost": "reference" if i == reference else p.lost, "gained": "" if i == reference else p.gained,
            "McNemar p": "" if i == reference else f"{p.p_value:.3g}",
            "vs reference": "reference" if i == reference else p.verdict.split(" (")[0],
            "KLD mean": _num(q.get(Q.kld_mean), 5), "KLD p99": _num(q.get(Q.kld_p99), 4),
            "gen tok/s": _num(a.get(A.gen_tok_s), 1), "$/1k solved": _num(a.get(A.usd_per_1k_solved), 3)})
    return rows


NOTE = ("pass@1: one greedy completion per problem, its tests run in the lab's sandbox; interval: Wilson 95%. "
        "lost / gained: problems the reference solved and this one did not / the reverse. McNemar's exact test on "
        "those flips says whether the difference is more than noise; 'not significant' means the runs cannot be "
        "ranked. KLD: the newest stored quality run of the same model and precision (bench --quality, or engine "
        "quality for ours and llama.cpp's; – when none). $/1k solved: generation time at the measured speed and "
        "the price, over the problems solved.")
