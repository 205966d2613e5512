"""Reports: a named, annotated set of run records, saved in the store and shared as JSON or HTML.

The report document (stored as the body of a row in the store's `reports` table, and exported as
JSON) is:

    {"format": "serving-cost-lab-report", "report_version": 1, "record_schema_version": 1,
     "name": str, "notes": str, "created_at": str, "settings": {"usd_per_hour": float},
     "runs": [RunRecord.to_dict(), ...],
     "plan": {"workload": {...}, "savings": planner.savings.Savings.to_dict()}}   # optional

The plan is the Cost & capacity page's answer (the savings waterfall for a workload) when the user
saved it with the report; `check_plan` keeps only its known fields, each checked.

Imports are untrusted: `parse_report` refuses anything that is not that shape (bad JSON, another
format or version, a run record that fails `records.validate`, which checks every declared field's
type with pydantic) with a UserError naming the field, the problem and the fix. The HTML export is one self-contained
file rendered from templates/report.html.j2 by Jinja2 with autoescape: plotly.js is inlined (no CDN,
no network), a Content-Security-Policy forbids every external load, and all user-written or
imported text is escaped by the template engine.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone

from engine.common.errors import UserError
from engine.common.formulas import DEFAULT_USD_PER_HOUR
from engine.measure.records import READABLE_VERSIONS, SCHEMA_VERSION, RunRecord
from engine.present.rows import row

FORMAT = "serving-cost-lab-report"
REPORT_VERSION = 1
MAX_IMPORT_BYTES = 25 * 1024 * 1024
MAX_RUNS = 1000
MAX_NAME = 200
MAX_NOTES = 20_000
FIX = "import a .json file exported by the Reports page of this lab"


@dataclass
class Report:
    name: str
    notes: str
    records: list[RunRecord]
    usd_per_hour: float = DEFAULT_USD_PER_HOUR
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    report_id: str | None = None
    plan: dict | None = None  # {"workload": {...}, "savings": {...}}: the savings answer, when saved with it

    @property
    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.records]


# ---------------------------------------------------------------- checks

def check_name(name) -> str:
    if not isinstance(name, str):
        raise UserError(f"report name must be text, got {type(name).__name__}", "type a name")
    name = name.strip()
    if not name:
        raise UserError("a report needs a name", "type a name before saving")
    if len(name) > MAX_NAME:
        raise UserError(f"report name is {len(name)} characters long", f"use at most {MAX_NAME} characters")
    return name


def check_notes(notes) -> str:
    if notes is None:
        return ""
    if not isinstance(notes, str):
        raise UserError(f"report notes must be text, got {type(notes).__name__}", "write the notes as text")
    if len(notes) > MAX_NOTES:
        raise UserError(f"report notes are {len(notes)} characters long", f"keep notes under {MAX_NOTES} characters")
    return notes


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_record(d, where: str = "run") -> RunRecord:
    """records.validate (every declared field, field by field), then the row every view draws must build."""
    try:
        rec = RunRecord.from_dict(d)
    except UserError as e:
        raise UserError(f"{where}: {e.problem}", e.fix or FIX) from None
    try:
        row(rec, DEFAULT_USD_PER_HOUR)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise UserError(f"{where}: a field has the wrong type ({type(e).__name__}: {str(e)[:120]})", FIX) from None
    return rec


def _check_price(x) -> float:
    if not _is_num(x) or x <= 0:
        raise UserError(f"report setting usd_per_hour is {x!r}", "it must be a positive number of dollars per hour")
    return float(x)


_STEP_NUMS = ("gpus", "usd_per_month", "delta_usd_per_month", "usd_per_1m_output", "usd_per_1m_tokens",
              "low_usd_per_month", "high_usd_per_month")
_STEP_TEXT = ("step", "plan", "precision", "cause")
_SAVINGS_NUMS = ("saving_usd_per_month", "saving_pct", "saving_low_usd_per_month", "saving_high_usd_per_month")
_PRECISION_KEYS = ("precision", "speculation", "plan", "feasible", "gpus", "usd_per_month", "usd_per_1m_output",
                   "why_not")
_WORKLOAD_KEYS = ("model", "request_rate", "input_tokens", "output_tokens", "ttft_p90_s", "tpot_p90_s", "spec")
MAX_TEXT = 2000


def _num_or_none(v, where: str):
    if v is None:
        return None
    if not _is_num(v):
        raise UserError(f"{where} is {str(v)[:40]!r}, not a number", FIX)
    return v


def _text(v, where: str, allow_none: bool = True):
    if v is None and allow_none:
        return None
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise UserError(f"{where} should be text of at most {MAX_TEXT} characters", FIX)
    return v


def check_plan(d) -> dict | None:
    """A report's savings answer, its known fields only, each checked; UserError naming the field if not."""
    if d is None:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("savings"), dict):
        raise UserError("the report's plan should be an object with a 'savings' object", FIX)
    sv, wl = d["savings"], d.get("workload") or {}
    if not isinstance(wl, dict):
        raise UserError("plan.workload should be an object", FIX)
    steps = sv.get("steps")
    if not isinstance(steps, list) or not 1 <= len(steps) <= 3 or not all(isinstance(x, dict) for x in steps):
        raise UserError("plan.savings.steps should be a list of 1 to 3 steps", FIX)
    out_steps = []
    for i, st in enumerate(steps):
        where = f"plan.savings.steps[{i}]"
        o = {k: _num_or_none(st.get(k), f"{where}.{k}") for k in _STEP_NUMS}
        o.update({k: _text(st.get(k), f"{where}.{k}") for k in _STEP_TEXT})
        o["spec"], o["taken"] = bool(st.get("spec")), bool(st.get("taken", True))
        out_steps.append(o)
    precs = sv.get("precisions") or []
    if not isinstance(precs, list) or len(precs) > 64 or not all(isinstance(x, dict) for x in precs):
        raise UserError("plan.savings.precisions should be a list of at most 64 objects", FIX)
    out = {"gpu": _text(sv.get("gpu"), "plan.savings.gpu", False),
           "model": _text(sv.get("model"), "plan.savings.model"),
           "headline": _text(sv.get("headline"), "plan.savings.headline", False), "steps": out_steps,
           "precisions": [{k: (_text(x.get(k), f"plan.savings.precisions[{i}].{k}") if isinstance(x.get(k), str)
                               else _num_or_none(x.get(k), f"plan.savings.precisions[{i}].{k}")
                               if not isinstance(x.get(k), bool) else x.get(k)) for k in _PRECISION_KEYS}
                          for i, x in enumerate(precs)],
           "notes": [_text(n, "plan.savings.notes", False) for n in (sv.get("notes") or [])][:20]}
    out.update({k: _num_or_none(sv.get(k), f"plan.savings.{k}") for k in _SAVINGS_NUMS})
    work = {k: (_text(wl.get(k), f"plan.workload.{k}") if isinstance(wl.get(k), str) or wl.get(k) is None
                else _num_or_none(wl.get(k), f"plan.workload.{k}")) for k in _WORKLOAD_KEYS}
    return {"workload": work, "savings": out}


