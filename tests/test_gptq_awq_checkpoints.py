"""A user's GPTQ (AutoGPTQ/GPTQModel) or AWQ GEMM (AutoAWQ) checkpoint, packed by AutoAWQ's own code, read into our
int4 kernels exactly: the codes match the library's own dequantization, the logits a transformers model built from
those dequantized weights; an act-order checkpoint (a permuted g_idx) reordered at load, its input gathered; what we do
not read (uneven groups, other AWQ layouts, other bit widths) refused by name.

AutoAWQ packs the AWQ GEMM layout (WQLinear_GEMM.from_linear, through bench/awq_checkpoint.py, the checkpoint our
engine and vLLM serve side by side) and converts it to the GPTQ v1 layout ExLlama reads (packing_utils.
unpack_reorder_pack: qweight by rows, qzeros by columns, zero - 1), so both formats here are written by the library
people quantize with, not by us."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine import ops
from engine.common.errors import UserError
from tests import families

pytest.importorskip("awq.modules.linear.gemm", reason="autoawq is installed by `make setup` (--no-deps)")
from awq.utils import packing_utils  # noqa: E402

from tests.bench_scripts import bench_script  # noqa: E402

GS = 32


def write(folder, fmt: str, family: str = "qwen2", **shape):
    """A tiny `family` model (its config overridden by `shape`) saved as an AWQ GEMM checkpoint by
    bench/awq_checkpoint.py (AutoAWQ's packer), or ("gptq") converted by AutoAWQ to GPTQ v1 with the
    quantization_config GPTQModel writes. Returns (folder, {linear: AutoAWQ's dequantized weight [N, K]})."""
    from safetensors.torch import load_file, save_file

    awq = bench_script("awq_checkpoint")
    src = families.build(family, folder.parent / f"{folder.name}-src", **shape)
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


def _act_order(sd: dict, deq: dict, seed: int = 0, odd_k: bool = True) -> dict:
    """The GPTQ checkpoint `sd` turned into an act-order one of other weights: each linear's input columns permuted
    (W' = W[:, sigma], as GPTQ with desc_act stores a weight whose groups follow its Hessian's order: qweight in
    input order, g_idx[k] = group of input k). q/k/v share one sigma and gate/up another (one input, one Hessian),
    except, with `odd_k`, layer 1's k_proj, which gets its own (so q/k/v cannot fuse). Returns the permuted
    dequantized weights."""
    g = torch.Generator().manual_seed(seed)
    sigmas, out = {}, {}
    for name, w in deq.items():
        K = w.shape[1]
        key = name.rsplit(".", 1)[0] + (".k" if odd_k and name == "model.layers.1.self_attn.k_proj" else "")
        key += ".attn_in" if name.rsplit(".", 1)[1] in ("q_proj", "k_proj", "v_proj") else ""
        key += ".mlp_in" if name.rsplit(".", 1)[1] in ("gate_proj", "up_proj") else ""
        sigma = sigmas.setdefault(key, torch.randperm(K, generator=g))
        shifts = torch.arange(0, 32, 4, dtype=torch.int32)
        q = ((sd[f"{name}.qweight"].unsqueeze(-1) >> shifts) & 0xF).transpose(1, 2).reshape(K, -1)  # [K, N]
        q = q[sigma]
        sd[f"{name}.qweight"] = (q.reshape(K // 8, 8, -1) << shifts.view(1, 8, 1)).sum(1, dtype=torch.int32)
        sd[f"{name}.g_idx"] = (sigma // GS).to(torch.int32)
        out[name] = w[:, sigma]
    return out


# a head_dim the fused step's attention has (the families' default, 16, runs the PyTorch path)
FUSED_SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def _act_order_pair(tmp_path, odd_k: bool):
    """(transformers' model of an act-order checkpoint's dequantized weights, our load of the checkpoint)."""
    from transformers import AutoModelForCausalLM

    from engine.infer.loader import load

    src, deq = write(tmp_path / "gptq", "gptq", **FUSED_SHAPE)  # act-order is GPTQ's (AWQ has no g_idx)
    got = {}
    folder = _edit(src, tmp_path / "act-order", tensors=lambda sd: got.update(_act_order(sd, deq, odd_k=odd_k)))
    ours32 = load(str(folder), "fp32", "cpu").model.state_dict()
    for name, want in got.items():  # the dense weights in the checkpoint's input order
        assert float((ours32[f"{name}.weight"] - want).abs().max() / want.abs().max()) < 1e-3, name
    ref = AutoModelForCausalLM.from_config(families.hf_config("qwen2", **FUSED_SHAPE),
                                           attn_implementation="eager").eval()
    ref.load_state_dict({**families.hf_model("qwen2", **FUSED_SHAPE).state_dict(),
                         **{f"{n}.weight": w for n, w in got.items()}})
    return ref, load(str(folder), f"int4-checkpoint-g{GS}", "cpu")


def test_an_act_order_checkpoint_is_reordered_at_load_and_gathers_its_input(tmp_path):
    from engine.quant.layers import Int4Linear

    ref, lm = _act_order_pair(tmp_path, odd_k=True)
    int4 = [m for m in lm.model.modules() if isinstance(m, Int4Linear)]
    assert all(m.in_perm is not None for m in int4)
    layers = len(lm.model.model.layers)
    assert len(int4) == 4 * layers + 2  # layer 1's q/k/v do not fuse: k's order differs
    with ops.count_steps() as steps:
        kl = families.max_kl(ref, lm)
    # the int4 kernels' int8 activation rounding, as the tests above (measured: 4.0e-6; with the families' head_dim
    # 16, 1.4e-6, and 2.6e-2 without the gather). Bound 3e-5.
    assert kl < 3e-5
    if ops.fused_info()["fused"].startswith("on"):  # three orders for one input: the fused step declines, by name
        assert steps.fused == 0 and any("one order" in r for r in steps.reasons), steps.as_dict()


def test_an_act_order_checkpoint_runs_the_fused_step_as_the_pytorch_path(tmp_path):
    """Orders shared as GPTQ makes them (one Hessian per input): q/k/v and gate/up fuse, and the fused C++ step
    gathers each input in its consumers' order, as Int4Linear does: the same logits as the PyTorch path."""
    from engine.infer.model import Rows

    if not ops.fused_info()["fused"].startswith("on"):
        pytest.skip(f"the fused step is {ops.fused_info()['fused']}")
    ref, lm = _act_order_pair(tmp_path, odd_k=False)
    ids = torch.tensor(families.PROBE_IDS)
    runs = {}
    for fused in (False, True):
        with ops.using(fused=fused, act_int8=False), ops.count_steps() as steps, torch.no_grad():
            cache = lm.model.new_cache(2, len(ids) + 8)
            prefill = lm.model.forward_rows(ids, Rows.of([(0, 0, len(ids))], "cpu"), cache)
            step = lm.model.forward_rows(ids[:2], Rows.of([(0, len(ids), 1), (1, 0, 1)], "cpu"), cache)
        runs[fused] = (prefill, step, steps)
    (a0, a1, _), (b0, b1, steps) = runs[False], runs[True]
    assert steps.reference == 0 and steps.fused == 2, steps.as_dict()
    for a, b in ((a0, b0), (a1, b1)):  # fp32 activations: the same weight-only arithmetic. Measured: 9.8e-7 and
        assert float((a - b).abs().max() / a.abs().max()) < 1e-5  # 6.4e-7 of the largest logit; 1.7 ungathered
    with ops.count_steps() as steps:  # the default int8 activations, fused, against transformers: measured 3.0e-6
        assert families.max_kl(ref, lm) < 3e-5  # (5.5e-2 ungathered)
    assert steps.fused == 1, steps.as_dict()


def test_an_uneven_g_idx_and_a_missing_tensor_are_named(checkpoint, tmp_path):
    from engine.infer.loader import load

    fmt, src, _ = checkpoint
    if fmt == "gptq":
        def uneven(sd):
            k = sd["model.layers.0.mlp.down_proj.g_idx"]
            sd["model.layers.0.mlp.down_proj.g_idx"] = torch.where(k == 1, 0, k).contiguous()
        with pytest.raises(UserError, match="down_proj: its g_idx gives groups of unequal sizes"):
            load(str(_edit(src, tmp_path / "perm", tensors=uneven)), f"int4-checkpoint-g{GS}", "cpu")
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
