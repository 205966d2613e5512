"""Regression tests for defects found in review: each failed on the code before the fix.

bw_efficiency at batch > 1, the speculative loop timing its streaming callback, characters split
by per-token decoding, the over-long prompt message, production code importing tests/, SQLite
connections left open, version-1 records, and the dashboard listening on every interface.
"""
from __future__ import annotations

import ast
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch

from engine.common.errors import UserError
from engine.infer.generate import GenerationResult, generate
from engine.infer.tokens import StreamDecoder
from engine.measure.records import RunRecord
from engine.measure.summary import summarize

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- 1. metrics at batch > 1

def _fake_lm(weight_bytes=1_000_000, layers=2, kv_heads=2, head_dim=4):
    cfg = SimpleNamespace(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim)
    model = SimpleNamespace(compute_dtype=torch.float32)
    return SimpleNamespace(weights={"embedding": 500_000, "attention": weight_bytes},
                           weight_bytes=weight_bytes + 500_000, quantized={}, cfg=cfg, model=model, load_s=0.0)


def test_metrics_at_batch_4_match_a_hand_computation():
    # 4 sequences, prompt 10 tokens each, 5 new tokens each: 1 at prefill + 4 decode steps of 4 tokens.
    b, steps = 4, [0.010, 0.020, 0.010, 0.010]
    res = GenerationResult(prompt_tokens=[[1] * 10] * b, new_tokens=[[7] * 5] * b, texts=[""] * b, ttft_s=0.1,
                           step_s=steps, prefill_s=0.1, total_s=0.15, finish=["length"] * b, kv_bytes=123)
    m = summarize(_fake_lm(), res, None, bw_gbs=1.0)
    assert m["tokens_per_step"] == 4.0  # 16 tokens after the first, over 4 steps
    assert m["decode_tok_s"] == pytest.approx(16 / 0.05)
    # each user sees one token per step: per-token latency is the step time itself
    assert m["token_latency_ms_median"] == pytest.approx(10.0)
    assert m["token_latency_ms_p90"] == pytest.approx(17.0)  # 10, 10, 10, 20 -> p90 = 17
    # bytes per step: weights but the embedding (1e6) + KV at slot 10 + 5/2 = 12 for 4 sequences
    kv_slot = 2 * 2 * 2 * 4 * 4  # K and V, layers, kv heads, head dim, fp32 bytes
    step_bytes = 1_000_000 + kv_slot * 12 * b
    assert m["bytes_per_token"] == pytest.approx(step_bytes / 4)
    assert m["bw_floor_ms"] == pytest.approx(step_bytes / 4 / 1e9 * 1000)
    # the step's floor (step_bytes at 1 GB/s) over the median step (10 ms)
    assert m["bw_efficiency"] == pytest.approx((step_bytes / 1e9 * 1000) / 10.0)
    assert m["kv_bytes"] == 123


@pytest.mark.slow
def test_bf16_batch_8_bandwidth_efficiency_is_at_most_one(pool, store):
    from engine.measure.runs import RunConfig, execute

    rec = execute(RunConfig.of(model="default-draft", precision="bf16", batch_size=8, max_new_tokens=8,
                            prompt="Write a haiku about the sea.", warmup=True), pool, store)
    m = rec.metrics
    assert rec.config["batch_size"] == 8 and m["tokens_per_step"] > 4
    assert 0 < m["bw_efficiency"] <= 1.0, m["bw_efficiency"]  # version 1 reported 1.57 here


def test_version_1_records_are_read_with_their_batch_defects_corrected():
    v1 = RunRecord(kind="bench", config={"model": "m", "precision": "bf16", "batch_size": 8},
                   metrics={"bw_efficiency": 1.6, "token_latency_ms_median": 5.0, "decode_tok_s": 90.0},
                   machine={}, schema_version=1).to_dict()
    rec = RunRecord.from_dict(v1)
    assert rec.schema_version == 3  # read as the current version
    assert rec.metrics["bw_efficiency"] == pytest.approx(0.2)
    assert rec.metrics["token_latency_ms_median"] == pytest.approx(40.0)
    assert rec.metrics["decode_tok_s"] == 90.0
    assert "schema 1" in rec.notes
    assert v1["metrics"]["bw_efficiency"] == 1.6  # the saved dict is not rewritten
    one = dict(v1, config={"model": "m", "batch_size": 1})
    assert RunRecord.from_dict(one).metrics["bw_efficiency"] == 1.6


# ---------------------------------------------------------------- 2. the spec loop does not time its callback

