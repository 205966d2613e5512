"""Generation: sampling controls, streaming, stopping, and refusals."""
import pytest
import torch

from engine.common.errors import UserError
from engine.infer.generate import generate
from engine.infer.sampling import SamplingParams, probs_from_logits


def test_streaming_callback_sees_every_token(small_int4):
    seen = []
    res = generate(small_int4, "Count from 1 to 5.", 12, on_token=lambda i, t, s, o: seen.append((i, t, o)))
    assert [t for _, t, _ in seen] == res.new_tokens[0]
    assert {o for *_, o in seen} == {"target"}
    assert res.ttft_s > 0 and len(res.step_s) == len(res.new_tokens[0]) - 1


def test_prefill_time_is_the_prefill_steps_not_the_ttft(small_int4):
    """prefill_s times the prefill steps alone (prefill_tok_s divides by it); the TTFT adds the
    scheduling and streaming around them, and the decode steps come after."""
    res = generate(small_int4, ["Count from 1 to 5.", "Name a colour."], 6, stop_at_eos=False)
    assert 0 < res.prefill_s < res.ttft_s
    assert res.prefill_s + sum(res.step_s) <= res.total_s


def test_one_new_token_finishes_in_the_step_that_admitted_it(small_int4):
    """A sequence asked for one token is done by its prefill step and never seen running; it is still returned."""
    res = generate(small_int4, ["Count from 1 to 5.", "Name a colour."], 1, stop_at_eos=False)
    assert [len(t) for t in res.new_tokens] == [1, 1] and res.finish == ["length", "length"]
    assert res.step_s == []


def test_stops_at_eos(small_int4):
    res = generate(small_int4, "Reply with just the word: yes", 64)
    assert res.finish == ["eos"] and len(res.new_tokens[0]) < 64
    assert "yes" in res.texts[0].lower()


def test_sampling_is_seeded(small_int4):
    sp = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=3)
    a = generate(small_int4, "Name a colour.", 10, sp).new_tokens
    b = generate(small_int4, "Name a colour.", 10, sp).new_tokens
    c = generate(small_int4, "Name a colour.", 10, SamplingParams(1.0, 50, 0.9, seed=4)).new_tokens
    assert a == b and a != c


def test_top_k_and_top_p_truncate():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    p = probs_from_logits(logits, SamplingParams(1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and p[0, :2].sum().item() == pytest.approx(1.0)
    full = torch.softmax(logits, -1)[0]
    p = probs_from_logits(logits, SamplingParams(1.0, top_p=float(full[0]) + 1e-3))
    assert (p[0] > 0).sum().item() == 2
    p = probs_from_logits(logits, SamplingParams(0.0))
    assert p[0].tolist() == [1.0, 0, 0, 0, 0]


def test_over_long_request_refused(small_int4):
    with pytest.raises(UserError, match="beyond the model's context of 32768"):
        generate(small_int4, "hi", 40000)
    with pytest.raises(UserError, match="at least 1"):
        generate(small_int4, "hi", 0)
    with pytest.raises(UserError, match="empty"):
        generate(small_int4, "   ", 4)


@pytest.mark.parametrize("bad", [dict(temperature=float("nan")), dict(temperature=-0.1), dict(top_k=-3),
                                 dict(top_p=0.0), dict(top_p=1.5), dict(seed=-1)])
def test_sampling_params_validated(bad):
    with pytest.raises(UserError):
        SamplingParams(**{"temperature": 1.0, **bad}).validate()


def test_a_folders_tokenizer_is_parsed_once_and_again_when_its_files_change(tmp_path):
    """load_tokenizer shares one parse per folder within a process, and parses again when a tokenizer file
    changes (a saved chat template must not be served from the old parse)."""
    import json
    import os

    from engine.infer.loader import load_tokenizer
    from tests import families

    folder = families.build("qwen2", tmp_path / "m")
    first = load_tokenizer(folder)
    assert load_tokenizer(folder) is first and load_tokenizer(str(folder) + "/") is first
    (folder / "model.safetensors").touch()  # weights are not the tokenizer
    assert load_tokenizer(folder) is first
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    cfg_path.write_text(json.dumps(cfg))
    st = cfg_path.stat()
    os.utime(cfg_path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # a changed file even on a coarse clock
    again = load_tokenizer(folder)
    assert again is not first
    assert again.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[hi]"
