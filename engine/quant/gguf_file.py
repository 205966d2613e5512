"""A GGUF file read from its header: metadata, and each tensor's name, shape, type and data as a view of the file.

gguf's GGUFReader gives the same tensors but first builds a field, with numpy views per element, for every
metadata array: a Qwen2.5 GGUF's 151,936 tokens and 151,387 merges take it 7-8 s, on every int4-gguf load. Here
metadata arrays are skipped (their length kept), scalars and strings are read, and each tensor's data is the
slice of one read-only memory map that GGUFReader would give (same dtype and shape, tests/test_shapes.py).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.common.errors import UserError

__all__ = ["GgufTensor", "GgufFile", "read_gguf", "gguf_tensor_shapes", "gguf_tensor_types"]

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]  # innermost first, as GGUF stores it (GGUFReader's .shape)
    type_id: int            # ggml's type number
    data: np.ndarray        # outermost first; quantized types as uint8 rows of blocks (GGUFReader's .data)

    @property
    def tensor_type(self):
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.type_id)


@dataclass(frozen=True)
class GgufFile:
    metadata: dict  # key -> scalar or str; an array -> its length
    tensors: dict[str, GgufTensor]


class _Header:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def read(self, fmt: str):
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v

    def string(self) -> str:
        n = self.read("Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, t: int):
        if t == _STRING:
            return self.string()
        if t == _ARRAY:
            et, n = self.read("I"), self.read("Q")
            if et in _SCALARS:
                self.pos += n * struct.calcsize(_SCALARS[et])
            elif et == _STRING:  # the vocabulary: lengths only, nothing decoded
                for _ in range(n):
                    self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]
            else:
                for _ in range(n):
                    self.value(et)
            return n
        if t not in _SCALARS:
            raise UserError(f"{self.path}: unknown GGUF metadata type {t}", "convert it again with a current llama.cpp")
        return self.read(_SCALARS[t])


def _tensor_infos(h: _Header, path) -> tuple[dict, list]:
    if bytes(h.buf[:4]) != b"GGUF":
        raise UserError(f"{path} is not a GGUF file", "pass a .gguf file (the first chunk of a split one is enough)")
    h.pos = 4
    version = h.read("I")
    if version < 2:
        raise UserError(f"{path}: GGUF version {version} is too old", "convert it again with a current llama.cpp")
    n_tensors, n_kv = h.read("Q"), h.read("Q")
    meta = {}
    for _ in range(n_kv):
        key = h.string()
        meta[key] = h.value(h.read("I"))
    infos = []
    for _ in range(n_tensors):
        name, nd = h.string(), h.read("I")
        dims = tuple(h.read("Q") for _ in range(nd))
        infos.append((name, dims, h.read("I"), h.read("Q")))
    return meta, infos


def _parse(path: str | Path) -> tuple[_Header, dict, list]:
    """The header parsed from a memory map of the file: only the pages it touches are read (the first chunk of a
    split file is enough)."""
    if Path(path).stat().st_size < 4:
        raise UserError(f"{path} is not a GGUF file", "pass a .gguf file (the first chunk of a split one is enough)")
    h = _Header(np.memmap(str(path), dtype=np.uint8, mode="r"), path)
    try:
        meta, infos = _tensor_infos(h, path)
    except struct.error:
        raise UserError(f"{path}: the GGUF header is cut short", "download or convert the file again") from None
    return h, meta, infos


def read_gguf(path: str | Path) -> GgufFile:
    """The file's metadata and tensors; the data stays on disk until read."""
    h, meta, infos = _parse(path)
    buf = h.buf
    align = int(meta.get("general.alignment", 32))
    start = h.pos + (-h.pos % align)
    tensors = {}
    for name, dims, type_id, offset in infos:
        outer_first = tuple(reversed(dims))
        n = int(np.prod(dims)) if dims else 1
        at = start + offset
        if type_id in _PLAIN:
            dt = np.dtype(_PLAIN[type_id])
            nbytes, byte_shape = n * dt.itemsize, None
        else:
            from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
            nbytes, byte_shape = n // block * size, outer_first[:-1] + (outer_first[-1] // block * size,)
        if at + nbytes > len(buf):
            raise UserError(f"{path}: tensor {name} runs past the end of the file ({len(buf)} bytes)",
                            "download or convert the file again (the first chunk of a split GGUF holds no data)")
        raw = buf[at:at + nbytes]
        data = raw.view(dt).reshape(outer_first) if byte_shape is None else raw.reshape(byte_shape)
        tensors[name] = GgufTensor(name, dims, type_id, data)
    return GgufFile(meta, tensors)


def gguf_tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape (innermost first, as stored) from the header alone."""
    return {name: dims for name, dims, _, _ in _parse(path)[2]}


def gguf_tensor_types(path: str | Path) -> dict[str, str]:
    """Tensor name -> ggml type name (Q4_K, F32, ...) from the header alone."""
    from gguf import GGMLQuantizationType

    return {name: GGMLQuantizationType(t).name for name, _, t, _ in _parse(path)[2]}
