"""`python -m engine backend` and its client: real backend processes on 127.0.0.1, started and stopped by PID.

Each backend runs `python -m tests.tiny_backend` (the backend CLI with the tiny random-init models
registered in its own process) with its own store, so records are real runs in a real SQLite file.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.backend import (Backend, BackendAuthError, BackendJobUnknown, BackendRejected, BackendUnavailable,
                            BackendVersionMismatch)
from engine.backend.contract import API_VERSION, VERSION_HEADER
from engine.common.vocab import canonical_model_name
from engine.peers.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120


class BackendProc:
    """One backend process with its own data dir and store; reached at 127.0.0.1 whatever it binds."""

    def __init__(self, tmp: Path, *args: str, api_version: int | None = None, token: str | None = None,
                 wait: bool = True, port: int | None = None):
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store_path = self.tmp / "lab.sqlite"
        self.log = self.tmp / f"backend-{self.port}.log"
        pre = ["--api-version", str(api_version)] if api_version is not None else []
        cmd = [sys.executable, "-m", "tests.tiny_backend", *pre, "--port", str(self.port), "--store",
               str(self.store_path), *args]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SCL_DATA_DIR": str(self.tmp)}
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready(token)

    def wait_ready(self, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the backend exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/v1/info", headers=headers, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the backend did not answer within {START_TIMEOUT_S} s: {self.log.read_text()[-3000:]}")

    def client(self, token: str | None = None, timeout_s: float = 10.0) -> Backend:
        return Backend(self.url, token=token, timeout_s=timeout_s)

    def kill(self) -> None:
        """SIGKILL by PID: no cleanup runs, as when a machine loses power or the OOM killer strikes."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_cfg(prompt: str = "hello", tokens: int = 12, reps: int = 1, precision: str = "fp32", **setup) -> dict:
    """A RunConfig wire dict for the tiny model: short, no warm-up, one repetition unless asked."""
    return {"setup": {"model": "tiny", "precision": precision, **setup}, "prompt": prompt, "reps": reps,
            "max_new_tokens": tokens, "warmup": False}


def runs(*cfgs: dict, peers=(), **work) -> dict:
    """A job of our runs (then peers), as pages/_backend.runs_work sends it."""
    return {"items": [{"kind": "run", **c} for c in cfgs] + [{"kind": "peer", **p} for p in peers], **work}


def slow_cfg(i: int) -> dict:
    """A run of a few seconds on the tiny model (long enough to cancel or kill the backend during the next)."""
    return run_cfg(prompt=f"slow {i}", tokens=200, reps=12)


def wait_until(pred, timeout_s: float = 120.0, poll_s: float = 0.1):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(poll_s)
    raise AssertionError("timed out waiting")


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    b = BackendProc(tmp_path_factory.mktemp("backend-a"))
    yield b
    b.stop()


def test_a_runs_job_lands_its_record_in_the_backends_store(backend):
    c = backend.client()
    info = c.info()
    assert info["api_version"] == API_VERSION and info["pid"] == backend.proc.pid
    assert {"tiny", "tiny-draft"} <= {m["name"] for m in info["models"] if m["registered"]}
    assert info["machine"]["cores"] == os.cpu_count() and info["machine"]["bandwidth_GBs"] > 0
    assert info["store"] == str(backend.store_path)
    jid = c.submit("one run", runs(run_cfg("def add(a, b):", 16)), client="tab-1")
    job = c.wait(jid, 120)
    assert job["state"] == "finished", job
    assert job["done"] == job["total"] == 1 and len(job["run_ids"]) == 1 and job["error"] is None
    (rec,) = c.records(job["run_ids"])
    assert rec["run_id"] == job["run_ids"][0] and rec["kind"] == "bench"
    assert rec["config"]["setup"]["model"] == "tiny" and rec["config"]["run_config"]["prompt"] == "def add(a, b):"
    assert rec["metrics"]["new_tokens"] > 0
    from engine.measure import RunRecord, Store

    assert Store(backend.store_path).get_run(rec["run_id"]).to_dict() == RunRecord.from_dict(rec).to_dict()
    assert any(m["name"] == "tiny" for m in c.info()["loaded"])  # the pool keeps it for the next run


