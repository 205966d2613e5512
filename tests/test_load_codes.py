"""The codes and layouts a quantized load makes on CPU (engine/ops/prepared.py: quantize_int4_at_load,
quantize_int8_at_load, and prepare_int4/prepare_int8's tiling), by the extension in one pass each, against the torch
definitions they must equal (engine/ops/formats.py, prepared.tile_int4/tile_int8)."""
from __future__ import annotations

import pytest
import torch

from engine import ops

GROUP_SIZES = [32, 64, 128]


@pytest.fixture(scope="module")
def ext():
    return ops.load_cpu_extension(raise_errors=True)


def _weights(N, K, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, K, generator=g) * 0.05 + 0.01 * torch.randn(N, 1, generator=g)


@pytest.mark.parametrize("gs", GROUP_SIZES)
def test_int4_quantize_at_load_is_the_definition(ext, gs):
    """The extension's round-to-nearest int4 (what every int4 load runs) gives formats.quantize_int4's codes,
    scales and mins exactly: ragged last groups, constant groups (scale 1), zeros of both signs, scales that
    underflow fp16, large values; a weight that is not finite leaves it to the torch definition."""
    from engine.ops.prepared import quantize_int4_at_load

    g = torch.Generator().manual_seed(gs)
    for (N, K), mag in (((70, 1000), 0.05), ((64, 256), 1e-6), ((3, 33), 40.0), ((129, 4096), 1.0)):
        w = torch.randn(N, K, generator=g) * mag
        w[0, :gs] = 0.3
        w[1, :gs] = 0.0
        w[2, ::3] = -0.0
        got, want = quantize_int4_at_load(w, gs), ops.quantize_int4(w, gs)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (N, K, mag)
    w = torch.randn(4, 64, generator=g)
    w[1, 7] = float("inf")
    assert not bool(ext.int4_quantize(w, gs)[3])
    w[1, 7] = float("nan")
    assert all(torch.equal(a.nan_to_num(), b.nan_to_num())
               for a, b in zip(quantize_int4_at_load(w, gs), ops.quantize_int4(w, gs)))


def test_int8_quantize_at_load_is_the_definition_and_tiles_as_torch_does(ext):
    """The extension's int8 (every int8 load) gives formats.quantize_int8's codes and scales exactly (an all-zero
    row: scale 1; halves that round to even), and int8_tile writes tile_int8's bytes, rows past N zero; a weight
    that is not finite leaves it to the torch definition."""
    from engine.ops.prepared import quantize_int8_at_load, tile_int8

    g = torch.Generator().manual_seed(8)
    for (N, K), mag in (((130, 1000), 0.05), ((64, 256), 1e-30), ((3, 33), 40.0)):
        w = torch.randn(N, K, generator=g) * mag
        w[1] = 0.0
        w[2, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # scale 1 where 127 is the largest: exact halves
        got, want = quantize_int8_at_load(w), ops.quantize_int8(w)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want)), (N, K, mag)
        assert all(torch.equal(a, b) for a, b in zip(ext.int8_tile(*want), tile_int8(*want))), (N, K)
    w[0, 0] = float("inf")
    assert not bool(ext.int8_quantize(w)[2])


def test_int4_tile_in_the_extension_is_the_torch_layout(ext):
    """prepare_int4's one-pass tiling (the extension's int4_tile) writes tile_int4's bytes: rows past N zero."""
    from engine.ops.prepared import tile_int4

    for N, K, gs in ((130, 1000, 32), (64, 256, 128), (1, 64, 64)):
        packed, sc, mn = ops.quantize_int4(_weights(N, K, 2), gs)
        w, sm = ext.int4_tile(packed, sc, mn)
        w_ref, sm_ref = tile_int4(packed, sc, mn)
        assert torch.equal(w, w_ref) and torch.equal(sm, sm_ref), (N, K, gs)
