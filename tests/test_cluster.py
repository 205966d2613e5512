"""Sweeps and load tests on a real local Ray cluster (engine/cluster, docs/CLUSTER.md).

One cluster (2 CPUs, started in this process by `ray.init`, shut down at the end of the module) is
shared by every Ray test here: starting it costs about 8 s on 2 cores. Ray 2.60 resolves a loopback
node address to the machine's own interface (ray._private.services.resolve_ip_for_localhost), so
the cluster listens on this machine's address, not on 127.0.0.1; nothing leaves the machine.
The tests before the fixture run without Ray.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from engine.__main__ import build_parser, config_from, main
from engine.cluster.load import split
from engine.common.errors import UserError
from engine.load.profiles import Profile
from engine.load.requests import Request
from engine.measure.records import RunRecord
from engine.measure.stats import percentile
from engine.measure.store import Store
from engine.measure.grid import sweep_configs
from engine.present.compare import highlights, machine_note

# The 0.5B, greedy, the default prompt, 4 new tokens, one repetition (the fewest the runner allows): fp32 without
# a draft and with n-gram drafts at gamma 1, 2 and 3, four configurations on one model (the session's small_fp32
# here, one load in the worker): a second precision would add a load on each side and, for int8/int4, a kernel build.
BUDGET = ["--model", "default-draft", "--precisions", "fp32", "--drafts", "none,ngram", "--gammas", "1,2,3",
          "--reps", "1", "--max-new-tokens", "4"]


# ---------------------------------------------------------------- without a cluster

def test_ray_missing_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the extra
    from engine.cluster import require_ray

    with pytest.raises(UserError, match=r"pip install -e '\.\[cluster\]'.*ray==2\.60\.0"):
        require_ray()
    assert main(["bench", *BUDGET, "--ray", "local"]) == 2
    assert "--ray needs Ray, which is not installed" in capsys.readouterr().err
    assert main(["load", "--url", "http://127.0.0.1:9", "--input-len", "8", "--output-len", "4",
                 "--ray", "auto", "--clients", "2"]) == 2
    assert "pip install -e '.[cluster]'" in capsys.readouterr().err


def test_bad_cluster_arguments_are_refused(capsys):
    assert main(["bench", *BUDGET, "--ray", "nowhere"]) == 2
    assert "'nowhere' is not a Ray address" in capsys.readouterr().err
    assert main(["load", "--url", "http://127.0.0.1:9", "--input-len", "8", "--output-len", "4",
                 "--clients", "3"]) == 2
    assert "--clients 3 needs a Ray cluster" in capsys.readouterr().err
    assert main(["load", "--url", "http://127.0.0.1:9", "--input-len", "8", "--output-len", "4", "--ray", "local",
                 "--generator", "guidellm"]) == 2
    assert "not GuideLLM" in capsys.readouterr().err


def _reqs(n):
    return [Request(f"r{i}", 8, 4, prompt=[1] * 8) for i in range(n)]


def test_a_load_point_is_shared_so_the_merged_load_is_the_asked_one():
    reqs = _reqs(9)
    # constant:4 over 3 clients: rate 4/3 each, client i starting i/4 later -> merged send times j/4
    shares = split(Profile("constant", rate=4.0), reqs, 3)
    times = sorted(off + t for _, p, share, off in shares for t in p.send_times(len(share)))
    assert times == pytest.approx([j / 4 for j in range(9)])
    assert sorted(r.id for _, _, share, _ in shares for r in share) == sorted(r.id for r in reqs)
    # concurrent:5 over 2 clients: 3 + 2 streams, each request sent once, by its stream's owner
    shares = split(Profile("concurrent", streams=5), reqs, 2)
    assert [p.streams for _, p, _, _ in shares] == [3, 2]
    assert [len(s) for _, _, s, _ in shares] == [6, 3] and sum(len(s) for _, _, s, _ in shares) == 9
    # more clients than streams: only as many clients as streams get work
    assert [i for i, *_ in split(Profile("concurrent", streams=2), reqs, 4)] == [0, 1]
    # poisson:6 over 3: rates add up, seeds differ (independent arrivals)
    shares = split(Profile("poisson", rate=6.0, seed=1), reqs, 3)
    assert sum(p.rate for _, p, _, _ in shares) == pytest.approx(6.0) and len({p.seed for _, p, _, _ in shares}) == 3
    # synchronous is one request at a time: one client
    assert [(i, len(s)) for i, _, s, _ in split(Profile("synchronous", streams=1), reqs, 4)] == [(0, 9)]


def test_a_configuration_asks_for_a_gpu_or_a_nodes_cores():
    from engine.cluster import label_of, resources
    from engine.measure.runs import RunConfig

    gpu, cpu, auto = RunConfig.of(device="cuda"), RunConfig.of(device="cpu"), RunConfig.of(device="auto")
    assert resources(gpu, 16, gpus_in_cluster=4) == {"num_gpus": 1, "num_cpus": 1}
    assert resources(auto, 16, gpus_in_cluster=4) == {"num_gpus": 1, "num_cpus": 1}  # auto on a GPU cluster
    assert resources(auto, 16, gpus_in_cluster=0) == {"num_cpus": 16} == resources(cpu, 16, gpus_in_cluster=4)
    with pytest.raises(UserError, match="asks for a GPU and the Ray cluster has none"):
        resources(gpu, 16, gpus_in_cluster=0)  # refused, not left pending for ever
    spec = RunConfig.of(model="default", precision="int4", draft="model", draft_precision="int4", gamma=3, batch_size=2)
    assert label_of(spec) == "default@int4 + default-draft@int4 g=3 b=2" == spec.label


def test_comparisons_warn_when_configurations_ran_on_different_machines():
    rows = [{"config": "a@int4", "machine": "Xeon 8480 + NVIDIA H100", "tok_s": 100.0},
            {"config": "a@int8", "machine": "Xeon 8480 + NVIDIA H100", "tok_s": 90.0},
            {"config": "a@fp32", "machine": "EPYC 7763 + NVIDIA A100", "tok_s": 50.0}]
    note = machine_note(rows)
    assert note.startswith("Measured on different kinds of machine")
    assert "Xeon 8480 + NVIDIA H100 (a@int4, a@int8)" in note and "EPYC 7763 + NVIDIA A100 (a@fp32)" in note
    assert note in highlights(rows)
    same = [dict(r, machine="Xeon 8480 + NVIDIA H100") for r in rows]
    assert machine_note(same) is None and not any("kinds of machine" in h for h in highlights(same))
    assert machine_note([{"config": "x"}, {"config": "y"}]) is None  # rows without machine facts: nothing said


def test_the_machine_column_comes_from_the_records_machine_facts():
    from engine.measure.records import RunRecord
    from engine.present import rows

    def rec(cpu, gpu, device):
        return RunRecord(kind="bench", config={"model": "m", "precision": "int4", "device": device},
                         metrics={"decode_tok_s": 10.0}, machine={"cpu_model": cpu, "gpu_name": gpu})

    table = rows([rec("AMD EPYC 9R14", None, "cpu"), rec("Intel Xeon 8480", "NVIDIA H100", "cuda"),
                  rec("Intel Xeon 8480", "NVIDIA H100", "cpu")])
    assert [r["machine"] for r in table] == ["AMD EPYC 9R14", "Intel Xeon 8480 + NVIDIA H100", "Intel Xeon 8480"]
    assert machine_note(table).startswith("Measured on different kinds of machine")


# ---------------------------------------------------------------- one local Ray cluster for the rest

@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 2**20)
    yield ray
    ray.shutdown()


def _all_cpus_free(ray, timeout_s: float = 15.0) -> bool:
    """Whether every CPU of the cluster is free again (Ray releases a finished task's cores asynchronously)."""
    t0 = time.time()
    while ray.available_resources().get("CPU") != 2 and time.time() - t0 < timeout_s:
        time.sleep(0.2)
    return ray.available_resources().get("CPU") == 2


def test_bench_sweep_through_ray_lands_in_the_store_as_a_local_run_would(ray_cluster, pool, tmp_path, monkeypatch,
                                                                       capsys):
    from engine.measure.runs import execute

    monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path))
    assert main(["bench", *BUDGET, "--ray", "local", "--json"]) == 0
    recs = [RunRecord.from_dict(d) for d in json.loads(capsys.readouterr().out)]
    assert len(recs) == 4
    stored = {r.run_id: r for r in Store(tmp_path / "lab.sqlite").list_runs()}
    assert set(stored) == {r.run_id for r in recs}
    # The same four configurations measured here, by the same code path, on the session's models.
    a = build_parser().parse_args(["bench", *BUDGET])
    base = config_from(a, warmup=True, baseline=True, quality=False, quality_tokens=256)
    local = [execute(c, pool) for c in sweep_configs(base, a.precisions, a.drafts, a.draft_precisions, a.gammas)]
    node = ray_cluster.nodes()[0]["NodeID"]
    for r, lo in zip(recs, local):
        r = stored[r.run_id]
        assert r.label == lo.label and r.config == lo.config  # the configuration, as recorded
        assert r.output["new_tokens"] == lo.output["new_tokens"] and r.output["texts"] == lo.output["texts"]
        for k in ("weight_bytes", "weight_breakdown", "quantized_layers", "prompt_tokens", "new_tokens"):
            assert r.metrics.get(k) == lo.metrics.get(k), k
        if lo.metrics.get("spec"):
            assert r.metrics["spec"]["acceptance_rate"] == lo.metrics["spec"]["acceptance_rate"]
        for k in ("cpu_model", "simd", "cores", "device", "memory_bytes"):
            assert r.machine[k] == lo.machine[k], k
        assert r.machine["ray_node_id"] == node and r.machine["hostname"] and "ray_node_id" not in lo.machine
        assert r.versions == lo.versions


