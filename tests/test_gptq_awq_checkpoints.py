"""A user's GPTQ (AutoGPTQ/GPTQModel) or AWQ GEMM (AutoAWQ) checkpoint, packed by AutoAWQ's own code, read into our
int4 kernels exactly: the codes match the library's own dequantization, the logits a transformers model built from
those dequantized weights; what we do not read (a permuted g_idx, other AWQ layouts, other bit widths) refused by name.

AutoAWQ packs the AWQ GEMM layout (WQLinear_GEMM.from_linear, through bench/awq_checkpoint.py, the checkpoint our
engine and vLLM serve side by side) and converts it to the GPTQ v1 layout ExLlama reads (packing_utils.
unpack_reorder_pack: qweight by rows, qzeros by columns, zero - 1), so both formats here are written by the library
people quantize with, not by us."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.common.errors import UserError
from tests import families

pytest.importorskip("awq.modules.linear.gemm", reason="autoawq is installed by `make setup` (--no-deps)")
from awq.utils import packing_utils  # noqa: E402

from tests.bench_scripts import bench_script  # noqa: E402

GS = 32


def write(folder, fmt: str, family: str = "qwen2"):
    """A tiny `family` model saved as an AWQ GEMM checkpoint by bench/awq_checkpoint.py (AutoAWQ's packer), or
    ("gptq") converted by AutoAWQ to GPTQ v1 with the quantization_config GPTQModel writes.
    Returns (folder, {linear: AutoAWQ's dequantized weight [N, K]})."""
    from safetensors.torch import load_file, save_file

    awq = bench_script("awq_checkpoint")
    src = families.build(family, folder.parent / f"{folder.name}-src")
    awq.write(src, folder, GS, progress=lambda s: None)
    sd = load_file(str(folder / "model.safetensors"))
    deq = {}
    for name in sorted({k[: -len(".qweight")] for k in sd if k.endswith(".qweight")}):
        qweight, qzeros, scales = sd[f"{name}.qweight"], sd[f"{name}.qzeros"], sd[f"{name}.scales"]
        deq[name] = packing_utils.dequantize_gemm(qweight, qzeros, scales, 4, GS).T.float()
        if fmt == "gptq":
            sd[f"{name}.qweight"], sd[f"{name}.qzeros"] = packing_utils.unpack_reorder_pack(qweight, qzeros, 4)
            sd[f"{name}.g_idx"] = torch.arange(qweight.shape[0], dtype=torch.int32) // GS
    if fmt == "gptq":
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        cfg = json.loads((folder / "config.json").read_text())
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GS, "desc_act": False,
                                      "sym": False, "checkpoint_format": "gptq"}
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder, deq


@pytest.fixture(scope="module", params=["awq", "gptq"])
def checkpoint(request, tmp_path_factory):
    return (request.param,) + write(tmp_path_factory.mktemp(request.param) / "ck", request.param)


def test_our_int4_reads_the_codes_the_library_dequantizes(checkpoint):
    from transformers import AutoModelForCausalLM

    from engine.infer.loader import load
    from engine.quant.layers import Int4Linear

    fmt, folder, deq = checkpoint
    ours32 = load(str(folder), "fp32", "cpu").model.state_dict()
    for name, want in deq.items():
        got = ours32[f"{name}.weight"]
        # AutoAWQ dequantizes in fp16, (q - zero) * scale rounded to fp16; ours is q * scale + fp16(-zero * scale):
        # each within 2^-11 of 15 * scale (measured: the largest difference 6.7e-4 of the layer's largest weight)
        assert float((got - want).abs().max() / want.abs().max()) < 1e-3, name
    ref = AutoModelForCausalLM.from_config(families.hf_config("qwen2"), attn_implementation="eager").eval()
    ref.load_state_dict({**families.hf_model("qwen2").state_dict(), **{f"{n}.weight": w for n, w in deq.items()}})
    lm = load(str(folder), f"int4-checkpoint-g{GS}", "cpu")
    # every decoder linear at int4: q/k/v fused into one, gate/up into one, o and down
    assert sum(isinstance(m, Int4Linear) for m in lm.model.modules()) == 4 * len(lm.model.model.layers)
    assert lm.spec.label == f"int4-checkpoint-g{GS}"
    kld = families.max_kl(ref, lm)
    # our int4 kernels round activations to int8 per 32 (engine.ops.config). Measured max KL over 12 positions:
    # 1.4e-6 for both layouts. Bound 3e-5 (as the compressed-tensors test's).
    assert kld < 3e-5


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_dense_head_is_held_as_the_checkpoint_stores_it(tmp_path, tied):
    """AutoAWQ saves the head and embedding in fp16: we hold them so (half of fp32's bytes; a tied pair one tensor),
    compute the fp32 linear of those values, and the logits are those of the head and embedding widened to fp32."""
    from torch import nn

    from engine.infer.loader import load
    from engine.ops import DenseLinear

    src = families.build("qwen2", tmp_path / "src", tie_word_embeddings=tied)
    folder = bench_script("awq_checkpoint").write(src, tmp_path / "ck", GS, progress=lambda s: None, floats="fp16")
    lm = load(str(folder), f"int4-checkpoint-g{GS}", "cpu")
    head, emb = lm.model.lm_head, lm.model.model.embed_tokens
    assert type(head) is DenseLinear and head.weight.dtype == emb.weight.dtype == torch.float16
    assert (emb.weight is head.weight) == tied and not lm.spec.quantize_head
    held = head.weight.numel() * 2
    assert lm.weights["embedding"] == held and lm.weights.get("head", 0) == (0 if tied else held)
    ids = torch.tensor([families.PROBE_IDS])
    with torch.no_grad():
        got = lm.model(ids, 0, lm.model.new_cache(1, 16))[0]
        lm.model.lm_head = nn.Linear(head.in_features, head.out_features, bias=False)
        lm.model.lm_head.weight.data = head.weight.float()
        lm.model.model.embed_tokens = nn.Embedding.from_pretrained(emb.weight.float())
        want = lm.model(ids, 0, lm.model.new_cache(1, 16))[0]
    # fp32 sums of the same products in another order (measured: 1.9e-7 and 3.0e-7 of the largest logit). Bound 2e-6.
    assert float((got - want).abs().max() / want.abs().max()) < 2e-6


def _edit(src, tmp_path, config=None, tensors=None):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "edited"
    shutil.copytree(src, folder)
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["quantization_config"].update(config)
        (folder / "config.json").write_text(json.dumps(cfg))
    if tensors:
        sd = load_file(str(folder / "model.safetensors"))
        tensors(sd)
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


REFUSED = {"awq": [({"version": "gemv"}, "'quantization_config.version' = 'gemv'"),
                   ({"zero_point": False}, "'quantization_config.zero_point' = False"),
                   ({"group_size": 48}, "'quantization_config.group_size' = 48")],
           "gptq": [({"bits": 8}, "'quantization_config.bits' = 8"),
                    ({"group_size": -1}, "-1 is one group per row"),
                    ({"checkpoint_format": "marlin"}, "'quantization_config.checkpoint_format' = 'marlin'")]}


def test_a_layout_or_field_we_do_not_read_is_refused_by_name(checkpoint, tmp_path):
    from engine.infer.loader import load

    fmt, folder, _ = checkpoint
    for i, (config, says) in enumerate(REFUSED[fmt]):
        with pytest.raises(UserError) as e:
            load(str(_edit(folder, tmp_path / str(i), config)), f"int4-checkpoint-g{GS}", "cpu")
        assert says in str(e.value), config


def test_act_order_with_a_permuted_g_idx_and_a_missing_tensor_are_named(checkpoint, tmp_path):
    from engine.infer.loader import load

    fmt, src, _ = checkpoint
    if fmt == "gptq":
        def permute(sd):
            k = sd["model.layers.0.mlp.down_proj.g_idx"]
            sd["model.layers.0.mlp.down_proj.g_idx"] = k.flip(0).contiguous()
        with pytest.raises(UserError, match="down_proj: its g_idx permutes the input columns.*desc_act=False"):
            load(str(_edit(src, tmp_path / "perm", tensors=permute)), f"int4-checkpoint-g{GS}", "cpu")
    with pytest.raises(UserError, match="model.layers.1.self_attn.v_proj has qweight but no qzeros"):
        load(str(_edit(src, tmp_path / "miss", tensors=lambda sd: sd.pop("model.layers.1.self_attn.v_proj.qzeros"))),
             f"int4-checkpoint-g{GS}", "cpu")


def test_vllm_serves_int4_checkpoint_only_from_a_quantized_folder(checkpoint, tmp_path):
    """bench/under_load.py puts vLLM's CPU build beside ours on the same AWQ folder; a dense one is refused by name."""
    from engine.peers.servers import ServerSpec

    fmt, folder, _ = checkpoint
    spec = ServerSpec.of("vllm", model=str(folder), precision="int4-checkpoint").validate()
    assert "--dtype" in spec.command(8000) and str(folder) in spec.command(8000)
    with pytest.raises(UserError, match="not a folder whose config.json has a quantization_config"):
        ServerSpec.of("vllm", model=str(families.build("qwen2", tmp_path / "dense")),
                      precision="int4-checkpoint").validate()
