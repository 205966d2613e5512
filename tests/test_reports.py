"""engine/reports.py: report assembly, the self-contained HTML export, JSON export/import and hostile files."""
import copy
import json
import re

import pytest

from engine.present import reports
from engine.common.errors import UserError
from engine.infer.loader import make_spec
from engine.measure.records import RunRecord
from engine.measure.pool import ModelPool
from engine.measure.runs import RunConfig, execute

EVIL = "<script>alert('pwned')</script>"


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    """Two real (tiny-model) runs: plain int8, and fp32 with an int4 self-draft."""
    from tests.tiny import tiny_model

    pool = ModelPool(keep=8)
    for p in ("fp32", "int8", "int4"):
        spec = make_spec(p, 32)
        lm = tiny_model(0)
        if p != "fp32":
            from engine.quant import quantize_model, weight_breakdown

            lm.model = quantize_model(lm.model, spec, "cpu")
            lm.weights = weight_breakdown(lm.model)
        lm.spec, lm.name = spec, "tiny"
        pool._models[("tiny", spec, "cpu")] = lm
    a = execute(RunConfig.of(model="tiny", precision="int8", group_size=32, max_new_tokens=8, prompt="hello"), pool)
    b = execute(RunConfig.of(model="tiny", precision="fp32", group_size=32, draft="self", draft_precision="int4",
                          gamma=3, max_new_tokens=8, prompt="hello", baseline=True), pool)
    return [a, b]


def evil_record(rec: RunRecord) -> RunRecord:
    d = copy.deepcopy(rec.to_dict())
    d["config"]["model"] = EVIL
    d["run_id"] = "evil0000"
    return RunRecord.from_dict(d)


def _outside_plotly(doc: str) -> str:
    """The document without the inlined plotly.js bundle (which carries map-tile URLs as inert strings)."""
    return re.sub(r'<script type="text/javascript" id="plotly-inline">.*?</script>', "", doc, flags=re.S)


# ---------------------------------------------------------------- HTML

def test_html_is_self_contained(tiny_records):
    rep = reports.Report("CPU precision study", "int8 vs self-draft", tiny_records, 0.25)
    doc = reports.export_html(rep)
    assert doc.startswith("<!DOCTYPE html>")
    # plotly inline: the bundle itself, and figures drawn with it
    assert 'id="plotly-inline"' in doc and "Plotly.newPlot" in doc
    assert len(doc) > 3_000_000
    # nothing is loaded from anywhere: no src/href to a URL, no CDN, a CSP that forbids network loads
    assert not re.search(r"<script[^>]+src=", doc, re.I)
    assert not re.search(r"<link[^>]+href=", doc, re.I)
    rest = _outside_plotly(doc)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", rest, re.I)
    assert "cdn" not in rest.lower()
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/", rest, re.I)
    assert "default-src 'none'" in doc
    # the run table and the answer are there
    assert "CPU precision study" in doc and "tiny@int8" in doc and "$ per 1M output tokens" in doc


def test_html_escapes_user_text(tiny_records):
    rep = reports.Report(f"Q3 {EVIL}", f"notes {EVIL} & <img src=x onerror=alert(1)>",
                         [evil_record(tiny_records[0]), tiny_records[1]], 0.25)
    doc = _outside_plotly(reports.export_html(rep))
    assert "<script>alert" not in doc
    assert "<img src=x" not in doc
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in doc  # name, notes and the run label
                                                                         # (Jinja2 autoescape)
    # chart labels are JSON-encoded and html-escaped: no raw closing tag can end the figure's script
    assert "</script><script>" not in doc


def test_html_filename_is_safe():
    rep = reports.Report("../../etc/passwd <x>", "", [], 1.0)
    name = reports.html_filename(rep)
    assert "/" not in name and "<" not in name and name.endswith(".html")


# ---------------------------------------------------------------- JSON and the store

def test_json_round_trip(tiny_records):
    rep = reports.Report("round trip", "some notes\nline 2", tiny_records, 0.4)
    text = reports.export_json(rep)
    back = reports.parse_report(text)
    assert back.name == "round trip" and back.notes == "some notes\nline 2" and back.usd_per_hour == 0.4
    assert [r.run_id for r in back.records] == [r.run_id for r in tiny_records]
    assert [r.to_dict() for r in back.records] == [json.loads(r.to_json()) for r in tiny_records]
    # bytes (an upload) work too, with or without a BOM
    assert reports.parse_report(text.encode()).name == "round trip"
    assert reports.parse_report(b"\xef\xbb\xbf" + text.encode()).name == "round trip"


