"""Precisions: quantized layers, converting a model to a precision, and exact byte accounting."""
