"""Every supported family against transformers: tiny random-init models built offline in the test.

Each input is longer than twice any sliding window and runs past rope scaling's original length
(tests/families.py), so a window or a scaling the engine ignored would show in the logits.
"""
from __future__ import annotations

import asyncio
import json
import warnings

import httpx
import pytest
import torch

from engine.common.errors import UserError
from tests import families as F
from tests.serving import served

N_INPUT = 110
FAMS = list(F.FAMILIES)
SERVED = ["llama3.1", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mixtral", "qwen3-moe"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: F.build(f, root / f) for f in FAMS}


def _ids(n=N_INPUT, seed=1):
    return torch.randint(3, F.VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("family", FAMS)
def test_logits_match_transformers(folders, family):
    from engine.infer.model import Rows, build_model

    ours, ref_model = build_model(folders[family]), F.hf_model(family)
    ids = _ids()
    with torch.inference_mode():
        ref = ref_model(ids).logits[0]
        full = ours(ids, 0, ours.new_cache(1, N_INPUT))[0]
        # the same input in pieces: a long chunk, then ragged steps beside another sequence
        cache = ours.new_cache(2, N_INPUT)
        ours(ids[:, :70], 0, cache)
        other = _ids(30, seed=2)[0]
        step = ours.forward_rows(torch.cat([ids[0, 70:], other]), Rows.of([(0, 70, N_INPUT - 70), (1, 0, 30)], "cpu"),
                                 cache)
    assert _rel(full, ref) < 1e-4, family
    if "rope_length_dependent" not in ours.cfg.features():  # dynamic/longrope: a chunk's length sets its rope
        assert _rel(step[:N_INPUT - 70], ref[70:]) < 1e-4, family


@pytest.mark.parametrize("family", FAMS)
def test_32_greedy_tokens_identical_to_transformers(folders, family):
    from engine.infer.generate import generate
    from engine.infer.loader import load

    lm = load(str(folders[family]), "fp32")
    prompt = "def fibonacci(n): the quick brown fox jumps over the lazy dog; import numpy as np " * 5
    ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
    assert ids.shape[1] > 2 * F.WINDOW and ids.shape[1] + 32 > F.ROPE_ORIGINAL
    with torch.inference_mode():
        ref = F.hf_model(family).generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None,
                                          pad_token_id=0)[0, ids.shape[1]:].tolist()
    ours = generate(lm, [prompt], 32, chat=False, stop_at_eos=False).new_tokens[0]
    assert ours == ref


@pytest.mark.parametrize("family", FAMS)
def test_int8_int4_within_the_qwen_kl_bounds(folders, family):
    """Random-init weights, so looser than the 0.5B's measured bounds (tests/test_quant.py): mean KL < 0.01 at int8,
    < 0.25 at int4; bitsandbytes' llm.int8 and nf4 (which run on this CPU) held to the same 8-bit and 4-bit bounds,
    bf16 to the 8-bit one."""
    from engine.infer.loader import load

    ids, kls = _ids(), {}
    ref = None
    for p in ("fp32", "int8", "int4", "llm.int8", "nf4", "bf16"):
        lm = load(str(folders[family]), p)
        with torch.inference_mode():
            out = lm.model(ids, 0, lm.model.new_cache(1, N_INPUT))[0].float().log_softmax(-1)
        if ref is None:
            ref = out
            continue
        kls[p] = (ref.exp() * (ref - out)).sum(-1).mean().item()
    assert 0 < kls["int8"] < 0.01 and 0 < kls["int4"] < 0.25 and kls["int8"] < kls["int4"], kls
    assert 0 < kls["llm.int8"] < 0.01 and 0 < kls["nf4"] < 0.25 and 0 < kls["bf16"] < 0.01, kls


async def _stream(client, url, model, prompt, n=24):
    toks = []
    async with client.stream("POST", url + "/v1/completions", timeout=120,
                             json={"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                                   "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                toks += [c["text"] for c in json.loads(line[6:])["choices"]]
    return "".join(toks)


@pytest.mark.parametrize("family", SERVED)
def test_four_concurrent_streams_equal_each_request_alone(folders, family):
    prompts = [f"import numpy as np  # step {i}: " + "the quick brown fox " * (3 + 4 * i) for i in range(4)]
    with served("--model", str(folders[family]), "--precision", "fp32", "--max-seqs", "4", "--max-model-len", "256",
                "--prefill-chunk", "64") as srv:
        async def main():
            async with httpx.AsyncClient() as c:
                alone = [await _stream(c, srv.url, srv.model, p) for p in prompts]
                together = await asyncio.gather(*(_stream(c, srv.url, srv.model, p) for p in prompts))
                return alone, together
        alone, together = asyncio.run(main())
    assert all(alone) and together == alone


# -- bad input: refused by name, with the fix

def _folder_with(tmp_path, config: dict | str, weights_from=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if weights_from is not None:
        for f in weights_from.glob("*.safetensors"):
            (tmp_path / f.name).symlink_to(f)
    return tmp_path


def test_unknown_model_type_names_it_and_the_supported_list(tmp_path):
    from engine.infer.model import load_config

    cfg = F.hf_config("llama").to_dict() | {"model_type": "falcon"}
    with pytest.raises(UserError) as e:
        load_config(_folder_with(tmp_path, cfg))
    assert "'falcon'" in str(e.value) and "qwen3_moe" in e.value.fix and "gemma2" in e.value.fix


def test_config_not_json_or_lacking_a_field_names_file_and_field(tmp_path):
    from engine.infer.model import load_config

    with pytest.raises(UserError) as e:
        load_config(_folder_with(tmp_path / "a", "{not json"))
    assert "config.json" in str(e.value) and "not valid JSON" in str(e.value)
    cfg = F.hf_config("qwen3").to_dict()
    del cfg["num_hidden_layers"]
    with pytest.raises(UserError) as e:
        load_config(_folder_with(tmp_path / "b", cfg))
    assert "num_hidden_layers" in str(e.value) and "config.json" in str(e.value)


def test_missing_tensor_is_named(tmp_path, folders):
    from safetensors.torch import load_file, save_file

    from engine.infer.model import build_model

    src = folders["qwen3"]
    sd = load_file(str(next(src.glob("*.safetensors"))))
    del sd["model.layers.1.self_attn.k_norm.weight"]
    d = _folder_with(tmp_path, (src / "config.json").read_text())
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(UserError) as e:
        build_model(d)
    assert "'model.layers.1.self_attn.k_norm.weight'" in str(e.value)


@pytest.mark.parametrize("field,value,named", [
    ("rope_parameters", {"rope_type": "su", "rope_theta": 1e4}, "rope_type"),
    ("hidden_act", "relu2", "hidden_act"),
    ("quantization_config", {"quant_method": "hqq", "nbits": 4}, "quantization_config.quant_method"),
])
def test_arithmetic_we_do_not_compute_is_refused_by_name(tmp_path, field, value, named):
    from engine.infer.model import load_config

    cfg = F.hf_config("llama").to_dict() | {field: value}
    with pytest.raises(UserError) as e:
        load_config(_folder_with(tmp_path, cfg))
    assert f"'{named}'" in str(e.value) and e.value.fix


def test_an_unknown_field_is_warned_about_by_name_and_recorded(tmp_path):
    from engine.infer.arch import ConfigFieldWarning
    from engine.infer.model import load_config

    cfg = F.hf_config("llama").to_dict() | {"residual_multiplier": 0.22}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mc = load_config(_folder_with(tmp_path, cfg))
    assert [str(x.message) for x in w if issubclass(x.category, ConfigFieldWarning) and "residual_multiplier" in
            str(x.message)]
    assert mc.architecture()["ignored_fields"] == ["residual_multiplier"]


def test_a_draft_of_another_family_and_tokenizer_is_refused(folders, tmp_path):
    """A Qwen3 target with a Gemma 2 draft whose tokenizer differs: the compatibility check names it."""
    from engine.common.setup import EngineSetup
    from engine.infer.loader import load_setup

    other = F.build("gemma2", tmp_path / "g", tokenizer_vocab=F.VOCAB - 64)
    setup = EngineSetup(model=str(folders["qwen3"]), precision="fp32", draft="model", draft_model=str(other),
                        draft_precision="fp32")
    with pytest.raises(UserError) as e:
        load_setup(setup)
    assert "only in the target's vocabulary" in str(e.value)


def test_old_and_new_rope_config_forms_read_the_same():
    """Hub checkpoints written before transformers 5 say rope_theta + rope_scaling ("type" or "rope_type");
    Gemma 3's say rope_local_base_freq for the local layers."""
    from engine.infer.arch import read_config

    base = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 131072}
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    old = read_config(base | {"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **scaling}})
    new = read_config(base | {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **scaling}})
    assert old["ropes"] == new["ropes"] and old["ropes"][0].type == "llama3" and old["ropes"][0].theta == 500000.0
    g = base | {"model_type": "gemma3_text", "head_dim": 16, "sliding_window": 512, "sliding_window_pattern": 2,
                "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    local, glob = read_config(g)["ropes"]
    assert ((local.type, local.theta) == ("default", 1e4)
            and (glob.type, glob.theta, glob.factor) == ("linear", 1e6, 8.0))


SPEC_FAMS = [f for f in FAMS if f not in ("llama-dynamic", "phi3-longrope", "mixtral", "qwen3-moe")]  # MoE: test_moe.py


@pytest.mark.parametrize("family", SPEC_FAMS)
def test_speculative_greedy_equals_plain_greedy(folders, family, tmp_path):
    """A smaller model of the family (1 layer, other weights, same tokenizer), the target's own int4 copy and
    n-gram lookup each draft for the fp32 target: the tokens are the target's own greedy tokens."""
    from engine.infer.generate import generate
    from engine.infer.loader import load
    from engine.infer.speculative import generate_speculative, proposer_spec

    target = load(str(folders[family]), "fp32")
    one_layer = {"num_hidden_layers": 1}
    if "layer_types" in F.FAMILIES[family][1]:
        one_layer["layer_types"] = F.FAMILIES[family][1]["layer_types"][:1]
    small = load(str(F.build(family, tmp_path / "draft", seed=1, **one_layer)), "fp32")
    prompts = ["import numpy as np\n" + "the quick brown fox " * 12, "def fibonacci(n): " * 8]
    ref = generate(target, prompts, 24, chat=False, stop_at_eos=False).new_tokens
    for kind, draft in (("model", small), ("self", load(str(folders[family]), "int4")), ("ngram", None)):
        out = generate_speculative(target, proposer_spec(kind, draft, target), prompts, 24, gamma=3, chat=False,
                                   stop_at_eos=False)
        assert out.new_tokens == ref, kind
        assert out.spec["drafted"] > 0, kind


@pytest.mark.parametrize("family", ["llama-dynamic", "phi3-longrope"])
def test_speculation_on_a_length_dependent_rope_is_refused(folders, family):
    from engine.common.setup import EngineSetup
    from engine.infer.loader import load_setup

    with pytest.raises(UserError) as e:
        load_setup(EngineSetup(model=str(folders[family]), precision="fp32", draft="ngram"))
    assert "not be lossless" in str(e.value) and "--draft none" in e.value.fix
