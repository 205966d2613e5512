"""int4-gguf: a model's own llama.cpp 4-bit blocks read into our int4 format (engine/quant/gguf_codes.py).

Blocks decode as gguf-py (llama.cpp's reference in Python) dequantizes them; a GGUF written by gguf-py's
own writer is read into codes and int8 keeps; a file that does not hold the model's weights, a type we do
not read and an architecture whose q/k rows llama.cpp permutes are refused by name. The real 0.5B's own
GGUF loads and runs through the fused step (tests/test_fused.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from engine.common.errors import UserError
from engine.ops.formats import dequantize_int4
from engine.quant import make_spec
from engine.quant.convert import check_supported
from engine.quant.gguf_codes import decode_int4_blocks, read_gguf_codes

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
BLOCK = {"Q4_K": (256, 144, [(0, 2), (2, 4)]), "Q4_0": (32, 18, [(0, 2)]), "Q4_1": (32, 20, [(0, 2), (2, 4)]),
         "Q6_K": (256, 210, [(208, 210)]), "Q2_K": (256, 84, [(80, 82), (82, 84)])}


def _raw(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random blocks of `kind` with finite fp16 scales (random bytes there would be inf/NaN)."""
    per, size, halves = BLOCK[kind]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    for lo, hi in halves:
        b[..., lo:hi] = rng.uniform(1e-4, 2e-3, (n, k // per)).astype(np.float16)[..., None].view(np.uint8)
    return b.reshape(n, -1)


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_0", "Q4_1"])
def test_blocks_decode_as_gguf_py_dequantizes_them(kind):
    n, k = 8, 512
    raw = _raw(kind, n, k)
    packed, scales, mins = decode_int4_blocks(raw, kind, n, k)
    ours = dequantize_int4(packed, scales, mins, k)
    ref = torch.from_numpy(gguf.quants.dequantize(raw, getattr(T, kind)).astype(np.float32)).reshape(n, k)
    if kind == "Q4_K":  # d * sc and dmin * m rounded to fp16: at most 2^-11 of each, a small part of one step
        q_max_value = (15 * scales.float().abs() + mins.float().abs()).repeat_interleave(32, 1)
        assert bool(((ours - ref).abs() <= q_max_value * 2 ** -11).all())
        assert float((ours - ref).abs().max()) > 0  # the rounding is real: the test would see a wrong layout
    else:  # d and m are the file's fp16 values: bit for bit
        assert torch.equal(ours, ref)


class _Tiny(nn.Module):
    """The module names of a Qwen2 layer's MLP: model.layers.0.mlp.{up,down}_proj."""

    def __init__(self, n: int, k: int):
        super().__init__()
        layer = nn.Module()
        layer.mlp = nn.Module()
        layer.mlp.down_proj = nn.Linear(k, n, bias=False)
        layer.mlp.up_proj = nn.Linear(k, n, bias=False)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([layer])


def _write(path, arch: str, tensors: dict[str, tuple[str, np.ndarray]]):
    w = gguf.GGUFWriter(str(path), arch)
    for name, (kind, raw) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=getattr(T, kind))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _model_of(path, n, k) -> _Tiny:
    """A model holding exactly the file's weights, dequantized by gguf-py (as the catalog converts them)."""
    m = _Tiny(n, k)
    for t in gguf.GGUFReader(str(path)).tensors:
        kind = t.name.split(".")[2].split("_")[1]
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(n, k)
        getattr(m.model.layers[0].mlp, f"{kind}_proj").weight.data = torch.from_numpy(w)
    return m


def test_a_gguf_reads_into_codes_and_int8_keeps_and_refuses_what_it_cannot_hold(tmp_path):
    n, k = 64, 512
    path = tmp_path / "m.gguf"
    _write(path, "qwen2", {"blk.0.ffn_down.weight": ("Q4_K", _raw("Q4_K", n, k, 1)),
                           "blk.0.ffn_up.weight": ("Q6_K", _raw("Q6_K", n, k, 2))})
    model = _model_of(path, n, k)
    got = read_gguf_codes(path, model)
    assert set(got.codes) == {"model.layers.0.mlp.down_proj"}
    assert got.keep_int8 == {"model.layers.0.mlp.up_proj"}
    assert got.words() == "1 linears at int4 (Q4_K 1), 1 at int8 (Q6_K 1)"

    model.model.layers[0].mlp.down_proj.weight.data[5, 77] += 1e-3  # a folder that is not this file's
    with pytest.raises(UserError, match=r"blk\.0\.ffn_down\.weight \(Q4_K\) does not hold the model's weight: "
                                        r"row 5 column 77"):
        read_gguf_codes(path, model)

    other = tmp_path / "q2.gguf"
    _write(other, "qwen2", {"blk.0.ffn_down.weight": ("Q2_K", _raw("Q2_K", n, k)),
                            "blk.0.ffn_up.weight": ("Q6_K", _raw("Q6_K", n, k))})
    with pytest.raises(UserError, match="ffn_down.weight is Q2_K, which int4-gguf does not read"):
        read_gguf_codes(other, _model_of(other, n, k))

    llama = tmp_path / "llama.gguf"
    _write(llama, "llama", {"blk.0.ffn_down.weight": ("Q4_K", _raw("Q4_K", n, k))})
    with pytest.raises(UserError, match="this one is 'llama'"):
        read_gguf_codes(llama, model)


def test_the_method_takes_the_files_group_and_refuses_another():
    assert make_spec("int4-gguf").label == "int4-gguf-g32"
    with pytest.raises(UserError, match="int4-gguf holds groups of 32"):
        check_supported(make_spec("int4-gguf-g64"), "cpu")


def test_a_model_without_a_packaged_gguf_is_refused(tmp_path):
    from engine.infer.loader import load
    from tests import families

    with pytest.raises(UserError, match="not a catalog model, so there is no packaged GGUF"):
        load(str(families.build("qwen2", tmp_path)), "int4-gguf", "cpu")


def test_blocks_recovered_counts_what_each_quantizer_reproduces():
    """bench/blocks_recovered.py: a file against itself is recovered bit for bit; another file's blocks are not;
    round-to-nearest recovers exactly the sub-blocks whose codes span 0..15 (88 of these 128)."""
    from tests.bench_scripts import bench_script

    compare = bench_script("blocks_recovered").compare
    raw = _raw("Q4_K", 8, 512, 3)
    same = compare(raw, raw, "Q4_K", 8, 512)
    assert same == {"sub_blocks": 128, "spans_0_15": 88, "llama_exact": 128, "rtn_exact_fp16": 88}
    assert compare(raw, _raw("Q4_K", 8, 512, 4), "Q4_K", 8, 512)["llama_exact"] == 0
    assert compare(raw, _raw("Q6_K", 8, 512), "Q6_K", 8, 512)["llama_exact"] == 0


def test_the_catalogs_converted_folder_is_the_catalog_model():
    """Peers load the converted folder by path: int4-gguf finds that folder's GGUF (it refused it once)."""
    from engine.infer import catalog

    assert catalog.packaged_name(str(catalog.resolve("default-draft"))) == "qwen2.5-coder-0.5b"
    assert catalog.packaged_name("default") == "qwen2.5-coder-1.5b"
    assert catalog.packaged_name("/nowhere/model") is None