# ---------------------------------------------------------------- body <-> Report

def to_body(report: Report) -> dict:
    return {
        "format": FORMAT,
        "report_version": REPORT_VERSION,
        "record_schema_version": SCHEMA_VERSION,
        "name": report.name,
        "notes": report.notes,
        "created_at": report.created_at,
        "settings": {"usd_per_hour": report.usd_per_hour},
        "runs": [json.loads(r.to_json()) for r in report.records],
        **({"plan": report.plan} if report.plan else {}),
    }


def from_body(body, name: str | None = None, notes: str | None = None, report_id: str | None = None,
              created_at: str | None = None) -> Report:
    """Validate a report document (stored or imported) and return the Report; UserError if it is not one."""
    if not isinstance(body, dict):
        raise UserError(f"a report must be a JSON object, got {type(body).__name__}", FIX)
    fmt = body.get("format")
    if fmt != FORMAT:
        if isinstance(body.get("schema_version"), int) and "run_id" in body:
            raise UserError("this file is a single run record, not a report", "export a report from the Reports page")
        raise UserError(f"this is not a Serving Cost Lab report (format is {str(fmt)[:60]!r})", FIX)
    ver = body.get("report_version")
    if ver != REPORT_VERSION:
        raise UserError(f"report version {str(ver)[:20]} is not readable by this lab "
                        f"(it reads version {REPORT_VERSION})",
                        "export the report again with this version of the lab")
    rsv = body.get("record_schema_version", SCHEMA_VERSION)
    if rsv not in READABLE_VERSIONS:
        raise UserError(f"the report's runs use record schema version {str(rsv)[:20]}, this lab reads versions "
                        f"{', '.join(map(str, READABLE_VERSIONS))}",
                        "export the report again with this version of the lab")
    runs = body.get("runs")
    if not isinstance(runs, list):
        raise UserError("the report has no list of runs", FIX)
    if not runs:
        raise UserError("the report holds no runs", "save a report from a comparison with at least one run")
    if len(runs) > MAX_RUNS:
        raise UserError(f"the report holds {len(runs)} runs", f"keep reports to at most {MAX_RUNS} runs")
    records = [check_record(r, f"run {i + 1}") for i, r in enumerate(runs)]
    settings = body.get("settings") or {}
    if not isinstance(settings, dict):
        raise UserError("report settings should be an object", FIX)
    price = _check_price(settings.get("usd_per_hour", DEFAULT_USD_PER_HOUR))
    nm = check_name(name if name is not None else body.get("name"))
    nt = check_notes(notes if notes is not None else body.get("notes", ""))
    ca = created_at or body.get("created_at")
    if not isinstance(ca, str) or len(ca) > 64:
        ca = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Report(nm, nt, records, price, ca, report_id, check_plan(body.get("plan")))


