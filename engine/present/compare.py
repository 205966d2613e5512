"""Comparing runs: chart series, the cost-vs-quality Pareto frontier, % differences between reports, and the
answer in words."""
from __future__ import annotations

from typing import Mapping, Sequence

from engine.present.columns import CHARTS, COLUMNS, num as _num, plus_minus


def chart_series(rows: Sequence[dict], column: str) -> tuple[list[str], list[float | None]]:
    """Labels and values for one bar chart (rows without the metric keep a None gap)."""
    return [str(r.get("config")) for r in rows], [_num(r.get(column)) for r in rows]


def available_charts(rows: Sequence[dict]) -> list[tuple[str, str, str, str]]:
    """(column, title, unit, better) of the charts that have at least one value."""
    return [(c.name, c.chart, c.unit, c.better) for c in CHARTS if any(_num(r.get(c.name)) is not None for r in rows)]


def missing_charts(rows: Sequence[dict]) -> list[str]:
    """Titles of the charts no row has a value for."""
    return [c.chart for c in CHARTS if not any(_num(r.get(c.name)) is not None for r in rows)]


def pareto_frontier(points: Sequence[Mapping], x: str, y: str) -> list[bool]:
    """Which points are on the frontier when both x and y are to be minimised (e.g. cost, quality loss).

    A point is on the frontier when no other point is at least as good on both and strictly
    better on one. Points missing either value are never on it.
    """
    vals = [(_num(p.get(x)), _num(p.get(y))) for p in points]
    out = []
    for i, (xi, yi) in enumerate(vals):
        if xi is None or yi is None:
            out.append(False)
            continue
        dominated = any(
            j != i and xj is not None and yj is not None and xj <= xi and yj <= yi and (xj < xi or yj < yi)
            for j, (xj, yj) in enumerate(vals)
        )
        out.append(not dominated)
    return out


def frontier_line(points: Sequence[Mapping], x: str, y: str) -> list[dict]:
    """Frontier points sorted by x, for drawing the step line."""
    flags = pareto_frontier(points, x, y)
    on = [p for p, f in zip(points, flags) if f]
    return sorted(on, key=lambda p: (_num(p.get(x)), _num(p.get(y))))


# the figures two reports are compared on: every column that says which way is better (columns.py)
DIFF_METRICS: list[tuple[str, str]] = [(c.name, c.better) for c in COLUMNS if c.better]


def pct_diff(base, new) -> float | None:
    """(new - base) / |base| * 100; None when either is missing or base is 0."""
    b, n = _num(base), _num(new)
    if b is None or n is None or b == 0:
        return None
    return (n - b) / abs(b) * 100.0


def report_diff(base_rows: Sequence[Mapping], other_rows: Sequence[Mapping], key: str = "config",
                metrics: Sequence[tuple[str, str]] = DIFF_METRICS) -> list[dict]:
    """Match rows of two reports by `key` (the run label) and give % differences, base = first.

    Each output row: key, in_base, in_other, then per metric <m>_base, <m>_other, <m>_pct and
    <m>_better (True/False/None: whether the other report is better on that metric). Labels only
    in one report are listed with the other side empty. Duplicate labels are numbered (#2, #3...).
    """
    def keyed(rows):
        out, seen = {}, {}
        for r in rows:
            k = str(r.get(key))
            seen[k] = seen.get(k, 0) + 1
            out[k if seen[k] == 1 else f"{k} #{seen[k]}"] = r
        return out

    b, o = keyed(base_rows), keyed(other_rows)
    order = list(b) + [k for k in o if k not in b]
    rows = []
    for k in order:
        rb, ro = b.get(k), o.get(k)
        r = {key: k, "in_base": rb is not None, "in_other": ro is not None}
        for m, better in metrics:
            vb = _num(rb.get(m)) if rb else None
            vo = _num(ro.get(m)) if ro else None
            p = pct_diff(vb, vo)
            r[f"{m}_base"], r[f"{m}_other"], r[f"{m}_pct"] = vb, vo, None if p is None else round(p, 2)
            r[f"{m}_better"] = None if p is None or p == 0 else ((p > 0) == (better == "higher"))
        rows.append(r)
    return rows


def diff_table(diff_rows: Sequence[Mapping], key: str = "config",
               metrics: Sequence[tuple[str, str]] = DIFF_METRICS) -> list[dict]:
    """A compact view: one column per metric holding the % difference (None where not comparable)."""
    return [{key: r[key], **{f"{m} %": r.get(f"{m}_pct") for m, _ in metrics}} for r in diff_rows]


