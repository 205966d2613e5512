"""Our model against transformers on the real 0.5B weights."""
import torch

from engine.infer.generate import generate

PROMPTS = [
    "def quicksort(arr):",
    "Explain what a hash map is.",
    "Write a haiku about compilers.",
]


def test_fp32_logits_match_transformers(small_fp32, hf_small):
    tok = small_fp32.tokenizer
    ids = tok("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", return_tensors="pt").input_ids
    with torch.inference_mode():
        ref = hf_small(ids).logits
        cache = small_fp32.model.new_cache(1, ids.shape[1])
        ours = small_fp32.model(ids, 0, cache)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-3


def test_ragged_rows_match_each_sequence_alone(small_fp32, hf_small):
    """Two sequences of different lengths in one pass (each in its own cache slot) match transformers."""
    from engine.infer.model import Rows

    tok = small_fp32.tokenizer
    a = tok("import numpy as np\nimport pandas as pd\n", return_tensors="pt").input_ids[0]
    b = tok("x = 1", return_tensors="pt").input_ids[0]
    m = small_fp32.model
    with torch.inference_mode():
        cache = m.new_cache(3, 64)
        rows = Rows.of([(2, 0, len(a)), (0, 0, len(b))], "cpu")  # slots need not be in order
        ours = m.forward_rows(torch.cat([a, b]), rows, cache)
        # then one decode row each, at their own positions, in the same pass
        nxt = torch.tensor([int(ours[len(a) - 1].argmax()), int(ours[-1].argmax())])
        step = m.forward_rows(nxt, Rows.of([(2, len(a), 1), (0, len(b), 1)], "cpu"), cache)
        ref_a = hf_small(torch.cat([a, nxt[:1]])[None]).logits[0]
        ref_b = hf_small(torch.cat([b, nxt[1:]])[None]).logits[0]
    assert (ours[:len(a)] - ref_a[:-1]).abs().max().item() < 1e-3
    assert (ours[len(a):] - ref_b[:-1]).abs().max().item() < 1e-3
    assert (step[0] - ref_a[-1]).abs().max().item() < 1e-3 and (step[1] - ref_b[-1]).abs().max().item() < 1e-3


def test_greedy_64_tokens_identical_to_transformers(small_fp32, hf_small):
    """Our 64 greedy tokens are transformers' argmax at every position of prompt + those tokens, in one forward
    pass: by induction they are what transformers' greedy generate makes (its 64 cached decode steps per prompt
    took half of this test's time)."""
    tok = small_fp32.tokenizer
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids[0].tolist()
        ours = generate(small_fp32, [p], 64, chat=False, stop_at_eos=False).new_tokens[0]
        assert len(ours) == 64
        with torch.inference_mode():
            logits = hf_small(torch.tensor([ids + ours])).logits[0, len(ids) - 1:-1]
        assert logits.argmax(-1).tolist() == ours, p


def test_incremental_decode_matches_full_pass(small_fp32):
    tok = small_fp32.tokenizer
    ids = tok("for i in range(10):\n    print(i)", return_tensors="pt").input_ids
    n = ids.shape[1]
    with torch.inference_mode():
        full = small_fp32.model(ids, 0, small_fp32.model.new_cache(1, n))
        cache = small_fp32.model.new_cache(1, n)
        small_fp32.model(ids[:, : n - 3], 0, cache)
        part = small_fp32.model(ids[:, n - 3 :], n - 3, cache)
    assert (part - full[:, n - 3 :]).abs().max().item() < 1e-3


def test_a_half_precision_decode_rows_attention_is_sdpas_in_fp32():
    """A bf16/fp16 decode row on CPU takes _attend_row (fp32 bmm, not torch's SDPA flash kernel): the fp32 SDPA of
    the same half-precision inputs, rounded once, with query head i on KV head i // (H / KV), windows included."""
    import torch.nn.functional as F

    from engine.infer.model import _attend

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, m, 64, generator=g) for h, m in ((14, 1), (2, 37), (2, 37)))
    for dt in (torch.bfloat16, torch.float16):
        qh, kh, vh = q.to(dt), k.to(dt), v.to(dt)
        for k0 in (0, 29):  # all 37 keys; a window of 8 whose first key is at position 29
            want = F.scaled_dot_product_attention(qh.float(), kh[:, :, k0:].float(), vh[:, :, k0:].float(),
                                                  scale=0.125, enable_gqa=True)
            got = _attend(qh, kh[:, :, k0:], vh[:, :, k0:], 36, k0, 8 if k0 else 0, 0.125, 0.0)
            assert got.dtype is dt and got.shape == (1, 14, 1, 64)
            torch.testing.assert_close(got.float(), want.to(dt).float(), rtol=2 ** -7, atol=1e-5)
