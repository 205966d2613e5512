"""Your model on the dashboard: a folder typed on the Playground runs on the backend, and the result names the
family and the forward path that ran; a bad folder is refused by the backend, by name, with the fix; a run
recorded before records named either still renders."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests import families
from tests.app_helpers import ROOT, TIMEOUT, app_env, frame, problems  # noqa: F401

PAGE = str(ROOT / "pages/playground.py")
COMPARE = str(ROOT / "pages/compare.py")


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory) -> Path:
    """A tiny random-init Gemma 2 (soft-caps, sliding window, (1 + w) norms), saved by transformers with a tokenizer."""
    return families.build("gemma2", tmp_path_factory.mktemp("your-model") / "gemma2")


def playground(typed: str, precision: str = "int4", tokens: int = 8):
    """The Playground with 'your model' chosen and `typed` as the model, no draft, Generate pressed."""
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not problems(at)
    at.selectbox(key="pg-model").set_value("your-model")
    at.text_input(key="pg-your-model").set_value(typed)
    at.selectbox(key="pg-precision").set_value(precision)
    at.selectbox(key="pg-draft").set_value("none")
    at.number_input(key="pg-tokens").set_value(tokens)
    at.text_area(key="pg-prompt").set_value("def add(a, b):")
    at.button[0].click().run()  # the form's Generate button
    return at


def detail_caption(at) -> str:
    return next(c.value for c in at.caption if c.value.startswith("family:"))


def test_a_typed_gemma2_folder_runs_and_names_its_family_and_path(gemma2):
    at = playground(f"  {gemma2}  ")  # typed with stray spaces, as a pasted path often is
    assert not problems(at)
    html = next(m.value for m in at.markdown if "scl-stream" in m.value)
    assert html.count('class="tok tok-target"') == 8
    from pages import _ui

    rec = _ui.get_store().get_run(at.session_state["pg-last"]["run_id"])
    assert rec.config["model"] == str(gemma2)
    assert rec.config["architecture"]["family"] == "gemma2"
    k = rec.kernels
    # int4 Gemma 2 at head_dim 16: the fused C++ step has its features but not that shape, so every pass
    # took the PyTorch path, and says why
    assert k["reference_steps"] > 0 and k["fused_steps"] == 0
    why = max(k["reference_reasons"], key=k["reference_reasons"].get)
    assert "head_dim 16" in why
    caption = detail_caption(at)
    assert "family: gemma2" in caption
    assert "step path: PyTorch: head_dim 16" in caption.replace("\\", "")  # md-escaped on the page

    # the comparison table beside a catalog-era run: the family and the path per row
    old = _old_record()
    _ui.get_store().import_run(old)
    cmp = AppTest.from_file(COMPARE, default_timeout=TIMEOUT)
    cmp.session_state["comparison"] = [rec.run_id, old["run_id"]]
    cmp.run()
    assert not cmp.exception
    df = frame(cmp, "family", "path")
    assert list(df["family"]) == ["gemma2", "—"]
    assert df["path"][0].startswith("PyTorch: head_dim 16") and df["path"][1] == "—"


BAD = {  # a folder the user typed -> words the refusal must hold
    "not-there": ["there is no folder", "not-there", "on the backend's machine"],
    "no-config": ["has no config.json", "save_pretrained"],
    "bert": ["model type 'bert' is not supported", "use one of:", "gemma2", "qwen3"],
    "not-json": ["config.json is not valid JSON", "repair or re-download"],
}
CONFIGS = {"bert": json.dumps({"model_type": "bert", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
                               "num_attention_heads": 2}),
           "not-json": "{not json"}


def bad_folder(root: Path, kind: str) -> Path:
    folder = root / kind
    if kind != "not-there":
        folder.mkdir()
    if kind in CONFIGS:
        (folder / "config.json").write_text(CONFIGS[kind])
    return folder


@pytest.mark.parametrize("kind", list(BAD))
def test_a_bad_folder_is_refused_by_the_backend_naming_the_problem(tmp_path, kind):
    at = playground(str(bad_folder(tmp_path, kind)))
    assert not at.exception
    errors = " ".join(e.value for e in at.error)
    for words in BAD[kind]:
        assert words in errors, (words, errors)
    assert "field work.items[0].setup.model" in errors and "Fix:" in errors  # the backend's 400, with its fix
    assert "pg-job" not in at.session_state  # refused before anything was queued


def test_precision_loads_your_model(gemma2):
    at = AppTest.from_file(str(ROOT / "pages/precision.py"), default_timeout=TIMEOUT).run()
    at.selectbox(key="prec-model").set_value("your-model").run()  # the field appears once 'your model' is chosen
    at.text_input(key="prec-your-model").set_value(str(gemma2))
    at.selectbox(key="prec-precision").set_value("fp32")
    at.button(key="prec-load").click().run()
    assert not problems(at)
    assert at.session_state["prec-loaded"]["name"] == str(gemma2)
    assert any(str(gemma2) in h.value for h in at.subheader)


def test_compare_refuses_a_bad_folder_by_name(tmp_path):
    at = AppTest.from_file(COMPARE, default_timeout=TIMEOUT).run()
    at.selectbox(key="cmp-model").set_value("your-model").run()
    at.text_input(key="cmp-your-model").set_value(str(bad_folder(tmp_path, "no-config")))
    at.multiselect(key="cmp-drafts").set_value(["none"])
    at.number_input(key="cmp-reps").set_value(1).run()
    at.button(key="cmp-run").click().run()
    assert not at.exception
    assert any("has no config.json" in e.value and "field work.items[0].setup.model" in e.value for e in at.error)
    assert "sweep-job" not in at.session_state


def test_your_model_with_nothing_typed_says_so():
    at = playground("")
    assert not at.exception
    assert any("no model is typed" in e.value and "Fix:" in e.value for e in at.error)
    assert "pg-job" not in at.session_state


def test_an_old_record_renders_with_dashes():
    from pages import _ui

    old = _old_record()
    _ui.get_store().import_run(old)
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.session_state["pg-last"] = {"run_id": old["run_id"], "pieces": [("hello", "target")]}
    at.run()
    assert not problems(at)
    assert detail_caption(at).startswith("family: — · step path: —")


def _old_record() -> dict:
    """A schema-2 record of the catalog era: no architecture in its config, kernels without step counts."""
    from engine.measure.records import RunRecord

    return RunRecord(kind="playground", config={"model": "default-draft", "precision": "int4", "device": "cpu",
                                                "batch_size": 1, "draft": {"kind": "none"}},
                     metrics={"decode_tok_s": 20.0, "ttft_s": 0.2}, machine={}, kernels={"cpu": "avx2"},
                     output={"texts": ["hello"]}, schema_version=2).to_dict()