def test_the_compare_pages_sweep_runs_on_ray_through_a_backend_started_with_ray(ray_cluster, tmp_path, monkeypatch):
    """The dashboard measures nothing: its sweep goes to a backend that sends each run to the Ray cluster
    (`python -m engine backend --ray ...`); the record lands in the backend's store and the page imports it."""
    from streamlit.testing.v1 import AppTest

    from tests.app_helpers import ROOT, TIMEOUT, backend_in_thread, frame, problems, wait_job

    with backend_in_thread(tmp_path / "backend" / "lab.sqlite", ray="local") as b:
        monkeypatch.setenv("SCL_PAGE_DIRECT", "1")  # the page file itself (see _ui.hand_over_to_app)
        monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path / "dashboard"))  # the dashboard's own store
        monkeypatch.setenv("SCL_BACKEND_URL", b.url)
        at = AppTest.from_file(str(ROOT / "pages/compare.py"), default_timeout=TIMEOUT).run()
        at.selectbox(key="cmp-model").set_value("default-draft")
        at.multiselect(key="cmp-precisions").set_value(["fp32"])
        at.multiselect(key="cmp-drafts").set_value(["none"])
        at.number_input(key="cmp-tokens").set_value(2)
        at.text_input(key="cmp-workload").set_value("")
        at.number_input(key="cmp-reps").set_value(1)
        at.run()
        at.button(key="cmp-run").click().run()
        job = wait_job(at, "sweep-job")
        assert not problems(at) and len(job.run_ids) == 1
        assert len(frame(at, "config", "tok_s")) == 1
        [rec] = Store(tmp_path / "dashboard" / "lab.sqlite").list_runs()  # imported by the page
        assert rec.run_id == job.run_ids[0] and rec.machine["ray_node_id"] == ray_cluster.nodes()[0]["NodeID"]
        assert [r.run_id for r in b.store.list_runs()] == [rec.run_id]  # stored by the backend as it landed


