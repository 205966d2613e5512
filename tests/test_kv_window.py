"""Sliding windows in the paged KV cache: when every layer is windowed (Mistral), a sequence holds only the
blocks of its window and of its next step (engine/infer/blocks.py trim, engine/infer/scheduler.py), with
the tokens of transformers and of a cache that keeps everything. With full layers beside windowed ones
(Gemma 3), the windowed layers hold theirs in a pool of their own (blocks.TwoPools). A tiny Mistral and a
tiny Gemma 3 (two windowed layers, one full) with a 64-token window; prompts of 500-1,300 tokens run 8-20
windows past it."""
from __future__ import annotations

import pytest
import torch

from engine.common.errors import UserError
from engine.infer.batch import Request
from engine.common.formulas import sequence_blocks
from engine.infer.paged import block_bytes
from engine.infer.sampling import SamplingParams
from engine.infer.scheduler import BatchSettings, Scheduler
from tests import families as F

WINDOW, CHUNK, N_NEW, MAX_LEN = 64, 64, 40, 1400
LENGTHS = (900, 500, 1300, 700)
SHAPE = dict(sliding_window=WINDOW, max_position_embeddings=2048, head_dim=32)  # int8 KV scales keys per 32
BASE = dict(max_seqs=4, max_model_len=MAX_LEN, max_batched_tokens=4 + CHUNK, prefill_chunk=CHUNK, kv_cache="paged")


GEMMA = dict(SHAPE, head_dim=64, layer_types=["sliding_attention", "full_attention", "sliding_attention"])  # the fused
# attention takes head_dim 64 and up


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    from engine.infer.loader import load

    folder = F.build("mistral", tmp_path_factory.mktemp("mistral-window"), **SHAPE)
    return load(str(folder), "fp32")


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    return F.build("gemma3", tmp_path_factory.mktemp("gemma-window"), **GEMMA)


@pytest.fixture(scope="module")
def gemma(gemma_folder):
    from engine.infer.loader import load

    return load(str(gemma_folder), "fp32")


@pytest.fixture(scope="module")
def gemma_int8(gemma_folder):
    """The same weights at int8: the fused C++ step runs it (fp32 models run the PyTorch path)."""
    from engine.infer.loader import load

    return load(str(gemma_folder), "int8")


def _transformers_tokens(family, shape, prompt):
    ref = F.hf_model(family, **shape)
    with torch.inference_mode():
        return ref.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(prompt):].tolist()


def _prompts(lengths=LENGTHS, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, F.VOCAB, (n,), generator=g).tolist() for n in lengths]


def _run(lm, settings, prompts, followers=(), stagger=0):
    """The prompts submitted `stagger` steps apart, each with an n-choice follower if its index is in
    `followers`; returns the tokens (in submission order), the scheduler, and the most blocks any one
    sequence held."""
    sched = Scheduler(lm, settings)
    reqs = []
    for i, p in enumerate(prompts):
        reqs.append([Request(p, N_NEW, SamplingParams(), stop_at_eos=False)])
        if i in followers:
            reqs[-1].append(Request(p, N_NEW, SamplingParams(), stop_at_eos=False, prefix_from=reqs[-1][0]))
    order = [r for rs in reqs for r in rs]
    seqs = {}
    for i, r in enumerate(order):
        r.on_token = lambda s, *a, i=i: seqs.setdefault(i, s)
    steps = most = 0
    while reqs or sched.has_work():
        if reqs and steps % (stagger or 1) == 0:
            for r in reqs.pop(0) if stagger else [r for rs in reqs for r in rs]:
                sched.submit(r)
            reqs = reqs if stagger else []
        sched.step()
        steps += 1
        most = max([most] + [sched.blocks.held(s.slot) for s in sched.running])
    return [list(seqs[i].out) for i in range(len(order))], sched, most


