"""Quality against fp32 on the shipped evaluation text."""
import torch

from engine.measure.quality import compare, eval_ids, evaluate, logprobs


def test_fp32_against_itself_is_exact(small_fp32):
    q = evaluate(small_fp32, 96)
    assert q["kl_mean"] < 1e-6 and q["top1_agreement"] == 1.0
    assert 1.0 < q["perplexity"] < 150 and q["perplexity"] == q["ref_perplexity"]


def test_int4_drifts_measurably(small_int4, small_fp32):
    q = evaluate(small_int4, 96)
    assert q["kl_mean"] > 1e-4 and q["kl_p99"] >= q["kl_mean"]
    assert 0.8 < q["top1_agreement"] < 1.0


def test_compare_on_known_distributions():
    ref = torch.log_softmax(torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]), -1)
    other = torch.log_softmax(torch.tensor([[0.0, 2.0, 0.0], [0.0, 3.0, 0.0]]), -1)
    q = compare(ref, other, [0, 0, 1])
    assert q["top1_agreement"] == 0.5
    p = ref[0].exp()
    kl0 = float((p * (ref[0] - other[0])).sum())
    assert abs(q["kl_mean"] - kl0 / 2) < 1e-6


def test_eval_text_is_long_enough(small_fp32):
    assert len(eval_ids(small_fp32.tokenizer, 10_000)) >= 600