def _tiny(**kw):
    from engine.measure.runs import RunConfig

    return RunConfig.of(model="default-draft", max_new_tokens=2, reps=1, device="cpu", **kw).validate()


def test_a_worker_that_dies_mid_sweep_is_reported_and_the_rest_land(ray_cluster, tmp_path):
    from engine.cluster import run_on_ray

    class Crash:  # defined here, so Ray pickles it by value
        device, label = "cpu", "crashes its worker"

        def measure(self, pool, store=None, progress=None):
            os._exit(17)

    class Refuses:
        device, label = "cpu", "refuses its input"

        def measure(self, pool, store=None, progress=None):
            raise UserError("gamma 99 is out of range", "use 1 to 16")

    store, failed = Store(tmp_path / "lab.sqlite"), []
    out = run_on_ray([_tiny(), Crash(), Refuses(), _tiny(seed=1)], "local", store, on_failure=failed.append)
    assert [f.label for f in failed] == [f.label for f in out.failures]
    reasons = {f.label: f.reason for f in out.failures}
    assert set(reasons) == {"crashes its worker", "refuses its input"}
    assert "worker process died" in reasons["crashes its worker"]
    assert reasons["refuses its input"].startswith("UserError: gamma 99 is out of range")
    assert len(out.records) == 2 and not out.cancelled
    assert {r.run_id for r in store.list_runs()} == {r.run_id for r in out.records}
    assert [r.config["run_config"]["seed"] for r in out.records] == [0, 1]  # in the configurations' order


