"""Precisions: quantized layers, converting a model to a precision, and exact byte accounting.

Modules: ``layers`` (Int8Linear, Int4Linear, Fp8Linear, bitsandbytes layers, QuantEmbedding),
``convert`` (QuantSpec, make_spec, check_supported, compute_dtype_for, quantize_model,
fuse_projections), ``accounting`` (weight_breakdown, quantized_fraction). The precision names are
engine.common.vocab's, re-exported here. Imports only engine.ops and engine.common.
"""
from engine.common.vocab import DESCRIPTIONS, GROUP_SIZES, PRECISIONS, parse_precision
from engine.quant.accounting import quantized_fraction, weight_breakdown
from engine.quant.convert import (FLOAT_DTYPES, QuantSpec, check_supported, compute_dtype_for, fuse_projections,
                                  hold_floats_as_stored, make_spec, quantize_model)
from engine.quant.layers import Fp8Linear, Int4Linear, Int8Linear, QuantEmbedding

__all__ = [
    "PRECISIONS", "GROUP_SIZES", "DESCRIPTIONS", "parse_precision", "FLOAT_DTYPES",
    "QuantSpec", "make_spec", "check_supported", "compute_dtype_for", "quantize_model", "fuse_projections",
    "hold_floats_as_stored",
    "weight_breakdown", "quantized_fraction",
    "Int8Linear", "Int4Linear", "Fp8Linear", "QuantEmbedding",
]