def test_streamed_tokens_mark_accepted_draft_tokens(backend):
    c = backend.client()
    cfg = run_cfg("abcabcabcabcabc", 24, draft="model", draft_model="tiny-draft", gamma=3)
    jid = c.submit("playground", runs(cfg, stream=True, record_kind="playground"))
    events, since = [], 0
    while True:
        got = c.tokens(jid, since)
        events += got["events"]
        since = got["next"]
        if got["done"]:
            break
        time.sleep(0.05)
    # the stream is done when its last token is out; the job ends after it stores the record
    job = wait_until(lambda: (j := c.job(jid))["state"] != "running" and j)
    assert job["state"] == "finished", job
    (rec,) = c.records(job["run_ids"])
    assert rec["kind"] == "playground"
    trace = rec["output"]["trace"][0]
    assert [e["origin"] for e in events] == trace  # every token of the first sequence, in order
    assert "".join(e["text"] for e in events) == rec["output"]["texts"][0]
    for e in events:
        assert e["accepted"] is {"accepted": True, "bonus": False, "resample": False, "target": None}[e["origin"]]
    assert c.tokens(jid, since)["events"] == []


def test_cancel_drops_a_queued_job_and_stops_a_running_one_before_its_next_run(backend):
    c = backend.client()
    running = c.submit("four slow runs", runs(*[slow_cfg(i) for i in range(4)]), client="tab-c")
    queued = c.submit("queued behind it", runs(run_cfg("never")), client="tab-c")
    assert c.job(queued)["state"] == "queued" and c.job(queued)["position"] == 1
    assert c.cancel(queued)["state"] == "cancelled"
    first = wait_until(lambda: (j := c.job(running))["done"] >= 1 and j)
    assert first["state"] == "running" and first["position"] == 0
    c.cancel(running)
    job = c.wait(running, 120)
    assert job["state"] == "cancelled" and 1 <= job["done"] < 4 and len(job["run_ids"]) == job["done"], job
    assert [r["run_id"] for r in c.records(job["run_ids"])] == job["run_ids"]  # finished runs are kept
    never = c.job(queued)
    assert never["state"] == "cancelled" and never["run_ids"] == [] and never["started_at"] is None
    assert c.info()["queue"] == {"running": None, "queued": []}