def test_cancel_from_the_dashboard_cancels_the_outstanding_tasks(ray_cluster, tmp_path):
    """Cancel on a page asks the backend (JobQueue.cancel); a sweep it sent to Ray stops its running task and
    drops the pending ones, rather than waiting for them."""
    from engine.backend.jobs import Job, JobQueue
    from engine.cluster import sweep_job
    from engine.measure.pool import ModelPool

    class Slow:
        device = "cpu"

        def __init__(self, i):
            self.label = f"slow {i}"

        def measure(self, pool, store=None, progress=None):
            for _ in range(1200):  # two minutes in short sleeps: a KeyboardInterrupt lands between them
                time.sleep(0.1)

    cfgs = [Slow(0), Slow(1), Slow(2)]
    store = Store(tmp_path / "lab.sqlite")
    queue = JobQueue(store, ModelPool(), ray="local")
    job = Job(None, store)  # what the worker runs for a 'runs' submission on --ray (configs a test's own here)
    job.total, job.state, job.started_at = len(cfgs), "running", time.time()
    t0 = time.time()
    worker = threading.Thread(target=sweep_job(cfgs, "local"), args=(job,), daemon=True)
    worker.start()
    while "sent to the Ray cluster" not in job.message and time.time() - t0 < 60:
        time.sleep(0.2)
    time.sleep(2)  # one task running, two pending
    queue.cancel(job)
    worker.join(60)
    assert not worker.is_alive() and job.error is None
    assert time.time() - t0 < 60  # the running task was interrupted, not waited for (2 minutes)
    assert job.done == 0 and job.run_ids == [] and job.skipped == []
    assert _all_cpus_free(ray_cluster)  # nothing left running on the cluster


def test_load_from_two_ray_clients_merges_their_raw_samples(ray_cluster, tmp_path, monkeypatch, capsys):
    from tests.test_load import Stub, StubHandler

    srv = ThreadingHTTPServer(("127.0.0.1", 0), StubHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://{srv.server_address[0]}:{srv.server_address[1]}"
    monkeypatch.setenv("SCL_DATA_DIR", str(tmp_path))
    Stub.refuse_forcing, Stub.max_in_flight = False, 100
    try:
        rc = main(["load", "--url", url, "--profile", "concurrent:4", "--input-len", "8", "--output-len", "4",
                   "--requests", "8", "--slo", "ttft=5", "--ray", "local", "--clients", "2", "--json"])
    finally:
        srv.shutdown()
        srv.server_close()
    assert rc == 0
    [rec] = json.loads(capsys.readouterr().out)
    assert Store(tmp_path / "lab.sqlite").get_run(rec["run_id"]).kind == "load"
    samples, m, clients = rec["output"]["samples"], rec["metrics"]["load"], rec["config"]["clients"]
    assert sorted(s["client"] for s in samples) == [0] * 4 + [1] * 4
    assert (m["requests"], m["completed"]) == (8, 8)
    assert clients["count"] == 2 and len({n["ray_node_id"] for n in clients["nodes"]}) == 1  # one node here
    assert [s["profile"] for s in clients["shares"]] == ["concurrent:2", "concurrent:2"]
    # One record from the merged raw samples: its percentiles are the samples', not an average of two clients'.
    assert m["ttft_s_p90"] == pytest.approx(percentile([s["ttft_s"] for s in samples], 90), abs=1e-6)
    assert m["concurrency_mean"] <= 4 + 1e-6
    # Both clients sent at once, on one time axis: their windows overlap.
    a, b = ([s for s in samples if s["client"] == c] for c in (0, 1))
    assert min(s["t_send_s"] for s in b) < max(s["t_end_s"] for s in a)
    assert min(s["t_send_s"] for s in a) < max(s["t_end_s"] for s in b)
    assert _all_cpus_free(ray_cluster)  # the client actors were killed afterwards
