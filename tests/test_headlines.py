"""The speed headlines of docs/BENCHMARKS.md, guarded. Each is a ratio of two measurements taken in this process,
interleaved rep by rep (a drift of the host hits both sides), with a bound of half the ratio measured when the test
was written: a 2x regression fails, the host's ±20% between passes does not. The measured ratio is in a comment."""
from __future__ import annotations

import os
import statistics
import time

import pytest

MARGIN = 0.5  # a 2x regression of the ratio fails
N = 32  # decoded tokens per rep


def _tok_s(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def test_our_int4_against_llama_cpp_q4_k_m_one_stream(small_int4):
    """docs/BENCHMARKS.md: int4 g32 decodes 1.34x llama.cpp's Q4_K_M on the 1.5B, one stream. Here the 0.5B (the
    shared fixture; its shipped Q4_K_M GGUF), the same chat prompt's ids, N greedy tokens, 3 reps after a warm-up,
    both on every core. Measured: MEASURED below (AMD EPYC AVX2-only, 2 cores)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (`make peers`)")
    from engine.infer.catalog import gguf_path
    from engine.infer.generate import generate
    from engine.infer.tokens import encode_prompts
    from engine.measure.runs import default_prompts
    from engine.peers.workers import llama_cpp_timed

    threads = os.cpu_count() or 1
    llm = llama_cpp.Llama(model_path=str(gguf_path("default-draft")), n_ctx=512, n_threads=threads,
                          n_threads_batch=threads, seed=0, verbose=False)
    ids = encode_prompts(small_int4.tokenizer, [default_prompts()[0]], chat=True)[0]
    theirs = llama_cpp_timed(llm, ids)

    def ours(n: int) -> list[float]:
        stamps: list[float] = []
        generate(small_int4, None, max_new_tokens=n, prompt_ids=[ids], stop_at_eos=False,
                 on_token=lambda *_: stamps.append(time.perf_counter()))
        return stamps

    ours(8), theirs(8)  # warm-up
    rates = {"ours": [], "llama.cpp": []}
    for _ in range(3):
        rates["ours"].append(_tok_s(ours(N)))
        rates["llama.cpp"].append(_tok_s(theirs(N).stamps))
    ratio = statistics.median(rates["ours"]) / statistics.median(rates["llama.cpp"])
    print(f"decode tok/s {rates}: ours / llama.cpp Q4_K_M = {ratio:.2f}")
    assert ratio > MARGIN * MEASURED_INT4_OVER_Q4_K_M, (ratio, rates)


# 2026-12-03, AMD EPYC AVX2-only, 2 cores, the machine otherwise idle: ours 38.7-39.5 tok/s, llama.cpp 24.4-25.8.
# The same day on an AMD EPYC with AVX-512: ours 95.7-102.9, llama.cpp 49.1-52.9 (2.02); the bound is the AVX2 host's.
MEASURED_INT4_OVER_Q4_K_M = 1.59


def test_prefix_cache_cuts_the_time_to_first_token_of_a_shared_prompt(small_int4):
    """docs/BENCHMARKS.md: on the multi-turn workload TTFT p50 is 3.51x lower with the prefix cache. Here one
    request that shares a long preamble (7 whole blocks) with the one before it: its time to first token with
    the cache on against off, 3 reps interleaved, each on a fresh scheduler (on: its first request filled it).
    Measured: MEASURED_PREFIX_TTFT(_AVX512) below (off / on, AMD EPYC AVX2-only / with AVX-512, 2 cores)."""
    from engine.infer.batch import Request
    from engine.infer.sampling import SamplingParams
    from engine.infer.scheduler import BatchSettings, Scheduler
    from engine.infer.tokens import encode_prompts

    preamble = ("You review Python code for a team that values small functions, clear names and tests. Answer "
                "briefly, with code where it helps, and say what you would change and why. ") * 12
    settings = dict(max_seqs=2, max_model_len=1024, max_batched_tokens=520, prefill_chunk=512, kv_cache="paged")

    def ttft(prefix_caching: bool, rep: int) -> float:
        first, second = encode_prompts(small_int4.tokenizer, [preamble + f"Question {rep}: why tests?",
                                                              preamble + f"Question {rep}: why names?"], chat=True)
        sched = Scheduler(small_int4, BatchSettings(**settings, prefix_caching=prefix_caching), None, 0)
        # cache off, the first request leaves nothing the second can reuse: only the second runs (the first's
        # prefill cost 2.4-2.6 s a rep on the AVX2 host and changed nothing the second measures)
        for ids in ((first, second) if prefix_caching else (second,)):
            t0 = time.perf_counter()
            sched.submit(Request(list(ids), 1, SamplingParams(), stop_at_eos=False, request_id=str(len(ids))))
            while sched.has_work():
                sched.step()
        assert len(first) >= 7 * 64
        return time.perf_counter() - t0  # the second request's: its prompt, then one token

    ttft(True, -1)  # warm-up: both prompts' prefill, the cached and the uncached path
    on, off = [], []
    for rep in range(3):
        on.append(ttft(True, rep))
        off.append(ttft(False, rep))
    ratio = statistics.median(off) / statistics.median(on)
    print(f"TTFT of the second request, s: cache on {on}, off {off}: off / on = {ratio:.2f}")
    # the ratio depends on the ISA (a faster prefill shortens "off" more than the fixed cost of "on"): each host
    # kind is held to its own measurement
    from engine import ops

    measured = MEASURED_PREFIX_TTFT_AVX512 if ops.backend_info()["cpu"] == "avx512" else MEASURED_PREFIX_TTFT
    assert ratio > MARGIN * measured, (ratio, on, off)


# 2026-12-03, AMD EPYC AVX2-only, 2 cores, idle: on 0.050-0.061 s, off 2.39-2.62 s (7 of 8 blocks reused).
MEASURED_PREFIX_TTFT = 43.7
# The same day with AVX-512: on 0.015-0.016 s, off 0.47-0.57 s (30.5); 2026-12-07, the Zen 4 of sessions 38-39,
# alone: 32.4-33.7; inside a fresh-clone .ci/run: 21.7 (bd8cc54, under the 43.7-based bound it was held to then).
MEASURED_PREFIX_TTFT_AVX512 = 30.5


def test_the_dashboards_tok_s_is_the_command_lines(tmp_path):
    """docs/BENCHMARKS.md (dashboard vs CLI): a plain row measured through the dashboard's path reads the CLI's
    tok/s. Here the 0.5B at int4, N tokens, 3 reps: a real `python -m engine backend` process, its job polled
    every second as a page polls it and its record imported as a page imports it, against `python -m engine
    bench --json` in a fresh process with the same config; two rounds, alternating. Measured:
    MEASURED_DASHBOARD_OVER_CLI below (a 5x gap, 26-31 against 148 tok/s, once went unnoticed)."""
    import json
    import subprocess
    import sys

    from engine import present
    from engine.backend.client import Backend
    from engine.measure.records import RunRecord
    from engine.measure.run_config import RunConfig
    from engine.measure.store import Store
    from pages._backend import RemoteJob, runs_work
    from tests.app_helpers import ROOT
    from tests.test_browser_e2e import running_backend

    cfg = RunConfig.of(model="default-draft", precision="int4", max_new_tokens=N, reps=3)
    store = Store(tmp_path / "dashboard.sqlite")
    cli_args = [sys.executable, "-m", "engine", "bench", "--model", "default-draft", "--precisions", "int4",
                "--reps", "3", "--max-new-tokens", str(N), "--json"]

    def tok_s(rec) -> float:
        (row,) = present.comparison_rows([rec], 1.0)
        return row["tok_s"]

    dash, cli = [], []
    with running_backend(tmp_path) as b:
        client = Backend(b["url"], timeout_s=30)
        for _ in range(2):
            job = RemoteJob(client, client.submit("headline guard", runs_work([cfg.to_dict()]), client="tests"),
                            "headline guard")
            assert job.wait(store, timeout_s=600, every_s=1.0) and not job.error, job.status
            dash.append(tok_s(store.get_run(job.run_ids[0])))
            out = subprocess.run(cli_args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                                 env={**os.environ, "SCL_DATA_DIR": str(tmp_path / "cli")})
            assert out.returncode == 0, out.stderr[-3000:]
            (rec,) = json.loads(out.stdout)
            cli.append(tok_s(RunRecord.from_dict(rec)))
    ratio = statistics.median(dash) / statistics.median(cli)
    print(f"tok/s: dashboard path {dash}, CLI {cli}: dashboard / CLI = {ratio:.2f}")
    assert ratio > MARGIN * MEASURED_DASHBOARD_OVER_CLI, (dash, cli)


# 2026-12-03, AMD EPYC with AVX-512, 2 cores, idle: dashboard path 104.1 and 105.6 tok/s, CLI 110.3 and 79.7.
MEASURED_DASHBOARD_OVER_CLI = 1.10