def test_a_windowed_sequence_holds_its_window_and_gives_transformers_tokens(mistral):
    prompts = _prompts()
    tokens, sched, most = _run(mistral, BatchSettings(**BASE), prompts)
    one = sequence_blocks(MAX_LEN, 64, WINDOW, CHUNK)
    full = -(-MAX_LEN // 64)
    assert (one, full) == (3, 22)  # the window's 63 keys and a chunk of 64 span at most 3 blocks
    assert sched.batch.cache.num_blocks == 4 * one  # the default budget: what 4 such sequences hold
    assert most <= one and sched.blocks.peak <= 4 * one <= 4 * full / 6
    assert sched.preemptions == 0 and sched.blocks.used() == 0
    assert sched.kv_facts()["kv_window"] == WINDOW and sched.kv_facts()["blocks_peak"] == sched.blocks.peak
    for i in (0, 2):
        assert tokens[i] == _transformers_tokens("mistral", SHAPE, prompts[i]), i


def test_windowed_layers_beside_full_ones_hold_their_window_in_a_pool_of_their_own(gemma):
    """The full layer keeps every position (22 blocks a sequence), the two windowed ones their window and a
    chunk (3 blocks): the cache is (22 + 2 x 3) / (3 x 22) = 0.42 of one that keeps every position on every
    layer, and the tokens are transformers' (on the PyTorch path; the fused step's: below)."""
    prompts = _prompts()
    tokens, sched, _ = _run(gemma, BatchSettings(**BASE), prompts)
    c, one, full = sched.batch.cache, sequence_blocks(MAX_LEN, 64, WINDOW, CHUNK), -(-MAX_LEN // 64)
    assert c.two_pools and (c.k.shape[0], c.wk.shape[0]) == (1, 2)
    assert (c.num_blocks, c.window_blocks) == (4 * full, 4 * one)  # the default budget: 4 sequences in each pool
    b = sched.blocks
    assert 0 < b.window.peak <= 4 * one and b.full.peak > 4 * one
    assert b.used() == b.window.used() == 0 and sched.preemptions == 0
    whole = 3 * 4 * full * block_bytes(gemma.model.cfg, 64, "fp32", 1)
    assert c.nbytes() / whole == pytest.approx((full + 2 * one) / (3 * full))
    kv = sched.kv_facts()
    assert (kv["kv_window"], kv["window_layers"], kv["window_blocks"], kv["window_sequence_blocks"]) == \
        (WINDOW, 2, 4 * one, one) and kv["window_blocks_peak"] == b.window.peak and kv["sequence_blocks"] == full
    from engine.serve.stats import ServerStats, prometheus_text  # /metrics: the fuller pool's share

    text = prometheus_text(ServerStats(), 1, 0, 1, 4, "m", dict(kv, blocks_used=full, window_blocks_used=one * 2))
    assert 'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n' in text
    for i in (0, 2):
        assert tokens[i] == _transformers_tokens("gemma3", GEMMA, prompts[i]), i


@pytest.mark.parametrize("model, kv_dtype, blocks, prefix", [
    ("mistral", "auto", 0, True), ("mistral", "int8", 6, False), ("gemma_int8", "auto", 0, True),
    ("gemma_int8", "int8", 6, False)])
def test_giving_blocks_back_changes_no_token(request, monkeypatch, model, kv_dtype, blocks, prefix):
    """Against a cache that keeps every block (the window's reach set to 0): the same tokens with the
    prefix cache on a shared preamble and n-choice followers (one shares its leader's first block, one
    prefills alone because its leader's blocks went back), and at int8 in a budget of 6 blocks' bytes for 4
    sequences (preempted and recomputed). Gemma at int8 weights, in the fused step: its windowed layers' pool
    gives blocks back, its full layer's keeps them."""
    from engine import ops

    lm = request.getfixturevalue(model)
    fused_before = ops.fused_info()["fused_steps"]
    g = torch.Generator().manual_seed(5)
    preamble = torch.randint(3, F.VOCAB, (256,), generator=g).tolist()
    prompts = [preamble + p for p in _prompts((600, 40, 300), seed=7)] + [_prompts((100,), seed=9)[0]]
    gib = blocks * block_bytes(lm.model.cfg, 64, kv_dtype.replace("auto", "fp32")) / 2 ** 30
    if model == "gemma_int8" and blocks:  # one sequence of MAX_LEN: 22 blocks of the full layer, 3 of each windowed one
        gib = (22 + 2 * 3) * block_bytes(lm.model.cfg, 64, kv_dtype, 1) / 2 ** 30
    settings = BatchSettings(**BASE, kv_dtype=kv_dtype, prefix_caching=prefix, kv_cache_gib=gib)
    followers, stagger = ((0, 3), 6) if prefix else ((), 0)
    windowed, sched, most = _run(lm, settings, prompts, followers, stagger)
    one = sequence_blocks(MAX_LEN, 64, WINDOW, CHUNK)
    if model == "gemma_int8":
        assert sched.batch.cache.two_pools and ops.fused_info()["fused_steps"] > fused_before
    else:
        assert most <= one
    if blocks:
        assert sched.preemptions > 0
        if model == "mistral":
            assert sched.batch.cache.num_blocks == blocks
    else:  # order: 0, its follower, 1, 2, 3, its follower
        assert sched.blocks.stats.hits == 2 * 256 and sched.shared_prompt_tokens == 64
        assert windowed[1] == windowed[0] and windowed[5] == windowed[4]
    import engine.infer.paged as paged

    monkeypatch.setattr(paged, "window_reach", lambda cfg, second_pool=False: 0)
    kept, whole, _ = _run(lm, BatchSettings(**{**settings.to_dict(), "kv_cache_gib": 0}), prompts, followers,
                          stagger)
    assert whole.reach == 0 and not getattr(whole.batch.cache, "two_pools", False)
    assert whole.batch.cache.nbytes() > sched.batch.cache.nbytes()
    assert windowed == kept


def test_a_budget_below_one_windowed_sequence_is_refused_naming_both(mistral):
    gib = 2 * block_bytes(mistral.model.cfg, 64, "fp32") / 2 ** 30
    with pytest.raises(UserError) as e:
        Scheduler(mistral, BatchSettings(**BASE, kv_cache_gib=gib))
    msg = str(e.value)
    assert "holds 2 blocks" in msg and "(3 blocks" in msg and "every layer is windowed" in msg


def test_a_budget_below_one_sequence_of_both_pools_is_refused_naming_both(gemma):
    per = block_bytes(gemma.model.cfg, 64, "fp32", 1)
    with pytest.raises(UserError) as e:
        Scheduler(gemma, BatchSettings(**BASE, kv_cache_gib=27 * per / 2 ** 30))
    need = 28 * per / 2 ** 30
    msg = str(e.value)
    assert "(22 blocks" in msg and "2 windowed layers hold their window and one step's rows in 3 blocks more" in msg
    assert f"at least {need:.3f}" in msg


@pytest.mark.parametrize("model, pools", [("mistral", (10, 0)), ("gemma_int8", (21, 10))])
def test_a_static_batch_holds_its_window_with_the_tokens_of_slots(request, model, pools):
    """bench and generate's static batch (prefill-first, 512-row chunks): a windowed model's K/V go in the paged
    cache that gives blocks back, one chunk a step, with the tokens of slots that keep every position. 1,341
    positions a sequence: the window's 63 keys and a chunk span 10 blocks (Mistral: every layer; Gemma: its two
    windowed layers, its full one all 21). Short sequences stay in slots, which hold less than whole blocks."""
    from engine.infer.generate import run_static

    lm = request.getfixturevalue(model)
    cfg, prompts = lm.model.cfg, _prompts((1300, 700), seed=11)
    paged = run_static(lm, prompts, N_NEW, SamplingParams(), stop_at_eos=False)
    slots = run_static(lm, prompts, N_NEW, SamplingParams(), stop_at_eos=False, kv_cache="slots")
    assert (paged.settings["kv_cache"], slots.settings["kv_cache"]) == ("paged", "slots")
    assert paged.new_tokens == slots.new_tokens and all(len(t) == N_NEW for t in paged.new_tokens)
    one, window_one = pools
    layers = cfg.num_layers - 2 if window_one else cfg.num_layers
    assert paged.kv_bytes == 2 * (one * block_bytes(cfg, 64, "fp32", layers) +
                                  window_one * block_bytes(cfg, 64, "fp32", 2))
    assert slots.kv_bytes == 2 * 1341 * block_bytes(cfg, 1, "fp32")
    short = run_static(lm, _prompts((40,)), N_NEW, SamplingParams(), stop_at_eos=False)
    assert short.settings["kv_cache"] == "slots"