# ---------------------------------------------------------------- store

def save(store, name: str, notes: str, records: list[RunRecord], usd_per_hour: float = DEFAULT_USD_PER_HOUR,
         plan: dict | None = None) -> str:
    """Save a comparison as a report, with the savings answer when given; returns the report id."""
    if not records:
        raise UserError("there is no comparison to save", "run the default comparison or a sweep first, "
                        "or pick previous runs on the Compare page")
    rep = Report(check_name(name), check_notes(notes), list(records), _check_price(usd_per_hour),
                 plan=check_plan(plan))
    return store.save_report(rep.name, rep.notes, to_body(rep))


def load(store, report_id: str) -> Report:
    row = store.get_report(report_id)
    return from_body(row["body"], name=row["name"], notes=row["notes"], report_id=row["report_id"],
                     created_at=row["created_at"])


def with_price(report: Report, usd_per_hour: float) -> Report:
    return Report(report.name, report.notes, report.records, _check_price(usd_per_hour), report.created_at,
                  report.report_id, report.plan)


# ---------------------------------------------------------------- JSON

def export_json(report: Report) -> str:
    return json.dumps(to_body(report), indent=1, allow_nan=False)


def _no_constants(c):
    raise UserError(f"the file contains {c}, which is not a number JSON allows", FIX)


def _too_big(n: int) -> UserError:
    return UserError(f"the file is {n / 1e6:.1f} MB", f"import reports under {MAX_IMPORT_BYTES // 2**20} MiB")


