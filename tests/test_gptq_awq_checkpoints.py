"""A user's GPTQ (AutoGPTQ/GPTQModel) or AWQ GEMM (AutoAWQ) checkpoint, packed by AutoAWQ's own code, read into our
int4 kernels exactly: the codes match the library's own dequantization, the logits a transformers model built from
those dequantized weights; what we do not read (a permuted g_idx, other AWQ layouts, other bit widths) refused by name.

AutoAWQ packs the AWQ GEMM layout (WQLinear_GEMM.from_linear) and converts it to the GPTQ v1 layout ExLlama reads
(packing_utils.unpack_reorder_pack: qweight by rows, qzeros by columns, zero - 1), so both formats here are written
by the library people quantize with, not by us."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch import nn

from engine.common.errors import UserError
from tests import families

awq_gemm = pytest.importorskip("awq.modules.linear.gemm", reason="autoawq is installed by `make setup` (--no-deps)")
from awq.utils import packing_utils  # noqa: E402

GS = 32


def _grid(w: torch.Tensor, gs: int):
    """Min/max asymmetric 4-bit codes of w [N, K] per group of gs: the weights on the grid, scales and zeros [G, N]."""
    g = w.view(w.shape[0], -1, gs)
    mx, mn = g.amax(-1), g.amin(-1)
    scale = ((mx - mn).clamp(min=1e-5) / 15).half().float()
    zero = (-mn / scale).round().clamp(0, 15)
    q = (g / scale[..., None] + zero[..., None]).round().clamp(0, 15)
    w_hat = ((q - zero[..., None]) * scale[..., None]).view_as(w)
    return w_hat, scale.T.contiguous(), zero.T.contiguous()


def write(folder, fmt: str, family: str = "qwen2"):
    """A tiny `family` model whose decoder linears AutoAWQ packed ("awq": its GEMM layout; "gptq": converted by it
    to GPTQ v1), saved with the quantization_config each tool writes. Returns (folder, {linear: dequantized [N, K]})."""
    model = families.hf_model(family)
    sd = {k: v for k, v in model.state_dict().items()}
    deq = {}
    for name, m in model.named_modules():
        if not (isinstance(m, nn.Linear) and name.startswith("model.layers")):
            continue
        w_hat, scale, zero = _grid(m.weight.data.float(), GS)
        lin = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
        lin.weight.data, lin.bias = w_hat, m.bias
        q = awq_gemm.WQLinear_GEMM.from_linear(lin, 4, GS, False, scale.half(), zero.int())
        deq[name] = packing_utils.dequantize_gemm(q.qweight, q.qzeros, q.scales, 4, GS).T.float()
        del sd[f"{name}.weight"]
        if fmt == "gptq":
            qweight, qzeros = packing_utils.unpack_reorder_pack(q.qweight, q.qzeros, 4)
            sd |= {f"{name}.qweight": qweight, f"{name}.qzeros": qzeros, f"{name}.scales": q.scales,
                   f"{name}.g_idx": torch.arange(m.in_features, dtype=torch.int32) // GS}
        else:
            sd |= {f"{name}.qweight": q.qweight, f"{name}.qzeros": q.qzeros, f"{name}.scales": q.scales}
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    model.config.save_pretrained(folder)
    tied = model.config.tie_word_embeddings
    save_file({k: v.contiguous() for k, v in sd.items() if k != "lm_head.weight" or not tied},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = ({"quant_method": "awq", "zero_point": True, "group_size": GS, "bits": 4,
                                   "version": "gemm", "modules_to_not_convert": None} if fmt == "awq" else
                                  {"quant_method": "gptq", "bits": 4, "group_size": GS, "desc_act": False,
                                   "sym": False, "checkpoint_format": "gptq"})
    (folder / "config.json").write_text(json.dumps(cfg))
    families.tokenizer().save_pretrained(folder)
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
    ref.load_state_dict({**{k: v.float() for k, v in families.hf_model("qwen2").state_dict().items()},
                         **{f"{n}.weight": w for n, w in deq.items()}})
    lm = load(str(folder), f"int4-checkpoint-g{GS}", "cpu")
    # every decoder linear at int4: q/k/v fused into one, gate/up into one, o and down
    assert sum(isinstance(m, Int4Linear) for m in lm.model.modules()) == 4 * len(lm.model.model.layers)
    assert lm.spec.label == f"int4-checkpoint-g{GS}"
    ids = torch.tensor([[1, 5, 9, 17, 33, 65, 129, 200, 250, 300, 7, 3]])
    with torch.no_grad():
        want = torch.log_softmax(ref(ids).logits[0].float(), -1)
        got = torch.log_softmax(lm.model(ids, 0, lm.model.new_cache(1, 16))[0], -1)
    kld = float((want.exp() * (want - got)).sum(-1).max())
    # our int4 kernels round activations to int8 per 32 (engine.ops.config). Measured max KL over 12 positions:
    # 1.4e-6 for both layouts. Bound 3e-5 (as the compressed-tensors test's).
    assert kld < 3e-5


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


@pytest.mark.parametrize("fmt,config,says", [
    ("awq", {"version": "gemv"}, "'quantization_config.version' = 'gemv'"),
    ("awq", {"zero_point": False}, "'quantization_config.zero_point' = False"),
    ("awq", {"group_size": 48}, "'quantization_config.group_size' = 48"),
    ("gptq", {"bits": 8}, "'quantization_config.bits' = 8"),
    ("gptq", {"group_size": -1}, "-1 is one group per row"),
    ("gptq", {"checkpoint_format": "marlin"}, "'quantization_config.checkpoint_format' = 'marlin'"),
])
def test_a_layout_or_field_we_do_not_read_is_refused_by_name(checkpoint, tmp_path, fmt, config, says):
    from engine.infer.loader import load

    if checkpoint[0] != fmt:
        pytest.skip("another format's case")
    with pytest.raises(UserError) as e:
        load(str(_edit(checkpoint[1], tmp_path, config)), f"int4-checkpoint-g{GS}", "cpu")
    assert says in str(e.value)


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
