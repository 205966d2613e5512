"""The Load test page in headless Chromium: the page has the backend start our engine (0.5B, int4), send a short
sweep (ShareGPT chat, concurrency 1 and 2, 3 requests of at most 8 tokens) and stop the server by its PID; the
page draws the charts. Its screenshot goes where test_browser_e2e's go (a temporary folder, or SCL_E2E_SHOTS):
docs/screenshots/09-load-test.png is a copy made by hand, never by a test.

Never runs `playwright install`: it needs Debian's chromium at /usr/bin/chromium and skips without it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.test_browser_e2e import (CHROMIUM, CHROMIUM_ARGS, assert_answer_first, assert_clean, browser_missing,
                                    running_dashboard, settle, shot)

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _skip_reason() -> str | None:
    from engine.peers import servers

    return browser_missing() or servers.unavailable_reason(servers.ServerSpec(servers.OURS))


def _cache_without_llama_cpp(where: Path) -> Path:
    """A cache holding the lab's converted models, GGUFs and kernels (links into this machine's) but not llama.cpp's
    server and tools: the backend's machine, as this test gives it one the dashboard's lacks."""
    from engine.common.paths import cache_dir

    where.mkdir(parents=True, exist_ok=True)
    for entry in cache_dir().iterdir():
        if not entry.name.startswith(("llama-server-", "llama-tools-")):
            (where / entry.name).symlink_to(entry)
    return where


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    data = tmp_path_factory.mktemp("load-e2e-data")
    backend_env = {"SCL_CACHE_DIR": str(_cache_without_llama_cpp(data / "backend-cache")), "SCL_LLAMA_SERVER": "",
                   "PATH": os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                           if not (Path(p) / "llama-server").exists())}
    with running_dashboard(data, backend_env=backend_env) as running:
        yield running


@pytest.fixture
def load_page(app):
    """Chromium on the Load test page at 1440 x 900, drawn."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"{app['url']}/load", timeout=90_000)
            page.get_by_role("heading", name="Load test").first.wait_for(timeout=90_000)
            settle(page, 120)
            yield page
        finally:
            browser.close()


def test_the_pages_offer_what_the_backends_machine_has(app, load_page):
    """Issue 40.4: the backend reports which servers and peers its machine can run (/v1/info); the Load and Compare
    pages offer exactly those, whatever the dashboard's own machine has (here llama.cpp's server and tools are
    missing from the backend's cache only)."""
    from engine.backend.client import Backend

    info = Backend(app["backend"]["url"]).info()
    assert info["servers"]["llama-server"] and "not built" in info["servers"]["llama-server"]
    assert info["peers"]["llama.cpp Q4_K_M-imatrix"]
    page = load_page
    offered = {"llama-server": "llama-server (llama.cpp", "vllm": "vLLM's CPU build (bf16"}
    for kind, label in offered.items():
        shown = page.get_by_text(label).count() > 0
        assert shown == (info["servers"][kind] is None), (kind, info["servers"][kind])
    assert page.get_by_text("llama-server: llama-server is not built").first.is_visible()
    page.goto(f"{app['url']}/compare", timeout=90_000)
    page.get_by_role("heading", name="Compare (sweep)").first.wait_for(timeout=90_000)
    settle(page, 120)
    page.get_by_text("Peer systems as rows").first.click()
    settle(page)
    missing = {k for k, why in info["peers"].items() if why}
    text = page.locator('[data-testid="stExpander"]', has_text="Peer systems as rows").first.inner_text()
    assert "llama.cpp Q4_K_M-imatrix" in text and "llama-imatrix" in text
    assert text.count("Not offered:") == len(missing)
    assert_clean(page, "pages offering the backend's peers", app["log"])


def _fill(page, label: str, value: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(value)
    box.press("Enter")
    settle(page)


def test_load_test_page_in_a_browser(app, load_page):
    page = load_page
    assert_clean(page, "load page", app["log"])
    assert page.locator('[data-testid="stSidebarNav"] a', has_text="Load test").count() == 1
    # docs' screenshot: SCL_E2E_LOAD_REQUESTS and SCL_E2E_TOKENS give it a real length (docs/DASHBOARD.md)
    n_req = os.environ.get("SCL_E2E_LOAD_REQUESTS", "3")
    _fill(page, "Workload", f"chat:{n_req}")
    _fill(page, "Requests per load point", n_req)
    _fill(page, "Longest answer (tokens)", os.environ.get("SCL_E2E_TOKENS", "8"))
    _fill(page, "TTFT SLO (s)", "60")
    _fill(page, "Concurrency", "1,2")
    page.get_by_role("button", name="Run load test").click()
    page.get_by_role("button", name="Cancel").first.wait_for(timeout=60_000)
    # Finished, or the job's end says why not (a server that did not start): no waiting out the timeout.
    page.get_by_text(re.compile(r"load test: 2 of 2 runs finished|Not measured: |nothing was measured")
                     ).first.wait_for(timeout=900_000)
    failed = page.get_by_text(re.compile(r"Not measured: |nothing was measured"))
    assert not failed.count(), failed.first.inner_text()
    settle(page)
    assert_clean(page, "after the load test", app["log"])
    assert_answer_first(page, "load test")
    shot(page, "09-load-test")
    # the evidence in tabs under the answer: the table first, the charts and the cost a click away
    assert page.locator('[data-testid="stDataFrame"]').first.is_visible()
    page.get_by_role("tab", name="Charts (3)").click()
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 3",
                           timeout=60_000)
    page.get_by_role("tab", name="Cost at the SLO").click()
    page.get_by_text("$ per 1M output tokens at the SLO").first.wait_for(state="visible", timeout=30_000)
    # the backend stopped the server it started, by its PID; the records landed in its store and in the dashboard's
    from engine.measure.store import Store

    assert {r.run_id for r in Store(app["data"] / "dashboard" / "lab.sqlite").list_runs(kind="load")} == \
        {r.run_id for r in Store(app["data"] / "lab.sqlite").list_runs(kind="load")}
    recs = Store(app["data"] / "lab.sqlite").list_runs(kind="load")
    assert len(recs) == 2 and {r.config["system"] for r in recs} == {"serving-cost-lab"}
    pid = recs[0].config["server"]["launch"]["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
