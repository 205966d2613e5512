"""The dashboard's numbers against the command line's, in one run.

Starts a backend and the dashboard on 127.0.0.1, runs the Home page's default comparison in headless
Chromium with the browser attached (the page open and polling, as a user leaves it), then runs the same
configurations through `python -m engine bench`, one subprocess each, and prints both side by side:
configuration, dashboard tok/s ± the 95% interval's half width, CLI tok/s ±, their ratio, and both
noise verdicts. Stores are scratch folders; nothing of the user's is written.

    .venv/bin/python bench/dashboard_vs_cli.py --small      # the 0.5B pair of the issue (int8 drafted by its int4)
    .venv/bin/python bench/dashboard_vs_cli.py              # the default pair (1.5B target, 0.5B draft): long
    .venv/bin/python bench/dashboard_vs_cli.py --tiny       # the random-init test models: a minute, proves the path

Needs Debian's chromium (/usr/bin/chromium) and the playwright package (never `playwright install`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import present  # noqa: E402
from engine.measure.store import Store  # noqa: E402
from engine.measure.grid import DEFAULT_WORKLOAD, default_comparison  # noqa: E402
from tests.test_browser_e2e import CHROMIUM, CHROMIUM_ARGS, browser_missing, running_dashboard, settle  # noqa: E402

PAIRS = {"default": ("default", "default-draft", False, "Default pair"),
         "small": ("default-draft", "default-draft", True, "Small pair"),
         "tiny": ("tiny", "tiny-draft", False, "tiny test pair")}


def dashboard_run(app: dict, pair: str, tokens: int, timeout_s: float) -> list[str]:
    """The Home page's default comparison, clicked in headless Chromium; the run ids it stored, in order."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(app["url"], timeout=120_000)
            page.get_by_role("heading", name="Serving Cost Lab").first.wait_for()
            settle(page, 120)
            page.get_by_text(PAIRS[pair][3]).first.click()
            box = page.get_by_label("New tokens per run")
            box.fill(str(tokens))
            box.press("Enter")
            settle(page)
            page.get_by_text("Measure quality vs fp32").first.click()  # off: speed only, as the CLI below
            settle(page)
            page.get_by_role("button", name="Run default comparison").click()
            page.get_by_text(re.compile(r"default comparison: 4 of 4 runs finished")).first.wait_for(
                timeout=timeout_s * 1000)
        finally:
            browser.close()
    recs = Store(app["data"] / "dashboard" / "lab.sqlite").list_runs(limit=4, kind="bench")
    return [r.run_id for r in reversed(recs)]


def cli_run(cfg, data: Path, tiny: bool) -> dict:
    """One configuration through `python -m engine bench --json` in a fresh process; its record."""
    s = cfg.setup
    args = ["bench", "--model", s.model, "--precisions", s.precision, "--drafts", s.draft,
            "--draft-precisions", s.draft_precision, "--draft-model", s.draft_model, "--gammas", str(s.gamma),
            "--reps", str(cfg.reps), "--max-new-tokens", str(cfg.max_new_tokens), "--json"]
    if cfg.workload:
        args += ["--workload", cfg.workload]
    if tiny:  # the test models exist only where tests/tiny.py registers them
        cmd = [sys.executable, "-c", "import sys; from tests.tiny import register; register(); "
               "from engine.__main__ import main; sys.exit(main(sys.argv[1:]))", *args]
    else:
        cmd = [sys.executable, "-m", "engine", *args]
    env = dict(os.environ, SCL_DATA_DIR=str(data / "cli"))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd[:3])} ...` failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)[0]


def table(dash_recs, cli_recs) -> str:
    rows = ["| configuration | dashboard tok/s | CLI tok/s | dashboard / CLI | dashboard noise | CLI noise |",
            "| --- | --- | --- | --- | --- | --- |"]
    d_rows = present.with_half_widths(present.comparison_rows(dash_recs, 0.1))
    c_rows = present.with_half_widths(present.comparison_rows(cli_recs, 0.1))
    for d, c, dr, cr in zip(d_rows, c_rows, dash_recs, cli_recs):
        ratio = d["tok_s"] / c["tok_s"] if d.get("tok_s") and c.get("tok_s") else None
        rows.append(f"| {dr.label} | {d['tok_s']:.1f} ± {d.get('tok_s_pm') or 0:.1f} | "
                    f"{c['tok_s']:.1f} ± {c.get('tok_s_pm') or 0:.1f} | "
                    f"{f'{ratio:.2f}' if ratio else 'n/a'} | {present.noise_label(dr) or 'not checked'} | "
                    f"{present.noise_label(cr) or 'not checked'} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="the 0.5B pair (int8 drafted by its own int4 weights)")
    size.add_argument("--tiny", action="store_true", help="the random-init test models (proves the path in a minute)")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per run (the Home page's default)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds the dashboard's comparison may take")
    a = ap.parse_args(argv)
    why = browser_missing()
    if why:
        raise SystemExit(why)
    pair = "tiny" if a.tiny else ("small" if a.small else "default")
    model, draft, self_draft, _ = PAIRS[pair]
    cfgs = default_comparison(model, draft, a.tokens, self_draft=self_draft, workload=DEFAULT_WORKLOAD, reps=3)
    data = Path(tempfile.mkdtemp(prefix="scl-dash-vs-cli-"))
    extra = {"SCL_CACHE_DIR": str(data / "cache")} if a.tiny else {}
    t0 = time.time()
    with running_dashboard(data, extra, tiny=a.tiny) as app:
        print(f"dashboard {app['url']} driving the backend {app['backend']['url']}; store {data}", file=sys.stderr)
        ids = dashboard_run(app, pair, a.tokens, a.timeout)
    print(f"dashboard: {len(ids)} runs in {time.time() - t0:.0f} s; now the CLI", file=sys.stderr)
    store = Store(data / "dashboard" / "lab.sqlite")
    dash = [store.get_run(i) for i in ids]
    from engine.measure.records import RunRecord

    cli = [RunRecord.from_dict(cli_run(c, data, a.tiny)) for c in cfgs]
    print(f"\nThe default comparison ({PAIRS[pair][3]}, workload {DEFAULT_WORKLOAD}, 3 repetitions, {a.tokens} new "
          "tokens), through the dashboard (backend + headless Chromium attached) and `python -m engine bench`, "
          "in the same run:\n")
    print(table(dash, cli))
    return 0


if __name__ == "__main__":
    sys.exit(main())
