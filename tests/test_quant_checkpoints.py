"""A user's already-quantized checkpoint: compressed-tensors pack-quantized W4A16, written by the
compressed-tensors library itself (the writer llm-compressor uses), read into our int4 kernels exactly, against
transformers' own dequantized load; and the formats and fields we do not read refused by name."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.common.errors import UserError
from tests import families


def write_checkpoint(folder, family: str, symmetric: bool, group_size: int = 32):
    """A tiny `family` model quantized W4A16 by compressed-tensors (min/max qparams), saved compressed."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 QuantizationStatus, apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams

    model = families.hf_model(family).to(torch.bfloat16)  # as published checkpoints are: bf16 weights and scales
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=group_size)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)}, ignore=["lm_head"],
        format="pack-quantized", quantization_status=QuantizationStatus.FROZEN))
    for _, m in model.named_modules():
        if getattr(m, "quantization_scheme", None) is not None:
            g = m.weight.data.view(m.weight.shape[0], -1, group_size)
            scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), args)
            m.weight_scale.data = scale.to(m.weight_scale.dtype)
            m.weight_zero_point.data = zero.to(m.weight_zero_point.dtype)
    comp = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    comp.compress_model(model)
    model.save_pretrained(folder)
    comp.update_config(folder)
    families.tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=[("qwen2", True), ("qwen2", False), ("llama", False)],
                ids=["qwen2-sym", "qwen2-asym", "llama-asym"])
def checkpoint(request, tmp_path_factory):
    family, sym = request.param
    return write_checkpoint(tmp_path_factory.mktemp(f"ct-{family}"), family, sym), sym


def _reference(folder):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                quantization_config=CompressedTensorsConfig(dequantize=True)).eval()


def _by_definition(folder, name: str, sym: bool) -> torch.Tensor:
    """A linear's weight as the format defines it, w = (value - zero) * scale, in fp32 from the raw tensors."""
    from safetensors.torch import load_file

    sd = load_file(str(folder / "model.safetensors"))
    N, K = sd[f"{name}.weight_shape"].tolist()
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    value = ((sd[f"{name}.weight_packed"].unsqueeze(-1) >> shifts) & 0xF).reshape(N, -1)[:, :K].float() - 8
    scale = sd[f"{name}.weight_scale"].float()
    zero = torch.zeros_like(scale) if sym else \
        ((sd[f"{name}.weight_zero_point"].T.unsqueeze(-1) >> shifts) & 0xF).reshape(scale.shape[1], -1)[:, :N].T - 8
    g = K // scale.shape[1]
    return (value - zero.float().repeat_interleave(g, 1)) * scale.repeat_interleave(g, 1)


def test_our_int4_reads_the_checkpoints_own_codes(checkpoint):
    from engine.infer.loader import load
    from engine.quant.layers import Int4Linear

    folder, sym = checkpoint
    ours32 = load(str(folder), "fp32", "cpu")  # the dense weights we build from the codes
    worst = max(float((p - _by_definition(folder, n[: -len(".weight")], sym)).abs().max() / p.abs().max())
                for n, p in ours32.model.state_dict().items() if n.endswith("proj.weight"))
    # symmetric: min = -8 * scale is exact in fp16; asymmetric: -(8 + zero) * scale rounded to fp16, at most
    # 2^-11 of |min| (measured: 0, and 2e-4 of the layer's largest weight)
    assert worst == 0 if sym else worst < 1e-3
    ref = _reference(folder)
    lm = load(str(folder), "int4-checkpoint-g32", "cpu")
    assert lm.spec.label == "int4-checkpoint-g32" and not lm.spec.quantize_head  # its head is not quantized
    assert sum(isinstance(m, Int4Linear) for m in lm.model.modules()) >= 2 * len(lm.model.model.layers)
    kld = families.max_kl(ref, lm)
    # transformers' dequantized weights are rounded to the scales' bf16; our int4 kernels round activations to int8
    # per 32 (engine.ops.config). Measured max KL over 12 positions: 2.8e-6, 1.8e-6, 1.7e-6. Bound 3e-5. (Top-1 is not
    # compared: a random-init model's near-flat distributions tie.)
    assert kld < 3e-5


def test_a_quantized_checkpoint_is_not_requantized(checkpoint):
    from engine.infer.loader import load

    folder, _ = checkpoint
    with pytest.raises(UserError, match="int4-checkpoint-g32"):
        load(str(folder), "int4-gptq-g32", "cpu")
    with pytest.raises(UserError, match="groups of 32"):
        load(str(folder), "int4-checkpoint-g64", "cpu")


def test_int4_checkpoint_of_an_unquantized_folder_is_refused(tmp_path):
    from engine.infer.loader import load

    folder = families.build("qwen2", tmp_path / "dense")
    with pytest.raises(UserError, match="not a quantized checkpoint"):
        load(str(folder), "int4-checkpoint-g32", "cpu")


@pytest.mark.parametrize("field,value,says", [
    ("quant_method", "hqq", "'quantization_config.quant_method' = 'hqq'"),
    ("format", "marlin-24", "'quantization_config.format' = 'marlin-24'"),
    ("config_groups.group_0.weights.num_bits", 8, "num_bits' = 8"),
    ("config_groups.group_0.weights.group_size", 48, "group_size' = 48"),
    ("config_groups.group_0.weights.actorder", "group", "actorder' = 'group'"),
    ("config_groups.group_0.input_activations", {"num_bits": 8}, "input_activations"),
])
def test_a_format_or_field_we_do_not_read_is_refused_by_name(tmp_path, field, value, says):
    from engine.infer.loader import load

    src = write_checkpoint(tmp_path / "src", "qwen2", True)
    folder = tmp_path / "edited"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    node = cfg["quantization_config"]
    *path, last = field.split(".")
    for k in path:
        node = node[k]
    node[last] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError) as e:
        load(str(folder), "int4-checkpoint-g32", "cpu")
    assert says in str(e.value)


def test_scales_that_do_not_fit_fp16_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from engine.infer.loader import load

    folder = write_checkpoint(tmp_path / "ck", "qwen2", True)
    sd = load_file(str(folder / "model.safetensors"))
    sd["model.layers.0.mlp.down_proj.weight_scale"] = sd["model.layers.0.mlp.down_proj.weight_scale"].float() * 1.0001
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="model.layers.0.mlp.down_proj: scales do not fit fp16 exactly"):
        load(str(folder), "int4-checkpoint-g32", "cpu")


def test_a_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from engine.infer.loader import load

    folder = write_checkpoint(tmp_path / "ck", "qwen2", False)
    sd = load_file(str(folder / "model.safetensors"))
    del sd["model.layers.1.mlp.up_proj.weight_zero_point"]
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="model.layers.1.mlp.up_proj has weight_packed but no weight_zero_point"):
        load(str(folder), "int4-checkpoint-g32", "cpu")