def parse_report(data) -> Report:
    """Parse an uploaded report (bytes or str). Refuses anything malformed with a UserError."""
    if isinstance(data, (bytes, bytearray)):
        if len(data) > MAX_IMPORT_BYTES:
            raise _too_big(len(data))
        try:
            data = bytes(data).decode("utf-8-sig")
        except UnicodeDecodeError:
            raise UserError("the file is not UTF-8 text", FIX) from None
    if not isinstance(data, str):
        raise UserError(f"cannot import a {type(data).__name__}", FIX)
    if len(data) > MAX_IMPORT_BYTES:
        raise _too_big(len(data))
    if not data.strip():
        raise UserError("the file is empty", FIX)
    try:
        body = json.loads(data, parse_constant=_no_constants)
    except UserError:
        raise
    except RecursionError:
        raise UserError("the file is nested too deeply to be a report", FIX) from None
    except ValueError as e:
        raise UserError(f"the file is not valid JSON ({str(e)[:120]})", FIX) from None
    return from_body(body)


def import_report(store, data) -> str:
    """Validate and save an uploaded report; returns the new report id."""
    rep = parse_report(data)
    return store.save_report(rep.name, rep.notes, to_body(rep))


# ---------------------------------------------------------------- HTML

_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "img-src data: blob:; font-src data:")
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{margin-bottom:4px} .meta{color:#666;font-size:0.9em}
.notes{white-space:pre-wrap;background:#f8f9fa;border-left:4px solid #adb5bd;padding:8px 12px}
table{border-collapse:collapse;font-size:0.85em;margin:12px 0;width:100%;display:block;overflow-x:auto}
.chart .js-plotly-plot,.chart .plot-container{max-width:100%}
th,td{border:1px solid #dee2e6;padding:4px 6px;text-align:right} th{background:#f1f3f5}
td.l,th.l{text-align:left} .grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.chart{border:1px solid #eee;min-height:340px} ul.hl li{margin:2px 0} dt{font-weight:600} dd{margin:0 0 4px 12px}
"""
_DEFINITIONS_EXTRA = [("quality loss", "mean KL divergence of each configuration's next-token distribution from "
                       "fp32's on the lab's eval text")]


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _figure_div(fig) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True},
                       default_height="340px")


def _env():
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("engine.present", "templates"), autoescape=select_autoescape(["j2"]),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["cell"] = _cell
    return env


def provenance(records) -> str:
    """What a report section measured, and where: the machines and models of its records, their count and dates."""
    from engine.common.record_setup import setup_from_record

    if not records:
        return "Measured: no runs."
    machines, models = [], []
    for r in records:
        m = r.machine or {}
        machines.append(" / ".join(str(x) for x in (m.get("cpu_model"), m.get("simd"), m.get("gpu_name")) if x)
                        or "an unrecorded machine")
        c = r.config or {}
        try:
            models.append(c.get("model") or setup_from_record(c).model)
        except Exception:
            models.append(str(c.get("model") or "?"))
    dates = sorted(str(r.created_at)[:10] for r in records)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return (f"Measured on {', '.join(dict.fromkeys(machines))}; model {', '.join(dict.fromkeys(models))}; "
            f"{len(records)} run(s), {when}.")


PROJECTED = ("Projected, not measured: the planner's roofline (docs/PLANNER.md) on the catalog's GPU figures and "
             "published measurements, calibrated by this lab's runs where it has them.")


def _after_heading(html: str, heading: str, line: str) -> str:
    """`line` as the first paragraph of the section whose heading starts with `heading`."""
    at = html.find(heading)
    if at < 0:
        return html
    end = html.find("</h3>", at) + len("</h3>")
    from markupsafe import escape

    return html[:end] + f'\n<p class="meta provenance">{escape(line)}</p>' + html[end:]


def export_html(report: Report) -> str:
    """One self-contained HTML file: plotly.js inline, a CSP forbidding network loads, text escaped."""
    from markupsafe import Markup
    from plotly.offline import get_plotlyjs

    from engine import present

    table = present.comparison_rows(report.records, report.usd_per_hour)
    mach = report.records[0].machine or {} if report.records else {}
    machine = ", ".join(str(x) for x in (mach.get("cpu_model"), mach.get("simd"), mach.get("gpu_name")) if x)
    names = present.view_columns(table, "report")
    pf = present.pareto_figure(table)
    html = _with_plan_section(_with_accuracy_section(_with_load_section(_env().get_template("report.html.j2").render(
        report=report, csp=Markup(_CSP), style=Markup(_STYLE), plotly_js=Markup(get_plotlyjs()), machine=machine,
        highlights=present.highlights(table), rows=present.display_rows(table, names),  # median ± h
        columns=[present.COLUMNS_BY_NAME[n] for n in names],
        charts=[_figure_div(present.bar_figure(table, col, title, unit, better))
                for col, title, unit, better in present.available_charts(table)],
        pareto=_figure_div(pf) if pf is not None else None, missing=present.missing_charts(table),
        definitions=present.definitions(names) + _DEFINITIONS_EXTRA), report), report), report)
    # each section says whether it is measured (where, on what) or projected
    runs = [r for r in report.records if r.kind not in ("load", "accuracy")]
    html = _after_heading(html, "<h3>Runs</h3>", provenance(runs))
    html = _after_heading(html, '<h3 id="under-load">', provenance([r for r in report.records if r.kind == "load"]))
    html = _after_heading(html, '<h3 id="task-accuracy">',
                          provenance([r for r in report.records if r.kind == "accuracy"]))
    return _after_heading(html, '<h3 id="your-bill">', PROJECTED)


_LOAD_SECTION = """<h3 id="under-load">Under load</h3>
<table id="load-runs"><thead><tr>{% for c in columns %}<th class="{{ 'l' if c.text }}" title="{{ c.definition }}">\
{{ c.label }}</th>{% endfor %}</tr></thead><tbody>
{% for r in rows %}<tr>{% for c in columns %}<td class="{{ 'l' if c.text }}">{{ r[c.name] | cell }}</td>\
{% endfor %}</tr>
{% endfor %}</tbody></table>
<h3>$ per 1M output tokens at the SLO</h3>
<table id="load-costs"><thead><tr><th class="l">configuration</th><th class="l">SLO</th><th>$/1M out at the SLO</th>
<th class="l">at</th><th>goodput tok/s</th><th>$/1M out, one stream</th><th class="l">why not</th></tr></thead><tbody>
{% for c in costs %}<tr><td class="l">{{ c.configuration }}</td><td class="l">{{ c.slo }}</td>\
<td>{{ c.usd_per_1m_out_at_slo | cell }}</td><td class="l">{{ c.at }}</td><td>{{ c.goodput_tok_s | cell }}</td>\
<td>{{ c.usd_per_1m_out_single_stream | cell }}</td><td class="l">{{ c.why }}</td></tr>
{% endfor %}</tbody></table>
{% if kv_rows %}<h3>KV cache quantized or not: $ per 1M output tokens at the SLO, at one KV budget</h3>
<table id="load-kv-costs"><thead><tr>{% for k, label in kv_labels.items() %}<th class="l">{{ label }}</th>{% endfor %}\
</tr></thead><tbody>
{% for r in kv_rows %}<tr>{% for k in kv_labels %}<td class="l">{{ r[k] | cell }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>{% endif %}
{% for v in verdicts %}<p class="meta">{{ v }}</p>{% endfor %}
<div class="grid">{% for fig in charts %}<div class="chart">{{ fig | safe }}</div>{% endfor %}</div>
"""


def _with_load_section(html: str, report: Report) -> str:
    """The report's `load` records in their own section (table, $/1M at the SLO, charts), before the
    definitions; the page unchanged when it holds none."""
    from engine.present import load_cost, load_view

    recs = [r for r in report.records if r.kind == "load"]
    if not recs:
        return html
    rows = load_view.load_rows(recs)
    costs = load_cost.costs_at_slo(recs, report.usd_per_hour)
    pairs = load_cost.crossover_pairs(recs)
    figs = [load_view.throughput_figure(recs), load_view.goodput_figure(recs), load_view.slo_cost_figure(costs)]
    figs += [load_view.crossover_figure(pairs)] if pairs else []
    section = _env().from_string(_LOAD_SECTION).render(
        columns=[load_view.BY_NAME[n] for n in load_view.load_columns(rows)], rows=rows,
        costs=load_cost.cost_rows(costs), verdicts=[x.verdict for x in pairs],
        kv_rows=load_cost.kv_cost_rows(recs, report.usd_per_hour), kv_labels=load_cost.KV_COST_LABELS,
        charts=[_figure_div(f) for f in figs])
    at = html.rfind("<h3>Definitions</h3>")
    return html[:at] + section + html[at:] if at >= 0 else html.replace("</body>", section + "</body>")


_ACCURACY_SECTION = """<h3 id="task-accuracy">Task accuracy beside KLD</h3>
<table id="accuracy-runs"><thead><tr>{% for c in columns %}<th class="l">{{ c }}</th>{% endfor %}</tr></thead><tbody>
{% for r in rows %}<tr>{% for c in columns %}<td class="l">{{ r[c] | cell }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
<p class="meta">{{ note }}</p>
"""


def _with_accuracy_section(html: str, report: Report) -> str:
    """The report's accuracy records, paired against the first, with KLD beside (before the definitions)."""
    from engine.present.accuracy_view import COLUMNS, NOTE, accuracy_rows

    recs = [r for r in report.records if r.kind == "accuracy"]
    if not recs:
        return html
    section = _env().from_string(_ACCURACY_SECTION).render(columns=COLUMNS, rows=accuracy_rows(recs, report.records),
                                                           note=NOTE)
    at = html.rfind("<h3>Definitions</h3>")
    return html[:at] + section + html[at:] if at >= 0 else html.replace("</body>", section + "</body>")


_PLAN_SECTION = """<h3 id="your-bill">Your bill: what quantization and speculation save</h3>
<p id="plan-headline"><b>On {{ sv.gpu }}:</b> {{ sv.headline }}</p>
<p class="meta">{{ wl.model }}: {{ wl.request_rate | cell }} req/s, {{ wl.input_tokens | cell }} in /
{{ wl.output_tokens | cell }} out tokens, SLO p90 TTFT {{ wl.ttft_p90_s | cell }} s, \
TPOT {{ wl.tpot_p90_s | cell }} s</p>
<div class="chart">{{ fig | safe }}</div>
<table id="plan-steps"><thead><tr><th class="l">step</th><th class="l">plan</th><th>GPUs</th><th>$/month</th>
<th>change</th><th>band low</th><th>band high</th><th>$/1M out</th><th class="l">cause</th></tr></thead><tbody>
{% for s in sv.steps %}<tr><td class="l">{{ s.step }}</td>\
<td class="l">{{ s.plan }}{{ "" if s.taken else " (not taken)" }}</td>\
<td>{{ s.gpus | cell }}</td><td>{{ s.usd_per_month | cell }}</td><td>{{ s.delta_usd_per_month | cell }}</td>\
<td>{{ s.low_usd_per_month | cell }}</td><td>{{ s.high_usd_per_month | cell }}</td>\
<td>{{ s.usd_per_1m_output | cell }}</td>\
<td class="l">{{ s.cause }}</td></tr>
{% endfor %}</tbody></table>
{% for n in sv.notes %}<p class="meta">{{ n }}</p>{% endfor %}
"""


def _with_plan_section(html: str, report: Report) -> str:
    """The savings answer saved with the report (waterfall, steps, causes, band) before its runs."""
    if not report.plan:
        return html
    from engine.present.planning import savings_figure

    sv, wl = report.plan["savings"], report.plan.get("workload") or {}
    section = _env().from_string(_PLAN_SECTION).render(sv=sv, wl=wl, fig=_figure_div(savings_figure(sv)))
    at = html.find("<h3>Runs</h3>")
    return html[:at] + section + html[at:] if at >= 0 else html.replace("</body>", section + "</body>")


def html_filename(report: Report, ext: str = "html") -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in report.name)[:60].strip("-") or "report"
    return f"{safe}.{ext}"
