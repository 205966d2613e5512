"""Our engine against the tools people use instead, in one run on this machine.

    .venv/bin/python bench/peers.py                      # the full CPU matrix on the 1.5B (~25 min on 2 cores)
    .venv/bin/python bench/peers.py --only llama,int4    # configs whose label contains any of these
    .venv/bin/python bench/peers.py --device cuda --random-init qwen2.5-coder-1.5b,llama-3.1-8b   # GPU box

Each system runs in a fresh process on the same prompt token ids, greedy, the same number of new
tokens (EOS ignored), one warm-up and --reps timed repetitions (medians). Peers that are not
installed are listed with the reason. Writes <out>/peers.{md,csv,json,html} (and peers.png when
Debian's chromium is there) and prints the table and the targets.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.peers import report as peer_report  # noqa: E402 (after the path above)

from engine import peers  # noqa: E402
from engine.common.errors import UserError  # noqa: E402
from engine.common.fields import M  # noqa: E402
from engine.measure.runner import run_many  # noqa: E402
from engine.present import format_rows  # noqa: E402


# A/B rows: the same configuration in a fresh process with one engine setting changed through its
# environment (engine/ops/config.py), the label marked. CPU: the fused forward pass off (the PyTorch
# reference path); GPU: plain decode steps replayed from a CUDA graph.
AB_CPU = [("int4", "none", {"SCL_FUSED": "0"}, " (unfused)"),
          ("int4", "model", {"SCL_FUSED": "0"}, " (unfused)")]
AB_GPU = [("bf16", "none", {"SCL_CUDA_GRAPH": "1"}, " (cuda graph)"),
          ("int4", "none", {"SCL_CUDA_GRAPH": "1"}, " (cuda graph)")]


@dataclass
class PeerRun:
    """A work item (engine.measure.runner.run_many): a peer config in a fresh process with these environment
    changes (an A/B row: the worker checks its kernel settings against them), its label marked with `suffix`."""
    cfg: peers.PeerConfig
    env: dict = field(default_factory=dict)
    suffix: str = ""

    @property
    def label(self) -> str:
        return self.cfg.label + self.suffix

    def measure(self, pool=None, store=None, progress=None):
        rec = peers.measure(self.cfg, env=self.env)
        if self.suffix:
            rec.config["label"] = self.label
        if store is not None and not rec.notes:  # saved under its A/B label (measure would save it without)
            store.save_run(rec)
        return rec


def ab_configs(cfgs: list[peers.PeerConfig], gpu: bool) -> list[tuple[peers.PeerConfig, dict, str]]:
    """(config, environment changes, label suffix): every config as is, then the A/B rows, each a copy of
    the first of our configs with that precision and draft kind (and default activations)."""
    out = [(c, {}, "") for c in cfgs]
    for prec, draft, env, suffix in (AB_GPU if gpu else AB_CPU):
        base = next((c for c in cfgs if c.system == peers.OURS and c.setup.precision == prec
                     and c.setup.draft == draft and c.act == "int8"), None)
        if base is not None:
            out.append((base, env, suffix))
    return out


def gpu_configs(shape: str, max_new: int, reps: int, device: str) -> list[peers.PeerConfig]:
    """On a GPU with random weights: transformers fp16/bf16 and bitsandbytes, and our engine's precisions."""
    import random

    from engine.planner import counts, shapes
    vocab = shapes.get_model(shape).vocab
    rnd = random.Random(0)
    ids = [rnd.randrange(2, min(vocab, 150000)) for _ in range(128)]
    base = peers.PeerConfig.of(model=shape, random_init=shape, prompt_ids=ids, max_new_tokens=max_new, reps=reps,
                            device=device, timeout_s=900)
    hf, us = "transformers", peers.OURS
    if counts.param_count(shapes.get_model(shape)) > 3e9:
        # Big shapes load for 30-60 s each: the essentials only, so one device call (10 min) holds both shapes.
        return ([base.with_fields(system=hf, precision=p) for p in ("bf16", "nf4")]
                + [base.with_fields(system=us, precision=p) for p in ("bf16", "int8", "int4", "fp8")])
    out = [base.with_fields(system=hf, precision=p) for p in ("bf16", "fp16", "llm.int8", "nf4")]
    out += [base.with_fields(system=hf, precision="bf16", draft="ngram")]
    out += [base.with_fields(system=us, precision=p) for p in ("bf16", "fp16", "int8", "int4", "fp8")]
    out += [base.with_fields(system=us, precision="bf16", draft="self", draft_precision="int4", gamma=4),
            base.with_fields(system=us, precision="int8", draft="self", draft_precision="int4", gamma=4)]
    return out


def write_outputs(records, out: Path, title: str, command: str) -> list[dict]:
    rows = peer_report.peer_rows(records)
    out.mkdir(parents=True, exist_ok=True)
    cols = ["config", "tok_s", "ttft_ms", "peak_rss_MB", "load_peak_MB", "peak_gpu_MB", "vs_best_peer", "accept_rate",
            "same_tokens_as_hf_fp32", "status"]
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)] or cols
    tg = peer_report.targets(records)
    machine = next((r.machine for r in records if r.machine), {})
    md = [f"# {title}", "", f"Command: `{command}`", "",
          "Machine: " + ", ".join(f"{k}={machine.get(k)}" for k in ("cpu_model", "cores", "simd", "memory_bytes",
                                                                     "gpu_name") if machine.get(k)), "",
          format_rows(rows, "md", cols), "", "Targets:", "", format_rows(tg, "md")]
    (out / "peers.md").write_text("\n".join(md) + "\n")
    (out / "peers.csv").write_text(format_rows(rows, "csv", cols + ["system", "best_peer"]))
    (out / "peers.json").write_text(json.dumps({"command": command, "rows": rows, "targets": tg,
                                                "records": [r.to_dict() for r in records]}, indent=1, default=str))
    try:
        fig = peer_report.peer_figure(rows, title)
    except ImportError as e:  # the GPU image has no plotly; the table is the result
        print(f"note: no chart ({e})", file=sys.stderr)
        return rows
    html = out / "peers.html"
    fig.write_html(str(html), include_plotlyjs=True, full_html=True)
    _png(html, out / "peers.png")
    return rows


