"""Reports page: save the current comparison, open, export, compare two with % differences, import, delete."""

from streamlit.testing.v1 import AppTest

from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, local_pool, problems  # noqa: F401

PAGE = str(ROOT / "pages/reports.py")
EVIL = "<script>alert(1)</script>"


def runs(precisions=("fp32", "int4")):
    from engine.measure.runs import RunConfig, execute
    from pages import _ui

    return [execute(RunConfig.of(model="tiny", precision=p, max_new_tokens=4), local_pool(), _ui.get_store()).run_id
            for p in precisions]


def page_with(ids):
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["comparison"] = ids
    return at.run()


def save(at, name, notes=""):
    at.text_input(key="rep-name").input(name)
    at.text_area(key="rep-notes").input(notes)
    at.button[0].click()  # the form's Save button
    return at.run()


def test_empty_page_explains_what_to_do():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    assert any("no current comparison" in i.value for i in at.info)
    assert any("No saved reports yet" in i.value for i in at.info)


def test_save_open_export_and_hostile_text_is_not_markup():
    at = save(page_with(runs()), f"run {EVIL}", f"notes {EVIL}")
    assert not problems(at)
    assert any("Saved report" in s.value for s in at.success)
    # the name is shown escaped (markdown/HTML characters backslash-escaped), the notes as plain text
    assert any(m.value.startswith("### run \\<script\\>") for m in at.markdown)
    assert any(t.value == f"notes {EVIL}" for t in at.text)
    labels = [b.label for b in at.get("download_button")]
    assert labels == ["Export HTML", "Export JSON"]
    assert len(frame(at, "config", "tok_s")) == 2
    assert len(at.get("plotly_chart")) >= 6


def test_save_without_name_is_refused():
    at = save(page_with(runs(("int8",))), "   ")
    assert not at.exception
    assert any("a report needs a name" in e.value for e in at.error)


def test_compare_two_reports_shows_percent_differences():
    from engine.present import reports
    from pages import _ui

    store = _ui.get_store()
    a = [store.get_run(i) for i in runs(("fp32", "int8"))]
    b = [store.get_run(i) for i in runs(("fp32", "int8"))]
    reports.save(store, "before", "", a, 1.0)
    reports.save(store, "after", "", b, 1.0)
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    diff = frame(at, "config", "tok_s %")
    assert list(diff["config"]) == ["tiny@fp32", "tiny@int8"]
    assert diff["tok_s %"].notna().all()


def test_import_json_and_refuse_hostile_files():
    from engine.present import reports
    from pages import _ui

    store = _ui.get_store()
    rep = reports.Report("shared by a colleague", "n", [store.get_run(i) for i in runs(("int4",))], 0.5)
    good = reports.export_json(rep).encode()
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.file_uploader(key="rep-import").upload("r.json", good, "application/json")
    at.run()
    assert not problems(at)
    assert [r["name"] for r in store.list_reports()] == ["shared by a colleague"]
    assert any("Imported the report" in s.value for s in at.success)

    for payload, message in [(b"{not json", "not valid JSON"),
                             (good.replace(b'"report_version": 1', b'"report_version": 7'), "report version 7"),
                             (b'{"format": "serving-cost-lab-report", "report_version": 1, "runs": [{"kind": "x"}]}',
                              "run 1: run record lacks the field")]:
        at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
        at.file_uploader(key="rep-import").upload("bad.json", payload, "application/json")
        at.run()
        assert not at.exception
        assert any(message in e.value for e in at.error), message
    assert len(store.list_reports()) == 1


def test_open_as_current_comparison_and_delete():
    from engine.present import reports
    from pages import _ui

    store = _ui.get_store()
    ids = runs(("fp32",))
    reports.save(store, "to delete", "", [store.get_run(i) for i in ids], 1.0)
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.button(key="rep-use").click().run()
    assert at.session_state["comparison"] == ids
    assert at.button(key="rep-delete").disabled
    at.checkbox(key="rep-confirm-delete").check().run()
    at.button(key="rep-delete").click().run()
    assert not problems(at)
    assert store.list_reports() == []
    assert any("Deleted report" in s.value for s in at.success)


def test_a_saved_version_1_report_still_opens():
    """A report saved before schema 2 (its records at version 1, one at batch 4) opens and is drawn."""
    import json

    from engine.measure.records import SCHEMA_VERSION, RunRecord
    from engine.present import reports
    from pages import _ui

    store = _ui.get_store()
    recs = [store.get_run(i) for i in runs(("fp32", "int8"))]
    body = json.loads(reports.export_json(reports.Report("v1 study", "saved by schema 1", recs, 0.2)))
    body["record_schema_version"] = 1
    for r in body["runs"]:
        r["schema_version"] = 1
    body["runs"][1]["config"]["batch_size"] = 4
    body["runs"][1]["metrics"]["bw_efficiency"] = 2.0
    rid = store.save_report("v1 study", "saved by schema 1", body)
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.selectbox(key="rep-select").set_value(rid).run()
    assert not problems(at)
    t = frame(at, "config", "tok_s")
    assert len(t) == 2
    assert sorted(t["bw_eff"].dropna().tolist())[-1] == 0.5  # read as 2.0 / batch 4, the v1 defect corrected
    assert store.get_report(rid)["body"]["runs"][1]["metrics"]["bw_efficiency"] == 2.0  # the stored body is untouched
    assert RunRecord.from_dict(body["runs"][0]).schema_version == SCHEMA_VERSION == 3
