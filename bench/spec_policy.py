"""The adaptive speculation policy against fixed gamma and no draft, at each concurrency, through vLLM's client.

    .venv/bin/python bench/spec_policy.py --model default --precision int4 --draft model      # the 1.5B + 0.5B
    .venv/bin/python bench/spec_policy.py --model default-draft --precision int4 --draft ngram

Three servers of the same setup, started together by the lab on 127.0.0.1 (engine/peers/servers.py): no
draft, --spec-policy fixed and --spec-policy adaptive (both at --gamma). Each is warmed with one request; then
at each --concurrency level the three take turns (in an order that rotates by level, so that none is always
first while the host drifts; only one is ever sent work), each sent max(8, 2 x concurrency) requests by vLLM's
`bench serve`
(bench/vllm_bench_client.py, from .venv-vllm): random prompts of --input-len tokens, --output-len tokens forced,
greedy, the same prompts for every server at a level (a fresh seed per level; each server is a new process with
its prompt cache off, so none has seen them), so the arms differ only in their policy. Each level also reads
the server's /metrics before and after, so the table says which draft lengths the adaptive policy chose there.
Writes <out>/spec_policy.{md,json}; the .md checks issue 39's target: adaptive >= 0.97x the better of fixed
and no draft at every level.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from under_load import VLLM_PY, vllm_client  # noqa: E402

from engine.peers import servers  # noqa: E402

TARGET = 0.97
ARMS = (("no draft", "none", "fixed"), ("fixed", None, "fixed"), ("adaptive", None, "adaptive"))


def spec_counters(url: str) -> dict[str, float]:
    """From the server's /metrics (engine.load.server_metrics.parse; empty without a draft): steps by gamma
    ('g<gamma>', scl:spec_decode_steps_total), rounds that asked for drafts ('asked'), vLLM's drafts ('drafts'),
    draft tokens ('draft_tokens') and accepted tokens per draft position ('pos<j>')."""
    import re

    import httpx

    from engine.load.server_metrics import SPEC, parse

    names = {"scl:spec_decode_steps_total": ("g", "gamma"), "scl:spec_decode_asked_rounds_total": ("asked", None),
             SPEC + "num_drafts_total": ("drafts", None),
             SPEC + "num_draft_tokens_total": ("draft_tokens", None),
             SPEC + "num_accepted_tokens_per_pos_total": ("pos", "position")}
    out: dict[str, float] = {}
    for k, v in parse(httpx.get(url + "/metrics", timeout=30).text).items():
        name, _, labels = k.partition("{")
        if name not in names:
            continue
        key, label = names[name]
        if label:
            key += re.search(rf'{label}="(\d+)"', labels).group(1)
        out[key] = out.get(key, 0.0) + v
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default-draft")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--draft", default="ngram", help="model, self or ngram")
    ap.add_argument("--draft-model", default="default-draft")
    ap.add_argument("--draft-precision", default="int4")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--passes", type=int, default=1, help="passes per level, every other one in reverse order "
                                                          "(fresh prompts each; tok/s is their mean)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "runs" / time.strftime("%Y-%m-%d")))
    ap.add_argument("--render", metavar="JSON", help="only rewrite the .md of a saved spec_policy.json")
    a = ap.parse_args(argv)
    if a.render:
        print(markdown(json.loads(Path(a.render).read_text())))
        return 0
    from engine.infer import catalog

    if not VLLM_PY.exists():
        print("vLLM's client is not installed (.venv-vllm): run `make peers-vllm`", file=sys.stderr)
        return 2
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    levels = [int(c) for c in a.concurrency.split(",")]
    tokenizer = catalog.resolve(a.model)
    rows, spec_facts, t0 = [], {}, time.time()
    with contextlib.ExitStack() as stack:
        running = []
        for arm, draft, policy in ARMS:
            spec = servers.ServerSpec.of(servers.OURS, model=a.model, precision=a.precision, draft=draft or a.draft,
                                         draft_model=a.draft_model, draft_precision=a.draft_precision,
                                         gamma=a.gamma, spec_policy=policy, slots=max(levels), max_model_len=1024,
                                         startup_timeout_s=900).validate()
            rs = stack.enter_context(servers.start(spec, progress=say))
            vllm_client(rs.url, spec.served_name, tokenizer, _client_args(a, 1, 1), 1)
            running.append((arm, spec, rs))
        for i, c in enumerate(levels):
            turn = running[i % 3:] + running[:i % 3]
            # every other pass in the reverse order, so that a drift of the host favours no arm
            for p, (arm, spec, rs) in [(p, x) for p in range(a.passes) for x in (turn if p % 2 == 0 else turn[::-1])]:
                before = spec_counters(rs.url)
                v = vllm_client(rs.url, spec.served_name, tokenizer, _client_args(a, c, max(8, 2 * c)),
                                int(t0) + c + 1000 * p)
                after = spec_counters(rs.url)
                delta = {k: after[k] - before.get(k, 0) for k in after}
                rows.append({"arm": arm, "label": spec.label, "concurrency": c, "pass": p,
                             "out_tok_s": v["output_throughput"],
                             "tpot_p50_ms": v["median_tpot_ms"], "ttft_p50_ms": v["median_ttft_ms"],
                             "completed": v["completed"], "failed": v["failed"],
                             "steps_by_gamma": {k[1:]: v for k, v in delta.items() if k.startswith("g")},
                             "counters": delta})
                say(f"[{time.time() - t0:5.0f}s] {spec.label} at {c}: {v['output_throughput']:.1f} tok/s")
        for arm, _, rs in running:
            spec_facts[arm] = _health_spec(rs.url)  # the policy's step-cost tables as measured at start and kept
    rep = {"command": "python bench/spec_policy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "rows": rows, "spec_facts": spec_facts, "levels": levels, "target": TARGET, "input_len": a.input_len,
           "output_len": a.output_len, "interleaved": True, "gamma": a.gamma, "passes": a.passes,
           "wall_s": time.time() - t0}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec_policy.json").write_text(json.dumps(rep, indent=1))
    md = markdown(rep)
    (out / "spec_policy.md").write_text(md)
    print(md)
    return 0


def _health_spec(url: str) -> dict | None:
    import httpx

    return httpx.get(url + "/health", timeout=30).json().get("spec")


def _client_args(a, concurrency: int, prompts: int) -> argparse.Namespace:
    return argparse.Namespace(input_len=a.input_len, output_len=a.output_len, prompts=prompts,
                              concurrency=concurrency)


def markdown(rep: dict) -> str:
    """One row per concurrency: each arm's output tok/s, adaptive against the better of the other two, and the
    draft lengths adaptive chose (steps by gamma)."""
    by = merged(rep["rows"])
    labels = {r["arm"]: r["label"] for r in rep["rows"]}
    md = ["# The speculation policy under load: vLLM's client", "", f"Command: `{rep['command'].strip()}`", "",
          f"Random prompts of {rep['input_len']} tokens, {rep['output_len']} output tokens forced (ignore_eos), "
          f"greedy, max(8, 2 x concurrency) requests per level, the same prompts for every server at a level, "
          + ("the three servers up together, taking turns at each level, " if rep.get("interleaved") else
             "one server at a time, ") + f"caches off, "
          f"{rep['wall_s'] / 60:.0f} min. Servers: " + "; ".join(f"{k}: {v}" for k, v in labels.items()) + ".", "",
          "| concurrency | no draft tok/s | fixed tok/s | adaptive tok/s | adaptive / better of the two | "
          "adaptive's steps by gamma |", "| ---: | ---: | ---: | ---: | ---: | --- |"]
    worst = None
    for c in rep["levels"]:
        none, fixed, ad = (by.get((arm, c)) for arm, _, _ in ARMS)
        if not (none and fixed and ad):
            continue
        x = ad["out_tok_s"] / max(none["out_tok_s"], fixed["out_tok_s"])
        worst = x if worst is None else min(worst, x)
        steps = ", ".join(f"{g}: {n:.0f}" for g, n in sorted(ad["steps_by_gamma"].items(), key=lambda t: int(t[0]))
                          if n)
        md.append(f"| {c} | {none['out_tok_s']:.1f} | {fixed['out_tok_s']:.1f} | {ad['out_tok_s']:.1f} | "
                  f"{x:.2f}x | {steps} |")
    failed = sum(r["failed"] for r in rep["rows"])
    md += ["", f"Failed requests: {failed}.",
           (f"Adaptive's worst ratio: **{worst:.2f}x** (target >= {rep['target']}x at every level: "
            f"{'met' if worst >= rep['target'] else 'missed'})." if worst is not None else "No level ran all three.")]
    return "\n".join(md + crossover(rep, by)) + "\n"


def merged(rows: list[dict]) -> dict[tuple, dict]:
    """(arm, concurrency) -> its passes as one row: tok/s their mean, steps and counters summed."""
    out: dict[tuple, dict] = {}
    for r in rows:
        m = out.setdefault((r["arm"], r["concurrency"]), {**r, "tok_s_passes": [], "steps_by_gamma": {},
                                                          "counters": {}, "failed": 0})
        m["tok_s_passes"].append(r["out_tok_s"])
        m["out_tok_s"] = sum(m["tok_s_passes"]) / len(m["tok_s_passes"])
        m["failed"] += r["failed"]
        for k in ("steps_by_gamma", "counters"):
            for g, n in (r.get(k) or {}).items():
                m[k][g] = m[k].get(g, 0) + n
    return out


def crossover(rep: dict, by: dict) -> list[str]:
    """Where fixed gamma stops paying: measured (the first level where fixed <= no draft) against what the step-cost
    model says (engine/common/step_model.py: the adaptive server's tables as it measured and kept them, and at each
    level the acceptance per position, the draft tokens and the rounds that asked for drafts the fixed server
    counted there, with both servers' prefills): (c T_p + O T(c, 0)) / (c T_p + O T(c, g, rows) / E(g)) <= 1.
    A crossover past the last level counts as the level after it."""
    from engine.common.step_model import Acceptance, step_cost_from

    facts = ((rep.get("spec_facts") or {}).get("adaptive") or {}).get("step_cost")
    if not facts:
        return []
    cost, g = step_cost_from(facts), rep.get("gamma", 4)
    lines = ["", "**Where fixed gamma stops paying** (step-cost model: the adaptive server's tables; the fixed "
             "server's acceptance per position, draft tokens and rounds that asked for drafts at each level; batch "
             "taken as the concurrency; both servers' prefills counted):", "",
             "| concurrency | fixed / no draft, measured | model: (c T_p + O T(c,0)) / (c T_p + O T(c,g,rows) / E) |",
             "| ---: | ---: | ---: |"]
    measured = model = None
    for i, c in enumerate(rep["levels"]):
        none, fixed = by.get(("no draft", c)), by.get(("fixed", c))
        cnt = (fixed or {}).get("counters") or {}
        if not (none and fixed and cnt.get("drafts")):
            continue
        # per round that asked for g drafts (a lookup may find fewer, or none: those rounds are not vLLM's drafts)
        asked = cnt.get("asked") or cnt["drafts"]
        e = Acceptance.from_counters(g, asked, [cnt.get(f"pos{j}", 0.0) for j in range(g)]).expected_by_gamma()
        rows = [1.0 + j for j in range(g)] + [1.0 + cnt.get("draft_tokens", g * cnt["drafts"]) / asked]
        # both servers prefill every prompt: a closed loop of c users makes c * O tokens in
        # c * T_prefill + O * T(c, g) / E(g) (the planner's closed_loop_point), T_prefill = target(input_len)
        pre, out = c * cost.target(rep["input_len"]), rep["output_len"]
        pred = (pre + out * cost.step_s(c, 0)) / (pre + out * cost.step_s(c, g, rows[g]) / e[g])
        meas = fixed["out_tok_s"] / none["out_tok_s"]
        lines.append(f"| {c} | {meas:.2f} | {pred:.2f} |")
        measured = i if measured is None and meas <= 1 else measured
        model = i if model is None and pred <= 1 else model
    name = lambda i: "none of the levels" if i is None else f"concurrency {rep['levels'][i]}"  # noqa: E731
    if lines[-1].startswith("| ---"):
        return []
    past = len(rep["levels"])  # no crossover up to the last level: it lies past it, at the next level or later
    m, mo = (past if measured is None else measured), (past if model is None else model)
    ok = (measured is None and model is None) or abs(m - mo) <= 1
    lines += ["", f"Measured crossover: {name(measured)}; the model's: {name(model)} (within one level: "
              f"{'yes' if ok else 'no'})."]
    return lines


if __name__ == "__main__":
    sys.exit(main())