def _png(html: Path, png: Path) -> None:
    """A static image of the chart through Debian's chromium, when it is installed (never a download)."""
    if not Path("/usr/bin/chromium").exists():
        return
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium",
                                  args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                        "--disable-component-update", "--disable-sync", "--no-first-run"])
            page = b.new_page(viewport={"width": 1200, "height": 800})
            page.goto(html.resolve().as_uri())
            page.wait_for_selector(".main-svg", timeout=30000)
            page.locator(".plotly-graph-div").first.screenshot(path=str(png))
            b.close()
    except Exception as e:  # the HTML is the result; the picture is a convenience
        print(f"note: no PNG ({type(e).__name__}: {e})", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--draft-model", default="default-draft")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default="", help="comma list: keep configs whose label contains any of these")
    ap.add_argument("--labels", default="", help="comma list: keep exactly the configs with these labels")
    ap.add_argument("--random-init", default="", help="comma list of data/models.json shapes (GPU runs)")
    ap.add_argument("--ours", default="", help="comma list: our engine at these precisions too, e.g. "
                                               "int4-gptq-g32,int4-gptq-mixed-g32 (calibrated once, cached)")
    ap.add_argument("--llama", default="", help="comma list: llama.cpp at these precisions too (gguf_tools."
                                                "LLAMA_PRECISIONS), e.g. Q4_K_M-imatrix,IQ4_XS-imatrix (built once)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per system")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--store", action="store_true", help="also save the records in the lab's store")
    ap.add_argument("--no-ab", dest="ab", action="store_false",
                    help="skip the A/B rows (CPU: the fused step off; GPU: CUDA graphs on)")
    a = ap.parse_args(argv)
    command = "python bench/peers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.random_init:
        cfgs = [c for s in a.random_init.split(",") for c in gpu_configs(s.strip(), a.max_new_tokens, a.reps,
                                                                          a.device)]
    else:
        cfgs = peers.default_peer_configs(a.model, a.draft_model, a.max_new_tokens, a.reps, a.device)
    for tok in (x.strip() for x in a.ours.split(",") if x.strip()):  # validated: labels say the method
        c = peers.PeerConfig.of(system=peers.OURS, model=a.model, precision=tok, max_new_tokens=a.max_new_tokens,
                                reps=a.reps, device=a.device)
        cfgs.append(replace(c, setup=c.setup.validate()))
    for tok in (x.strip() for x in a.llama.split(",") if x.strip()):
        cfgs.append(peers.PeerConfig.of(system="llama.cpp", model=a.model, precision=tok,
                                        max_new_tokens=a.max_new_tokens, reps=a.reps, device=a.device).validate())
    cfgs = [replace(c, timeout_s=a.timeout) for c in cfgs]
    if a.only:
        keys = [k.strip().lower() for k in a.only.split(",") if k.strip()]
        cfgs = [c for c in cfgs if any(k in c.label.lower() for k in keys)]
    if a.labels:
        want = [x.strip() for x in a.labels.split(",") if x.strip()]
        unknown = sorted(set(want) - {c.label for c in cfgs})
        if unknown:
            print(f"no configuration is labelled {unknown}; the labels: {[c.label for c in cfgs]}", file=sys.stderr)
            return 2
        cfgs = [c for c in cfgs if c.label in want]
    if not cfgs:
        print("no configuration matches --only", file=sys.stderr)
        return 2
    runs = ab_configs(cfgs, a.device != "cpu") if a.ab else [(c, {}, "") for c in cfgs]
    store = None
    if a.store:
        from engine.measure.store import Store

        store = Store()
    records = []
    t0 = time.time()

    def landed(rec) -> None:  # measured or could not run here (a record with notes): both are rows of the table
        records.append(rec)
        v = rec.metrics.get(M.decode_tok_s)
        print(f"[{len(records)}/{len(runs)} {time.time() - t0:5.0f}s] {rec.config.get('label')}: "
              + (f"{v:.2f} tok/s, TTFT {rec.metrics['ttft_s'] * 1000:.0f} ms" if v else rec.notes), flush=True)

    try:
        run_many([PeerRun(c, env, suffix) for c, env, suffix in runs], None, store, on_record=landed,
                 on_skip=landed, noun="peer")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    title = "Peers: " + (f"random-init {a.random_init} on {a.device}" if a.random_init else
                         f"{a.model}, {a.max_new_tokens} new tokens, median of {a.reps}")
    rows = write_outputs(records, Path(a.out), title, command)
    print(format_rows(rows, "md", ["config", "tok_s", "ttft_ms", "peak_rss_MB", "vs_best_peer", "accept_rate",
                                   "same_tokens_as_hf_fp32", "status"]))
    print(format_rows(peer_report.targets(records), "md"))
    print(f"wrote {a.out}/peers.{{md,csv,json,html}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