def test_store_round_trip_and_import(tiny_records, store):
    rid = reports.save(store, "  saved  ", "n", tiny_records, 0.3)
    rep = reports.load(store, rid)
    assert rep.name == "saved" and rep.report_id == rid and len(rep.records) == 2 and rep.usd_per_hour == 0.3
    rid2 = reports.import_report(store, reports.export_json(rep))
    assert rid2 != rid and reports.load(store, rid2).run_ids == rep.run_ids
    assert {r["report_id"] for r in store.list_reports()} == {rid, rid2}
    store.delete_report(rid)
    assert [r["report_id"] for r in store.list_reports()] == [rid2]


def test_save_refuses_empty_and_unnamed(tiny_records, store):
    with pytest.raises(UserError, match="no comparison"):
        reports.save(store, "x", "", [], 1.0)
    with pytest.raises(UserError, match="needs a name"):
        reports.save(store, "   ", "", tiny_records, 1.0)
    with pytest.raises(UserError, match="usd_per_hour"):
        reports.save(store, "x", "", tiny_records, 0)


def test_script_in_name_is_kept_as_text_not_markup(tiny_records):
    rep = reports.parse_report(reports.export_json(reports.Report(EVIL, EVIL, tiny_records, 1.0)))
    assert rep.name == EVIL  # stored as the text the user typed; escaped wherever it is shown
    doc = _outside_plotly(reports.export_html(rep))
    assert EVIL not in doc


# ---------------------------------------------------------------- hostile imports

def _body(tiny_records):
    return json.loads(reports.export_json(reports.Report("r", "", tiny_records, 1.0)))


def _mutated(tiny_records, f):
    b = _body(tiny_records)
    f(b)
    return json.dumps(b)


@pytest.mark.parametrize("payload, message", [
    ("", "empty"),
    ("{not json", "not valid JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('{"format": "something-else"}', "not a Serving Cost Lab report"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    ("[" * 100000 + "]" * 100000, "nested too deeply|not valid JSON"),
])
def test_import_refuses_garbage(payload, message):
    with pytest.raises(UserError, match=message):
        reports.parse_report(payload)


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b.update(report_version=99), "report version 99"),
    (lambda b: b.update(record_schema_version=99), "record schema version 99"),
    (lambda b: b["runs"][0].update(schema_version=99), "run 1: run record has schema version 99"),
    (lambda b: b.pop("runs"), "no list of runs"),
    (lambda b: b.update(runs=[]), "holds no runs"),
    (lambda b: b["runs"][1].pop("metrics"), "run 2: run record lacks the field 'metrics'"),
    (lambda b: b["runs"][0].update(kind="<script>"), "kind"),
    (lambda b: b["runs"][0]["metrics"].update(decode_tok_s="fast"), "metrics.decode_tok_s should be a number"),
    (lambda b: b["runs"][1]["metrics"]["spec"].update(acceptance_rate=[1]), "metrics.spec.acceptance_rate"),
    (lambda b: b["runs"][0]["config"].update(draft="model"), "config.draft should be an object"),
    (lambda b: b["runs"][0]["config"].update(batch_size="1"), "batch_size"),
    (lambda b: b["runs"][0].update(run_id="x" * 65), "run_id is longer than 64"),
    (lambda b: b.update(runs={"a": 1}), "no list of runs"),
    (lambda b: b["runs"].__setitem__(0, "<script>"), "run 1: a run record must be a JSON object"),
    (lambda b: b["runs"][0]["metrics"].update(quantized_layers="half"), "quantized_layers"),
    (lambda b: b["runs"][0]["config"].update(model=["x"]), "config.model should be text"),
    (lambda b: b["runs"][0].update(kernels="avx"), "field kernels should be an object"),
    (lambda b: b.update(name=["x"]), "name must be text"),
    (lambda b: b.update(name=""), "needs a name"),
    (lambda b: b.update(notes="x" * (reports.MAX_NOTES + 1)), "notes are"),
    (lambda b: b.update(settings={"usd_per_hour": -1}), "usd_per_hour"),
])
def test_import_refuses_wrong_schema(tiny_records, mutate, message):
    with pytest.raises(UserError, match=message):
        reports.parse_report(_mutated(tiny_records, mutate))