def _fmt(x: float, fmt: str) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else format(x, fmt)  # 1,810 rather than 1.81e+03


def _pm(r: Mapping, col: str, fmt: str) -> str:
    """'12.3' or '12.3 ± 0.4' (the row's interval), formatted with fmt."""
    v = _num(r.get(col))
    h = plus_minus(v, r.get(f"{col}_lo"), r.get(f"{col}_hi"))
    return _fmt(v, fmt) + ("" if h is None else f" ± {_fmt(h, fmt)}")


def _overlaps(a: Mapping, b: Mapping, col: str) -> bool:
    """Whether two rows' intervals of col overlap (False when either has none)."""
    la, ha, lb, hb = (_num(x.get(f"{col}_{e}")) for x in (a, b) for e in ("lo", "hi"))
    return None not in (la, ha, lb, hb) and la <= hb and lb <= ha


def noise_note(rows: Sequence[Mapping]) -> str | None:
    """Says so when the rows were measured under different noise flags (or all noisy)."""
    noisy = [str(r.get("config")) for r in rows if r.get("noisy") is True]
    quiet = [str(r.get("config")) for r in rows if r.get("noisy") is False]
    if noisy and quiet:
        return (f"Measured under different noise flags: {'; '.join(noisy)} noisy, {'; '.join(quiet)} quiet. "
                "Differences between them may be the machine's, not the configurations': re-run the noisy ones.")
    if noisy and len(noisy) > 1:
        return "Every configuration was measured on a noisy machine: compare with care, or re-run them."
    return None


def machine_note(rows: Sequence[Mapping]) -> str | None:
    """Says so when the rows ran on different kinds of machine (the `machine` column: CPU model, GPU), as a
    sweep across a Ray cluster can (engine/cluster): their differences may be the machines'."""
    kinds: dict[str, list[str]] = {}
    for r in rows:
        if r.get("machine"):
            kinds.setdefault(str(r["machine"]), []).append(str(r.get("config")))
    if len(kinds) < 2:
        return None
    return ("Measured on different kinds of machine: " + "; ".join(f"{k} ({', '.join(v)})" for k, v in kinds.items())
            + ". Differences between them may be the machines', not the configurations'.")


def highlights(rows: Sequence[Mapping]) -> list[str]:
    """One-line answers: cheapest, fastest, smallest, most faithful, the Pareto set, and noise."""
    out = []

    def best(col, lower=True):
        cand = [r for r in rows if _num(r.get(col)) is not None]
        if not cand:
            return None
        return (min if lower else max)(cand, key=lambda r: _num(r.get(col)))

    note = noise_note(rows)
    if note:
        out.append(note)
    out += [n for n in [machine_note(rows)] if n]
    r = best("usd_per_1m_out")
    if r:
        out.append(f"Cheapest per output token: {r['config']} at ${_pm(r, 'usd_per_1m_out', '.4g')} per 1M output "
                   "tokens (one stream at the measured batch size).")
    r = best("tok_s", lower=False)
    if r:
        line = f"Fastest decode: {r['config']} at {_pm(r, 'tok_s', '.3g')} tokens/s."
        close = [x["config"] for x in rows if x is not r and _overlaps(r, x, "tok_s")]
        if close:
            line += f" Its interval overlaps {'; '.join(map(str, close))}: within noise of it."
        out.append(line)
    r = best("weights_total_MB")
    if r:
        out.append(f"Least memory for weights: {r['config']} ({r['weights_total_MB']:.0f} MB).")
    q = [x for x in rows if _num(x.get("quality_loss_kl")) is not None]
    if q:
        nonref = [x for x in q if x.get("precision") not in ("fp32",)] or q
        r = min(nonref, key=lambda x: x["quality_loss_kl"])
        out.append(f"Closest to fp32 among reduced precisions: {r['config']} (KL {r['quality_loss_kl']:.3g}).")
        front = [x["config"] for x in frontier_line(rows, "usd_per_1m_out", "quality_loss_kl")]
        if front:
            out.append("Cost-vs-quality frontier (nothing is both cheaper and closer to fp32): "
                       + "; ".join(front) + ".")
    sp = [x for x in rows if _num(x.get("speedup")) is not None]
    for x in sp:
        acc = _pm(x, "accept_rate", ".2f") if _num(x.get("accept_rate")) is not None else "n/a"
        out.append(f"Speculation: {x['config']} is {_pm(x, 'speedup', '.2f')}x the same target without a draft "
                   f"(acceptance {acc}).")
    return out