def test_two_clients_at_once_are_queued_not_interleaved(backend):
    results: dict[str, str] = {}

    def submit(tab: str):
        c = backend.client()
        results[tab] = c.submit(f"{tab}'s comparison", runs(
            run_cfg(f"{tab} first", 150, reps=4), run_cfg(f"{tab} second", 150, reps=4)), client=tab)

    threads = [threading.Thread(target=submit, args=(t,)) for t in ("tab-x", "tab-y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = backend.client()
    jobs = {tab: c.wait(jid, 180) for tab, jid in results.items()}
    a, b = sorted(jobs.values(), key=lambda j: j["started_at"])
    assert a["state"] == b["state"] == "finished"
    assert a["finished_at"] <= b["started_at"]  # the second started after the first finished
    for tab, job in jobs.items():
        recs = c.records(job["run_ids"])
        assert [r["config"]["run_config"]["prompt"] for r in recs] == [f"{tab} first", f"{tab} second"]
        assert [j["job_id"] for j in c.jobs(tab)] == [job["job_id"]]  # each tab sees its own


@pytest.fixture()
def stub_endpoint():
    """The OpenAI-compatible stub of tests/test_load.py, streaming at known times, in this process."""
    from http.server import ThreadingHTTPServer

    from tests.test_load import StubHandler

    srv = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_load_sweep_job_measures_an_endpoint_and_stores_its_load_records(backend, stub_endpoint):
    from engine.peers.load_sweep import SweepPlan
    from engine.peers.servers import ServerSpec

    spec = ServerSpec.of("url", url=stub_endpoint, model=None).to_dict()
    plan = SweepPlan(loads="1,2", workload="chat:2", requests=2, max_output_len=4, slo="ttft=5,itl=1",
                     max_seconds=60, request_timeout_s=30).to_dict()
    dead = ServerSpec.of("url", url=f"http://127.0.0.1:{free_port()}", model=None, startup_timeout_s=1).to_dict()
    c = backend.client()
    items = [{"kind": "load-sweep", "spec": s, "plan": plan} for s in (dead, spec)]
    job = c.wait(c.submit("load", {"items": items}, client="tab-l"), 300)
    # the endpoint nobody serves is skipped with why, its two points taken off the total; the other is measured
    assert job["state"] == "finished" and job["done"] == job["total"] == 2 and job["kind"] == "load-sweep", job
    assert len(job["skipped"]) == 1 and dead["url"] in job["skipped"][0], job["skipped"]
    recs = c.records(job["run_ids"])
    assert [r["kind"] for r in recs] == ["load", "load"]
    assert [r["config"]["profile"]["streams"] for r in recs] == [1, 2]


def test_runs_and_peers_are_one_job_the_peer_in_a_fresh_process(backend):
    """The Compare page's grid and its peer rows as one job: our run here, then the peer in a fresh process (its
    record stored as a peer's), in that order. A streamed run takes no peers (400 naming the peer's item)."""
    from engine.peers import PeerConfig

    peer = PeerConfig.of(model="default-draft", precision="fp32", max_new_tokens=4, reps=1).to_dict()
    c = backend.client()
    with pytest.raises(BackendRejected) as e:
        c.submit("bad", runs(run_cfg(), peers=[peer], stream=True))
    assert e.value.field == "work.items[1]"
    job = c.wait(c.submit("grid", runs(run_cfg(), peers=[peer]), client="tab-p"), 300)
    assert job["state"] == "finished" and job["done"] == job["total"] == 2 and job["skipped"] == [], job
    ours, theirs = c.records(job["run_ids"])
    assert ours["kind"] == "bench" and theirs["kind"] == "peer" and theirs["metrics"]["new_tokens"] > 0


def test_malformed_submissions_get_a_400_naming_the_field(backend):
    c = backend.client()
    good = run_cfg()
    cases = [
        (runs(good, good, {"setup": {"model": "tiny", "precision": "int3"}}), "work.items[2].setup.precision"),
        (runs({**good, "reps": 0}), "work.items[0].reps"),
        (runs({**good, "setup": {"model": "tiny", "precison": "int4"}}), "work.items[0].setup.precison"),
        (runs({**good, "workload": "chat:2"}), "work.items[0].workload"),
        (runs({**good, "setup": {"model": "tiny", "draft": "ngram", "gamma": 99}}), "work.items[0].setup.gamma"),
        (runs(), "work.items"),
        (runs(good, record_kind="nightly"), "work.record_kind"),
        ({"kind": "runs", "configs": [good]}, "work.kind"),  # an old client's job kind: named, with the new form
        ({"items": [{"kind": "noise-rerun", **good}]}, "work.items[0].kind"),
        (runs(good, peers=[{"system": "nope"}]), "work.items[1].system"),
        ({"items": [{"kind": "load-sweep", "spec": {"system": "serving-cost-lab"}, "plan": {"loads": "1,x"}}]},
         "work.items[0].plan.loads"),
        ({"items": [{"kind": "quality", "setup": {"model": "tiny"}, "tokens": 7}]}, "work.items[0].tokens"),
        ({"items": [{"kind": "load", "setup": {"model": "tiny"}}], "stream": True}, "work.stream"),
    ]
    for work, field in cases:
        with pytest.raises(BackendRejected) as e:
            c.submit("bad", work)
        assert e.value.field == field, (work, str(e.value))
        assert e.value.fix
    r = httpx.post(backend.url + "/v1/jobs", json={"title": "", "work": runs(good)})
    assert r.status_code == 400 and r.json()["error"]["field"] == "title"
    r = httpx.post(backend.url + "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = httpx.post(backend.url + "/v1/jobs", content=b'{"title": "t"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415  # what a page of another origin could send without a preflight
    assert c.jobs("bad") == []  # nothing was queued
    with pytest.raises(BackendJobUnknown):
        c.job("nosuchjob")
    assert httpx.get(backend.url + "/v1/jobs/nosuchjob").status_code == 404
    r = httpx.get(backend.url + "/v1/jobs/x/tokens", params={"since": "-1"})
    assert r.status_code == 404
    assert httpx.get(backend.url + "/v1/runs").json()["error"]["field"] == "ids"


def test_a_client_of_another_api_version_is_refused(backend):
    r = httpx.get(backend.url + "/v1/info", headers={VERSION_HEADER: str(API_VERSION + 1)})
    assert r.status_code == 409 and r.json()["error"]["field"] == VERSION_HEADER


def test_version_mismatch_is_detected_with_the_fix(tmp_path):
    b = BackendProc(tmp_path, api_version=API_VERSION + 1)
    try:
        with pytest.raises(BackendVersionMismatch) as e:
            b.client().info()
        assert "restart the backend from this checkout" in e.value.fix
    finally:
        b.stop()


def test_no_backend_answers_is_one_clear_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnavailable) as e:
        Backend(url, timeout_s=2).info()
    assert f"no backend answers at {url}" in e.value.problem and "python -m engine backend" in e.value.fix
    with pytest.raises(BackendUnavailable) as e:
        Backend("http://10.255.255.1:8502", timeout_s=0.5).info()  # unroutable: a timeout or a refusal
    assert "on that machine" in e.value.fix


def test_a_backend_killed_mid_run_keeps_finished_runs_and_the_client_says_so(tmp_path):
    b = BackendProc(tmp_path / "dies")
    c = b.client()
    jid = c.submit("three slow runs", runs(*[slow_cfg(i) for i in range(3)]), client="tab-k")
    seen = wait_until(lambda: (j := c.job(jid))["done"] >= 1 and j)
    b.kill()
    with pytest.raises(BackendUnavailable) as e:
        c.job(jid)
    lost = c.job_lost(jid, seen, e.value)
    assert lost["state"] == "failed" and "stopped answering" in lost["error"] and lost["run_ids"] == seen["run_ids"]
    from engine.measure import Store

    store = Store(b.store_path)
    for rid in seen["run_ids"]:
        assert store.get_run(rid).run_id == rid  # finished runs were stored as they finished
    again = BackendProc(tmp_path / "dies", port=b.port)  # restarted on the same store: it does not resume the job
    try:
        job = again.client().job(jid)
        assert job["state"] == "failed" and "not resumed" in job["error"] and job["run_ids"][:1] == seen["run_ids"][:1]
        assert again.client().info()["queue"]["running"] is None
    finally:
        again.stop()


def test_a_finished_run_is_shown_only_once_it_is_journaled():
    """The race the test above once lost (0 runs listed after the restart, 1 seen before the kill): a reader
    waits while add_run journals, so nothing a client saw can be missing from a restarted backend's list."""
    from engine.backend.jobs import Job

    job = Job(None)
    journaling, journaled = threading.Event(), threading.Event()

    def journal(j):
        journaling.set()
        assert journaled.wait(10)

    job.on_change = journal
    writer = threading.Thread(target=job.add_run, args=("r1",))
    writer.start()
    assert journaling.wait(10)
    seen: list[dict] = []
    reader = threading.Thread(target=lambda: seen.append(job.to_dict()))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not seen  # the reader waits for the journal
    journaled.set()
    writer.join(10)
    reader.join(10)
    assert seen[0]["run_ids"] == ["r1"] and seen[0]["done"] == 1


def test_a_non_loopback_bind_needs_a_token_and_every_request_carries_it(tmp_path):
    refused = BackendProc(tmp_path / "no-token", "--host", "0.0.0.0", wait=False)
    assert refused.proc.wait(timeout=120) == 2
    out = refused.log.read_text()
    assert "needs a token" in out and "--token-file" in out and "Traceback" not in out

    token = "s3cret-" + os.urandom(12).hex()
    tf = tmp_path / "token"
    tf.write_text(token + "\n")
    tf.chmod(0o600)
    b = BackendProc(tmp_path / "with-token", "--host", "0.0.0.0", "--token-file", str(tf), token=token)
    try:
        for bad in (None, "wrong-" + token):
            with pytest.raises(BackendAuthError) as e:
                b.client(token=bad).info()
            assert "SCL_BACKEND_TOKEN_FILE" in e.value.fix
        r = httpx.post(b.url + "/v1/jobs", json={"title": "sneak", "work": runs(run_cfg())})
        assert r.status_code == 401
        r = httpx.post(b.url + "/v1/jobs", json={"title": "sneak", "work": runs(run_cfg())},
                       headers={"Authorization": "Bearer " + token[:-1]})
        assert r.status_code == 401
        good = b.client(token=token)
        assert good.info()["pid"] == b.proc.pid
        assert good.jobs() == []  # nothing ran
        os.environ["SCL_BACKEND_URL"], os.environ["SCL_BACKEND_TOKEN_FILE"] = b.url, str(tf)
        try:
            assert Backend.from_env().info()["pid"] == b.proc.pid
        finally:
            os.environ.pop("SCL_BACKEND_URL")
            os.environ.pop("SCL_BACKEND_TOKEN_FILE")
    finally:
        b.stop()


def test_a_remote_backend_on_another_port_is_that_machines(backend, tmp_path):
    """A second backend with its own store stands in for a GPU box: its info and records are its own."""
    remote = BackendProc(tmp_path / "remote")
    try:
        here, there = backend.client(), remote.client()
        assert there.info()["pid"] == remote.proc.pid != here.info()["pid"]
        assert there.info()["store"] == str(remote.store_path) != here.info()["store"]
        jid = there.submit("on the remote", runs(run_cfg("remote prompt", 8)), client="lap")
        job = there.wait(jid, 120)
        assert job["state"] == "finished"
        (rec,) = there.records(job["run_ids"])
        assert rec["config"]["run_config"]["prompt"] == "remote prompt"
        assert here.records(job["run_ids"]) == []  # the other machine's store does not have it
        with pytest.raises(BackendJobUnknown):
            here.job(jid)
    finally:
        remote.stop()


def test_the_client_imports_no_torch():
    code = "import engine.backend.client, engine.backend, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_with_ray_a_runs_job_goes_to_the_cluster_and_lands_in_the_backends_store(tmp_path):
    """--ray local: each configuration a Ray task (engine.cluster), its record stored by the backend.
    The 0.5B (catalog) model: Ray's workers are fresh processes without the test registry."""
    pytest.importorskip("ray")
    b = BackendProc(tmp_path, "--ray", "local")
    try:
        c = b.client()
        assert c.info()["ray"] == "local"
        cfg = {"setup": {"model": "default-draft", "precision": "fp32"}, "reps": 1, "max_new_tokens": 4,
               "warmup": False}
        job = c.wait(c.submit("on ray", runs(cfg)), 400)
        assert job["state"] == "finished" and job["done"] == 1, job
        (rec,) = c.records(job["run_ids"])
        # the record names the model the catalog resolved ("default-draft" is its alias)
        assert (rec["machine"]["ray_node_id"]
                and rec["config"]["setup"]["model"] == canonical_model_name("default-draft"))
        # the Playground on a --ray backend (issue 40.4): a streamed generation runs in the backend, tokens arrive
        jid = c.submit("playground", runs({**cfg, "prompt": "def add(a, b):"}, stream=True, record_kind="playground"))
        events, since = [], 0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            got = c.tokens(jid, since)
            events, since = events + got["events"], got["next"]
            if got["done"]:
                break
            time.sleep(0.1)
        job = c.wait(jid, 300)
        assert job["state"] == "finished" and 1 <= len(events) <= 4, (job, events)
        (rec,) = c.records(job["run_ids"])
        assert "".join(e["text"] for e in events) == rec["output"]["texts"][0] and "ray_node_id" not in rec["machine"]
    finally:
        b.stop()