def test_import_refuses_nan_and_infinity(tiny_records):
    text = reports.export_json(reports.Report("r", "", tiny_records, 1.0))
    text = text.replace('"ttft_s": ', '"ttft_s": NaN, "x": ', 1)
    with pytest.raises(UserError, match="NaN"):
        reports.parse_report(text)


def test_import_refuses_a_single_run_record(tiny_records):
    with pytest.raises(UserError, match="single run record"):
        reports.parse_report(tiny_records[0].to_json())


def test_import_refuses_huge_files():
    with pytest.raises(UserError, match="MiB"):
        reports.parse_report(b" " * (reports.MAX_IMPORT_BYTES + 1))


def test_errors_name_the_fix(tiny_records):
    try:
        reports.parse_report("{not json")
    except UserError as e:
        assert "Fix:" in str(e) and "export" in str(e)


# ---------------------------------------------------------------- the savings answer

def _savings_plan() -> dict:
    from engine import planner
    from engine.planner.savings import savings

    sv = savings(planner.Workload(model="llama-3.1-70b", request_rate=0.01, input_tokens=1024, output_tokens=256),
                 planner.load_gpus(), planner.shapes.load_models(), None, "H100 SXM").to_dict()
    return {"workload": sv["workload"], "savings": sv}


def test_a_report_carries_the_savings_waterfall(tiny_records, store):
    """Saved with the Cost & capacity page's answer, a report keeps it through the store, JSON and HTML."""
    plan = _savings_plan()
    rid = reports.save(store, "bill", "for the customer", tiny_records, 0.25, plan)
    rep = reports.load(store, rid)
    sv = rep.plan["savings"]
    assert sv["headline"] == plan["savings"]["headline"] and "saves $5,022/month" in sv["headline"]
    assert [s["step"] for s in sv["steps"]] == ["baseline", "+ quantization", "+ speculation"]
    assert sv["steps"][1]["delta_usd_per_month"] == plan["savings"]["steps"][1]["delta_usd_per_month"]
    assert rep.plan["workload"]["model"] == "llama-3.1-70b"
    again = reports.parse_report(reports.export_json(rep))
    assert again.plan == rep.plan
    doc = reports.export_html(rep)
    body = _outside_plotly(doc)
    assert body.index('id="your-bill"') < body.index("<h3>Runs</h3>")
    # each section says whether it is projected or measured, and where (issue 40.7)
    bill = body[body.index('id="your-bill"'):body.index("<h3>Runs</h3>")]
    runs = body[body.index("<h3>Runs</h3>"):]
    assert "Projected, not measured" in bill and "Measured on" not in bill
    m = tiny_records[0].machine
    assert f"Measured on {m['cpu_model']} / {m['simd']}" in runs[:runs.index("</p>")] and "model tiny" in runs
    assert '"type":"waterfall"' in body and "fits on 1 GPU(s) instead of 2" in body
    # a report without a plan has no such section
    assert 'id="your-bill"' not in _outside_plotly(reports.export_html(reports.Report("x", "", tiny_records)))


def test_an_imported_plan_is_checked_field_by_field(tiny_records):
    body = json.loads(reports.export_json(reports.Report("x", "", tiny_records, plan=_savings_plan())))
    bad = copy.deepcopy(body)
    bad["plan"]["savings"]["steps"][0]["usd_per_month"] = "lots"
    with pytest.raises(UserError, match=r"plan\.savings\.steps\[0\]\.usd_per_month"):
        reports.parse_report(json.dumps(bad))
    bad = copy.deepcopy(body)
    bad["plan"]["savings"]["steps"] = []
    with pytest.raises(UserError, match="1 to 3 steps"):
        reports.parse_report(json.dumps(bad))
    evil = copy.deepcopy(body)
    evil["plan"]["savings"]["headline"] = EVIL
    evil["plan"]["savings"]["steps"][1]["cause"] = EVIL
    evil["plan"]["savings"]["extra"] = "kept out"
    rep = reports.parse_report(json.dumps(evil))
    assert "extra" not in rep.plan["savings"]
    doc = _outside_plotly(reports.export_html(rep))
    assert EVIL not in doc and "&lt;script&gt;" in doc
