"""The off-grid reference (engine.quant.permute): the same function as transformers computes it, off the grid.

Real tiny transformers models (Qwen2 with q/k/v biases and GQA, Llama with attention and MLP biases),
permuted and reloaded by transformers: their logits equal the source's. A source put on round-to-nearest
g32's grid is recovered exactly by that quantizer before the permutation and almost nowhere after.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.common.errors import UserError
from engine.ops.formats import dequantize_int4, quantize_int4
from engine.quant.permute import permute_tensors, write_permuted
from tests import families

IDS = torch.tensor([families.PROBE_IDS * 3])


def _logits(folder) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return m(IDS).logits[0]


@pytest.mark.parametrize("family,extra", [("qwen2", {}), ("llama", dict(attention_bias=True, mlp_bias=True,
                                                                          tie_word_embeddings=True))])
def test_the_permuted_model_computes_the_same_logits_as_transformers_from_the_source(tmp_path, family, extra):
    src = families.build(family, tmp_path / "src", **extra)
    dst = write_permuted(src, tmp_path / "permuted", seed=3)
    want, got = _logits(src), _logits(dst)
    assert (want - got).abs().max().item() < 2e-5 * want.abs().max().item()
    a, b = load_file(str(src / "model.safetensors")), load_file(str(dst / "model.safetensors"))
    moved = [k for k in a if a[k].dim() == 2 and not torch.equal(a[k], b[k])]
    assert len(moved) == sum(1 for k in a if a[k].dim() == 2)  # every matrix moved (q/k along their inputs)
    assert json.loads((dst / "permutation.json").read_text())["seed"] == 3


def _on_grid(t: torch.Tensor) -> torch.Tensor:
    p, s, m = quantize_int4(t, 32)
    return dequantize_int4(p, s, m, t.shape[1]).float()


def _recovered(t: torch.Tensor) -> float:
    """The share of t's sub-blocks of 32 that round-to-nearest g32 reproduces (to its fp16 scale's rounding)."""
    back = _on_grid(t)
    rel = (back - t).abs() <= 1e-3 * t.abs().amax(1, keepdim=True)
    return rel.view(t.shape[0], -1, 32).all(-1).float().mean().item()


def test_a_source_on_the_int4_grid_is_recovered_exactly_before_and_not_after(tmp_path):
    src = families.build("qwen2", tmp_path / "src", hidden_size=256, intermediate_size=256)  # head_dim 64
    sd = load_file(str(src / "model.safetensors"))
    gridded = {k: (_on_grid(v) if v.dim() == 2 and k != "model.embed_tokens.weight" else v) for k, v in sd.items()}
    save_file(gridded, str(src / "model.safetensors"), metadata={"format": "pt"})
    dst = write_permuted(src, tmp_path / "permuted", seed=0)
    after = load_file(str(dst / "model.safetensors"))
    for k, v in gridded.items():
        if v.dim() == 2 and k != "model.embed_tokens.weight":
            assert _recovered(v) > 0.99, k
            assert _recovered(after[k]) < 0.05, k  # o_proj: V's order mixes the 2 sub-blocks of each head


def test_what_cannot_be_permuted_exactly_is_refused_by_name(tmp_path):
    cfg = families.hf_config("qwen2").to_dict()
    sd = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64), "model.layers.0.extra.scale": torch.ones(3)}
    with pytest.raises(UserError, match="model.layers.0.extra.scale"):
        permute_tensors(sd, cfg, 0)
    with pytest.raises(UserError, match="'gemma2'.*qwen2, llama"):
        permute_tensors({}, families.hf_config("gemma2").to_dict(), 0)
    with pytest.raises(UserError, match="already quantized"):
        permute_tensors({}, cfg | {"quantization_config": {"quant_method": "gptq"}}, 0)
    with pytest.raises(UserError, match="no \\*.safetensors"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text(json.dumps(cfg))
        write_permuted(tmp_path / "empty", tmp_path / "out", 0)
    assert not (tmp_path / "out").exists()
