"""The dashboard in a real browser: `streamlit run app.py` driving `python -m engine backend`, in headless
Debian Chromium via Playwright.

Opens every page and checks that no exception or error box is shown, runs the Home page's default
comparison on the tiny random-init pair (4 new tokens, quality off, over the default workload chat:2,code:2,
each prompt 3 times), streams a speculative generation in the playground, checks the charts, saves a report,
exports it as HTML, and opens that file with every network request blocked to prove it renders offline.
This test proves the UI flow, and the tiny pair proves it as well as the real one in a third of the time;
the real 0.5B through a backend process is tests/test_headlines.py's dashboard-vs-CLI guard (and
SCL_E2E_REAL=1 runs this flow on it). The comparison runs in the backend:
a test reads /proc/<pid>/maps of both processes and finds the lab's kernels (and, on real models, the
weights) mapped in the backend and none of them in the dashboard. Screenshots go to a temporary folder,
or to SCL_E2E_SHOTS when set (docs/screenshots/ holds copies of a real-model run for docs/DASHBOARD.md);
no test writes a tracked file.

Options (environment):
  SCL_E2E_REAL=1        the REAL 0.5B pair instead (0.5B target with its own int4 weights as self-draft)
  SCL_E2E_PLAYGROUND=1  on the real pair, also stream a short speculative generation in the playground
  SCL_E2E_QUALITY=1     keep "measure quality vs fp32" on (the cost-vs-quality frontier; a few minutes more)
  SCL_E2E_TIMEOUT=s     how long the default comparison may take (default 900 s)
  SCL_E2E_PEERS=1       also a Compare sweep of our int8 and int4 beside llama.cpp's Q8_0 and Q4_K_M and
                        transformers at bf16 (docs/screenshots/07-compare-peers.png comes from it, SCL_E2E_REAL=1)

Never runs `playwright install`: it needs Debian's chromium at /usr/bin/chromium and skips without it.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOTS = Path(os.environ.get("SCL_E2E_SHOTS") or tempfile.mkdtemp(prefix="scl-e2e-shots-"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
TINY = os.environ.get("SCL_E2E_REAL") != "1"
QUALITY = os.environ.get("SCL_E2E_QUALITY") == "1"
RUN_TIMEOUT_S = float(os.environ.get("SCL_E2E_TIMEOUT", "900"))
EVIL = "<script>alert('x')</script>"

pytestmark = pytest.mark.slow


def browser_missing() -> str | None:
    """Why no headless browser can run here (Debian's chromium, the playwright package), or None."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing: apt-get install -y chromium (never `playwright install`)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: .venv/bin/pip install playwright"
    return None


def _skip_reason() -> str | None:
    if browser_missing():
        return browser_missing()
    if not TINY:
        from engine.infer.catalog import CATALOG, _cache_valid

        if not _cache_valid(CATALOG["qwen2.5-coder-0.5b"]):
            return "the 0.5B model is not converted yet: run `make models`"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, log: Path, what: str, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{what} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group started here (nothing else), SIGKILL if it lingers."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextlib.contextmanager
def running_backend(data: Path, env_extra: dict | None = None, tiny: bool = False):
    """`python -m engine backend` (with the tiny test models: `python -m tests.tiny_backend`) on a free loopback
    port, its store in `data`; stopped by its process group on the way out. Yields {url, log, proc}."""
    port = _free_port()
    log = data / "backend.log"
    env = dict(os.environ, SCL_DATA_DIR=str(data), PYTHONUNBUFFERED="1", **(env_extra or {}))
    cmd = [sys.executable, "-m", "tests.tiny_backend" if tiny else "engine", *([] if tiny else ["backend"]),
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(f"{url}/v1/info", proc, log, "the backend")
        yield {"url": url, "log": log, "proc": proc}
    finally:
        _stop(proc)


@contextlib.contextmanager
def running_dashboard(data: Path, env_extra: dict | None = None, tiny: bool = False,
                      backend_env: dict | None = None):
    """A backend, and `streamlit run app.py` driving it (SCL_BACKEND_URL), each on a free loopback port with its
    store in `data`; both stopped by their process groups (the ones started here, nothing else) on the way out.
    `backend_env`: the backend's environment beyond env_extra (its machine, as the dashboard does not see it).
    Yields {url, log, data, pid, backend}: the dashboard's URL, log and PID, and the backend's."""
    with running_backend(data, {**(env_extra or {}), **(backend_env or {})}, tiny) as backend:
        port = _free_port()
        log = data / "streamlit.log"
        env = dict(os.environ, SCL_DATA_DIR=str(data / "dashboard"), PYTHONUNBUFFERED="1",
                   SCL_BACKEND_URL=backend["url"], **(env_extra or {}))
        cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true",
               "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
               "--server.fileWatcherType", "none"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_for(f"{url}/_stcore/health", proc, log, "streamlit", 90)
            yield {"url": url, "log": log, "data": data, "pid": proc.pid, "backend": backend}
        finally:
            _stop(proc)


def lab_mappings(pid: int) -> dict[str, set[str]]:
    """What of the lab's is mapped into process `pid`: its kernel extensions (engine/ops/build.py builds
    scl_qgemm_cpu / scl_qgemm_cuda), model weights (safetensors files) and torch's own library."""
    paths = {line.split(maxsplit=5)[5].strip() for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
             if len(line.split(maxsplit=5)) == 6}
    return {"kernels": {p for p in paths if re.search(r"scl_qgemm_(cpu|cuda)[^/]*\.so", p)},
            "weights": {p for p in paths if p.endswith(".safetensors")},
            "torch": {p for p in paths if re.search(r"/libtorch(_cpu|_cuda)?\.so", p)}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    data = tmp_path_factory.mktemp("e2e-data")
    extra = {"SCL_CACHE_DIR": str(data / "cache")} if TINY else {}
    with running_dashboard(data, extra, tiny=TINY) as app:  # the tiny backend registers the test models
        yield app


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


# ---------------------------------------------------------------- helpers

def shot(page, name: str) -> None:
    """Whole page: Streamlit scrolls inside its main container, so grow the viewport to its height first."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    h = page.evaluate("""() => Math.max(...['[data-testid="stMain"]', '[data-testid="stAppViewContainer"]',
        '[data-testid="stMainBlockContainer"]'].map(s => document.querySelector(s)).filter(Boolean)
        .map(e => e.scrollHeight), document.body.scrollHeight)""")
    page.set_viewport_size({"width": size["width"], "height": min(int(h) + 40, 9000)})
    time.sleep(0.8)  # let plotly resize to the new viewport
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


def settle(page, timeout_s: float = 60) -> None:
    """Wait until the script run is over (the 'running' status widget is gone) and the page is drawn."""
    page.wait_for_selector('[data-testid="stAppViewContainer"]', timeout=timeout_s * 1000)
    deadline = time.time() + timeout_s
    quiet_since = None
    while time.time() < deadline:
        running = page.locator('[data-testid="stStatusWidget"]').count() > 0 and \
            page.locator('[data-testid="stStatusWidget"]').first.is_visible()
        if not running:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since > 1.0:
                return
        else:
            quiet_since = None
        time.sleep(0.2)


def problems(page) -> list[str]:
    out = []
    for sel in ('[data-testid="stException"]', '[data-testid="stAlertContentError"]'):
        loc = page.locator(sel)
        for i in range(loc.count()):
            out.append(loc.nth(i).inner_text()[:500])
    return out


def assert_clean(page, where: str, log: Path) -> None:
    p = problems(page)
    assert not p, f"{where}: error shown: {p}\nserver log tail:\n{log.read_text()[-2000:]}"


FOLD_PX = 900  # the laptop screen: 1440 x 900


def assert_answer_first(page, where: str) -> None:
    """The page's summary row (engine.present.answer) is on screen at 1440 x 900 without scrolling."""
    row = page.locator('.st-key-answer-row [data-testid="stMetric"]').first
    row.wait_for(timeout=60_000)
    page.evaluate("""() => { window.scrollTo(0, 0); const sel = '[data-testid="stMain"], section.main, '
        + '[data-testid="stAppViewContainer"]'; for (const el of document.querySelectorAll(sel)) el.scrollTop = 0; }""")
    box = row.bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= FOLD_PX, (where, box)


def go_to(page, title: str, heading: str) -> None:
    """Navigate with the sidebar (keeps the session, and so the current comparison)."""
    page.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
    page.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)
    settle(page)


def choose(page, label: str, option: str, tries: int = 4) -> None:
    """A selectbox by its combobox's name (inside a form's narrow column, where `pick`'s click lands on the
    label's help icon), again if a rerun closed the list before it showed; checked by the value it then holds."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.get_by_role("combobox", name=label)
    for _ in range(tries):
        box.click()
        try:
            page.get_by_role("option", name=option, exact=True).click(timeout=5_000)
            break
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
            settle(page)
    settle(page)
    assert box.input_value() == option, f"{label}: {box.input_value()!r}, not {option!r}"


def pick(page, select_label: str, option_text: str) -> None:
    box = page.locator('[data-testid="stSelectbox"]', has_text=select_label).first
    box.click()
    page.get_by_role("option", name=re.compile(re.escape(option_text))).first.click()
    settle(page)


# ---------------------------------------------------------------- the test

def test_deep_link_as_the_servers_first_session(server, browser):
    """Opening /compare before anyone opened the app: the real menu and page, not pages/'s files.

    Runs first in this module, so its session is the server's first (see _ui.hand_over_to_app).
    """
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(f"{server['url']}/compare", timeout=90_000)
        page.get_by_role("heading", name="Compare (sweep)").first.wait_for(timeout=90_000)
        nav = page.locator('[data-testid="stSidebarNav"]')
        nav.get_by_text("Cost & capacity").wait_for(timeout=30_000)
        links = nav.locator("a").all_inner_texts()
        assert not any(t.strip().endswith("ui") or t.strip() == "app" for t in links), links
        assert page.get_by_role("heading", name="Compare (sweep)").count() == 1
    finally:
        page.close()


def test_dashboard_in_a_browser(server, browser, tmp_path):
    t0 = time.time()
    timings = {}
    ctx = browser.new_context(viewport={"width": 1440, "height": FOLD_PX}, accept_downloads=True)
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    log = server["log"]

    # every page renders without an error box, on a fresh store
    page.goto(server["url"])
    page.get_by_role("heading", name="Serving Cost Lab").first.wait_for()
    settle(page, 120)
    assert_clean(page, "home", log)
    assert page.get_by_text("SIMD level").first.is_visible()
    for title, heading in [("Precision", "Precision"), ("Speculative playground", "Speculative playground"),
                           ("Compare (sweep)", "Compare (sweep)"), ("Reports", "Reports"),
                           ("Cost & capacity", "Cost & capacity")]:
        go_to(page, title, heading)
        assert_clean(page, title, log)
    timings["pages"] = time.time() - t0

    # the default comparison on the real small pair
    go_to(page, "Home", "Serving Cost Lab")
    pair = "tiny test pair" if TINY else "Small pair: 0.5B target"
    page.get_by_text(pair).first.click()
    tokens = page.get_by_label("New tokens per run")
    tokens.fill(os.environ.get("SCL_E2E_TOKENS", "4"))  # docs' screenshots: a real length (docs/DASHBOARD.md)
    tokens.press("Enter")
    settle(page)
    if not QUALITY:
        page.get_by_text("Measure quality vs fp32").first.click()  # off: keeps this test short
        settle(page)
    page.get_by_role("button", name="Run default comparison").click()
    t1 = time.time()
    ended = re.compile(r"default comparison: 4 of 4 runs finished|Not measured: |nothing was measured")
    # the panel shows progress while the job runs; on a fast host the tiny pair's four runs can all land
    # between two polls (POLL_S), and then the page goes straight from "Queued" to how the job ended
    page.get_by_text(re.compile(f"runs done|{ended.pattern}")).first.wait_for(timeout=60_000)
    if page.get_by_text(re.compile(r"runs done")).count():
        assert page.get_by_role("button", name="Cancel").first.is_visible()
        shot(page, "01-home-running")
    page.get_by_text(ended).first.wait_for(timeout=RUN_TIMEOUT_S * 1000)
    failed = page.get_by_text(re.compile(r"Not measured: |nothing was measured"))
    assert not failed.count(), failed.first.inner_text()
    timings["comparison"] = time.time() - t1
    settle(page)
    assert_clean(page, "home after the comparison", log)
    # the backend measured it: the lab's kernels (and the real weights) are mapped there, never in the dashboard
    dash, back = lab_mappings(server["pid"]), lab_mappings(server["backend"]["proc"].pid)
    assert not dash["kernels"] and not dash["weights"], dash
    assert back["kernels"], "the backend measured int8 and int4 without the lab's kernels"
    go_to(page, "Home", "Serving Cost Lab")  # Home names the backend it drives
    assert page.get_by_text(server["backend"]["url"]).first.is_visible()
    assert page.get_by_text("Cheapest per output token").first.is_visible()
    assert page.get_by_text("By workload category").first.is_visible()   # the Table tab, open first
    assert_answer_first(page, "home")
    shot(page, "02-home-results")
    # the evidence in tabs: the charts with their intervals as whiskers
    page.get_by_role("tab", name=re.compile(r"^Charts")).first.click()
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 6", timeout=60_000)
    n_charts = page.locator(".js-plotly-plot").count()
    assert n_charts >= 6, n_charts
    for title in ("Decode throughput", "Time to first token", "$ per 1M output tokens", "Draft acceptance rate"):
        assert page.get_by_text(title).first.is_visible(), title
    assert page.get_by_text(re.compile(r"whiskers: its 95% interval")).first.is_visible()
    shot(page, "02b-home-charts")

    # Precision: the int4 model is already in the pool, so loading it is instant
    go_to(page, "Precision", "Precision")
    if TINY:
        pick(page, "Model", "tiny: random-init test model")
    else:
        pick(page, "Model", "default-draft: Qwen2.5-Coder-0.5B")
    page.get_by_role("button", name="Load").click()
    page.get_by_text("Memory breakdown").first.wait_for(timeout=300_000)
    settle(page)
    assert_clean(page, "precision", log)
    shot(page, "03-precision")

    if os.environ.get("SCL_E2E_PLAYGROUND") == "1" or TINY:
        go_to(page, "Speculative playground", "Speculative playground")
        pick(page, "Target model", "tiny: random" if TINY else "default-draft: Qwen2.5-Coder-0.5B")
        if TINY:
            pick(page, "Draft model", "tiny-draft")
        else:  # int8 target, its own int4 weights as draft: both already in the pool from the comparison
            pick(page, "Target precision", "int8")
            pick(page, "Draft kind", "self-draft")
        n = page.get_by_label("New tokens")
        n.fill("12")
        page.get_by_role("button", name="Generate").click()
        page.get_by_text("Mean acceptance length").first.wait_for(timeout=600_000)
        settle(page)
        assert_clean(page, "playground", log)
        assert page.locator(".scl-stream .tok").count() >= 1
        shot(page, "04-playground")

    # Compare and Cost show the current comparison
    go_to(page, "Compare (sweep)", "Compare (sweep)")
    page.get_by_role("tab", name=re.compile(r"^Charts")).first.click()
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 6", timeout=60_000)
    assert_clean(page, "compare", log)
    assert_answer_first(page, "compare")
    shot(page, "05-compare")
    go_to(page, "Cost & capacity", "Cost & capacity")
    # a day of traffic: the fleet sized for the peak vs autoscaled. The combobox itself, by its label: a click on
    # the widget's middle (pick) lands on the label's help icon in the form's narrow column and opens no list.
    choose(page, "Traffic over the day", "diurnal")
    page.get_by_role("button", name="Plan", exact=True).click()
    page.get_by_text("Recommended plan").first.wait_for(timeout=60_000)
    settle(page)
    assert_answer_first(page, "cost")
    # the answer first: the savings waterfall, drawn by plotly as a waterfall trace
    page.get_by_text("The answer on").first.wait_for(timeout=30_000)
    page.get_by_text("A day of diurnal traffic").first.wait_for(timeout=30_000)
    page.get_by_text("Sized for the peak").first.wait_for(timeout=30_000)
    assert page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .some(p => (p.data || []).some(t => t.type === 'waterfall'))""")
    page.get_by_role("tab", name="A fleet of models").first.click()
    page.get_by_role("button", name="Plan the fleet").click()
    page.get_by_text("with one model per GPU").first.wait_for(timeout=60_000)
    settle(page)
    assert_clean(page, "cost", log)
    shot(page, "06-cost")

    # Reports: save (with hostile text in the name), export HTML, and open that file offline
    go_to(page, "Reports", "Reports")
    page.get_by_role("textbox", name="Name", exact=True).fill(f"E2E small pair {EVIL}")
    page.get_by_role("textbox", name="Notes", exact=True).fill(f"Browser test run. {EVIL} & <b>not bold</b>")
    page.get_by_role("button", name="Save report").click()
    page.get_by_text("Saved report").first.wait_for(timeout=60_000)
    settle(page)
    assert_clean(page, "reports", log)
    assert_answer_first(page, "reports")
    shot(page, "07-reports")
    with page.expect_download(timeout=120_000) as dl:
        page.get_by_text("Export HTML").first.click()
    html_path = tmp_path / "report.html"
    dl.value.save_as(str(html_path))
    doc = html_path.read_text()
    assert 'id="plotly-inline"' in doc and "<script>alert" not in doc.split('id="plotly-inline"')[0]
    assert 'id="your-bill"' in doc  # saved with the Cost page's savings answer (the checkbox's default)

    offline = browser.new_context(viewport={"width": 1300, "height": 1000}, offline=True)
    requests, dialogs = [], []
    offline.route("**/*", lambda route: (requests.append(route.request.url), route.abort())
                  if not route.request.url.startswith(("file:", "data:", "blob:", "about:")) else route.continue_())
    rp = offline.new_page()
    rp.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors = []
    rp.on("pageerror", lambda e: errors.append(str(e)))
    rp.goto(html_path.as_uri())
    rp.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4", timeout=60_000)
    assert EVIL in rp.locator("#report-name").inner_text()  # shown as text, not run
    assert not dialogs, dialogs
    assert not requests, f"the exported report tried to reach the network: {requests}"
    assert not errors, errors
    rp.screenshot(path=str(SHOTS / "08-exported-report.png"), full_page=True)
    offline.close()
    ctx.close()
    # every page drawn, a comparison, a load and a report later: the dashboard process never loaded torch
    dash = lab_mappings(server["pid"])
    assert not dash["torch"] and not dash["kernels"] and not dash["weights"], dash
    assert lab_mappings(server["backend"]["proc"].pid)["torch"]
    timings["total"] = time.time() - t0
    print("e2e timings (s):", {k: round(v, 1) for k, v in timings.items()})



PEERS = ("llama.cpp Q4_K_M", "llama.cpp Q8_0", "transformers bf16")


def multiselect_set(page, label: str, options) -> None:
    """Remove a multiselect's values (each tag's Remove button), then type each option into it and pick it."""
    ms = page.locator('[data-testid="stMultiSelect"]', has_text=label).first
    remove = ms.locator('button[aria-label^="Remove "]:visible')
    while remove.count():
        remove.first.click()
        settle(page)
    box = page.get_by_role("combobox", name=re.compile(re.escape(label)))
    for option in options:
        box.click()
        box.fill(option)
        opts = page.get_by_role("option")
        opts.first.wait_for()
        texts = [t.strip() for t in opts.all_inner_texts()]
        opts.nth(texts.index(option)).click()
        settle(page)
    page.keyboard.press("Escape")
    settle(page)
    assert sorted(ms.locator('button[aria-label^="Remove "]:visible').evaluate_all(
        "bs => bs.map(b => b.getAttribute('aria-label').slice(7))")) == sorted(options)


# opt-in (docs/screenshots/07-compare-peers.png): defined only with SCL_E2E_PEERS=1, so CI, which fails a skip for
# want of something it provides, never collects it; its few minutes stay out of the suite
if os.environ.get("SCL_E2E_PEERS") == "1":
    def test_compare_sweep_with_peers(server, browser):
        """Compare: our int8 and int4 (no draft, batch 1) and three peers, picked from what the backend reports, in
        one sweep; the current comparison then shows the peers in their own table."""
        page = browser.new_page(viewport={"width": 1440, "height": FOLD_PX})
        page.set_default_timeout(60_000)
        log = server["log"]
        try:
            page.goto(f"{server['url']}/compare", timeout=90_000)
            page.get_by_role("heading", name="Compare (sweep)").first.wait_for(timeout=90_000)
            settle(page)
            if not TINY:
                pick(page, "Target model", "default-draft: Qwen2.5-Coder-0.5B")
            multiselect_set(page, "Target precisions", ["int8", "int4"])
            multiselect_set(page, "Drafts", ["none"])
            page.get_by_text("Peer systems as rows").first.click()
            settle(page)
            peers = [p for p in PEERS if not TINY or p.startswith("transformers")]
            multiselect_set(page, "Peers to measure", peers)
            page.get_by_text(f"{2 + len(peers)} run(s) in this grid").first.wait_for()
            page.get_by_role("button", name="Run sweep").click()
            ended = re.compile(r"\d+ of \d+ runs finished|Not measured: |nothing was measured")
            page.get_by_text(ended).first.wait_for(timeout=RUN_TIMEOUT_S * 1000)
            failed = page.get_by_text(re.compile(r"Not measured: |nothing was measured"))
            assert not failed.count(), failed.first.inner_text()
            settle(page)
            assert_clean(page, "compare with peers", log)
            assert_answer_first(page, "compare with peers")   # the new comparison's answer, drawn when the job ended
            page.get_by_text(f"Current comparison ({2 + len(peers)} runs)").first.wait_for()
            # the peers' own table (a canvas grid: its cells are not in the DOM), under its heading and summary
            assert page.get_by_text("Peer systems").first.is_visible()
            assert page.get_by_text(re.compile(r"Cheapest per output token: (llama\.cpp|transformers) ")).count()
            shot(page, "07-compare-peers")
        finally:
            page.close()