def test_speculative_step_times_exclude_the_streaming_callback(monkeypatch):
    from engine.infer.speculative import NgramProposer, generate_speculative
    from tests.tiny import tiny_model

    clock = {"t": 0.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])  # every engine clock reads this one

    def slow_ui(i, t, piece, origin):  # a UI redraw that takes one (fake) second per token
        clock["t"] += 1.0

    res = generate_speculative(tiny_model(), NgramProposer(), "abcabcabcabcabc", 12, gamma=3, on_token=slow_ui,
                               chat=False)
    assert len(res.new_tokens[0]) == 12
    assert sum(res.step_s) == 0.0 and res.spec["draft_s"] == 0.0 and res.spec["verify_s"] == 0.0
    assert res.total_s == 12.0  # the callback is in the wall time of the whole request, not in the steps


# ---------------------------------------------------------------- 6. streaming never splits a character

TEXT = "Hi 😀 数据库 — naïve café 🚀🧪!"


def test_stream_decoder_pieces_join_to_the_text(small_int4):
    tok = small_int4.tokenizer
    ids = tok(TEXT)["input_ids"]
    assert any("\ufffd" in tok.decode([t]) for t in ids)  # per-token decoding splits characters here
    dec = StreamDecoder(tok)
    pieces = [dec.push(t) for t in ids] + [dec.flush()]
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in p for p in pieces)


def test_generation_streams_whole_characters(small_int4):
    pieces = []
    res = generate(small_int4, "Reply with exactly this text and nothing else: 😀🚀 数据", 16,
                   on_token=lambda i, t, s, o: pieces.append(s))
    assert "".join(pieces) == res.texts[0]
    assert not any("\ufffd" in p for p in pieces)


# ---------------------------------------------------------------- 5b. an over-long prompt says what fits

def test_over_long_prompt_says_how_many_prompt_tokens_fit():
    from engine.infer.tokens import check_length

    cfg = SimpleNamespace(max_position=100)
    with pytest.raises(UserError) as e:
        check_length(cfg, prompt_len=150, max_new_tokens=20)
    assert "shorten the prompt to at most 80 tokens" in str(e.value) and "at most 0" not in str(e.value)
    with pytest.raises(UserError, match="at most 30 new tokens, or shorten the prompt to 50"):
        check_length(cfg, prompt_len=70, max_new_tokens=50)


# ---------------------------------------------------------------- 7. production code never imports tests/

def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
    return mods


def test_production_code_never_imports_tests():
    files = [ROOT / "app.py", *(ROOT / "pages").glob("*.py"), *(ROOT / "engine").rglob("*.py")]
    bad = {str(f.relative_to(ROOT)): m for f in files for m in _imports(f) if m == "tests" or m.startswith("tests.")}
    assert not bad


# ---------------------------------------------------------------- 8. the store closes its connections

def test_store_closes_every_connection(tmp_path, monkeypatch):
    from engine.measure import store as store_mod

    opened, closed = [], []
    real = sqlite3.connect

    class Tracked(sqlite3.Connection):
        def close(self):
            closed.append(self)
            super().close()

    def connect(*a, **kw):
        c = real(*a, factory=Tracked, **kw)
        opened.append(c)
        return c

    monkeypatch.setattr(store_mod.sqlite3, "connect", connect)
    st = store_mod.Store(tmp_path / "lab.sqlite")
    rec = RunRecord(kind="bench", config={"model": "m"}, metrics={}, machine={})
    st.save_run(rec)
    st.get_run(rec.run_id)
    st.list_runs()
    with pytest.raises(sqlite3.IntegrityError):
        st.save_run(rec)  # an error path closes too
    assert len(opened) == 5 and len(closed) == 5


# ---------------------------------------------------------------- security: loopback by default

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_dashboard_listens_on_loopback_only(tmp_path):
    """`streamlit run app.py` as the project configures it (no address flag) binds 127.0.0.1 alone."""
    port = _free_port()
    env = dict(os.environ, SCL_DATA_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.port", str(port), "--server.fileWatcherType", "none"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("streamlit did not answer on 127.0.0.1")
        listening = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == {"127.0.0.1"}, listening
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_make_run_binds_loopback_and_warns_for_the_lan():
    from engine.dashboard_launch import streamlit_cmd

    dry = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "engine.dashboard_launch --host 127.0.0.1" in dry
    lan = subprocess.run(["make", "-n", "run", "HOST=0.0.0.0"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "engine.dashboard_launch --host 0.0.0.0" in lan and "WARNING" in lan
    cmd = streamlit_cmd("127.0.0.1", 8501, [])  # what the launcher runs: the dashboard on the host it was given
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1" and cmd[cmd.index("--server.port") + 1] == "8501"
