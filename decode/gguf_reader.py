"""A GGUF reader of our own: the header, the metadata and the tensor table, with the tensor data as
views into one read-only memory map.

The ``gguf`` package's reader builds a NumPy object per element of every metadata array, which costs
seconds for a 49k-token vocabulary; this one reads string arrays in one pass over the header bytes and
numeric arrays as single ``frombuffer`` views, so a model opens in milliseconds.  The format (version
2 and 3, little-endian): magic ``GGUF``, ``uint32`` version, ``uint64`` tensor count, ``uint64`` key/value
count; each key a ``uint64``-length UTF-8 string, a ``uint32`` value type and the value (arrays: element
type, ``uint64`` count, elements); each tensor a name, ``uint32`` dimension count, ``uint64`` dimensions
(innermost first), ``uint32`` GGML type and ``uint64`` offset from the data section, which starts at the
next multiple of ``general.alignment`` (default 32) after the header.  Any inconsistency raises
``GGUFFormatError`` with what was expected where.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# value types: (struct format, NumPy dtype) for the fixed-size ones
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_FIXED = {
    _UINT8: ("<B", np.uint8), _INT8: ("<b", np.int8), _UINT16: ("<H", np.uint16), _INT16: ("<h", np.int16),
    _UINT32: ("<I", np.uint32), _INT32: ("<i", np.int32), _FLOAT32: ("<f", np.float32), _BOOL: ("<?", np.bool_),
    _UINT64: ("<Q", np.uint64), _INT64: ("<q", np.int64), _FLOAT64: ("<d", np.float64),
}


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF file (the message says where)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # as stored: innermost (the row length) first
    ggml_type: int
    offset: int  # absolute byte offset of its data in the file


@dataclass(frozen=True, slots=True)
class GGUFContents:
    version: int
    metadata: dict  # key -> str | int | float | bool | list (arrays; numeric ones as lists)
    tensors: tuple[TensorInfo, ...]
    data_start: int
    mm: np.ndarray  # the whole file, read-only uint8


class _Cursor:
    """Reads the header from a growing ``bytes`` copy of the file's start (the header is a few MB; the
    tensor data after it is never copied)."""

    __slots__ = ("buf", "raw", "pos", "size")

    def __init__(self, buf: memoryview):
        self.buf, self.pos, self.size = buf, 0, len(buf)
        self.raw = bytes(buf[:min(self.size, 1 << 22)])

    def need(self, n: int, what: str) -> None:
        end = self.pos + n
        if end > self.size:
            raise GGUFFormatError(f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has {self.size}")
        if end > len(self.raw):
            self.raw = bytes(self.buf[:min(self.size, max(end, 2 * len(self.raw)))])

    def fixed(self, vtype: int, what: str):
        fmt, _ = _FIXED[vtype]
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.fixed(_UINT32, what)

    def u64(self, what: str) -> int:
        return self.fixed(_UINT64, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        raw = self.raw[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFFormatError(f"{what} at offset {self.pos - n} is not UTF-8 ({e.reason})") from None

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings in one pass (the vocabulary and the merges)."""
        unpack = struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        for _ in range(count):
            self.need(8, what)
            (n,) = unpack(self.raw, self.pos)
            self.pos += 8
            self.need(n, what)
            append(self.raw[self.pos:self.pos + n])
            self.pos += n
        try:
            return [s.decode("utf-8") for s in out]
        except UnicodeDecodeError as e:
            raise GGUFFormatError(f"{what} holds a string that is not UTF-8 ({e.reason})") from None

    def value(self, vtype: int, what: str):
        if vtype in _FIXED:
            return self.fixed(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype = self.u32(what + " (array type)")
            count = self.u64(what + " (array length)")
            if etype == _STRING:
                return self.strings(count, what)
            if etype in _FIXED:
                dtype = np.dtype(_FIXED[etype][1]).newbyteorder("<")
                n = count * dtype.itemsize
                self.need(n, what)
                arr = np.frombuffer(self.raw, dtype=dtype, count=count, offset=self.pos)
                self.pos += n
                return arr.tolist()
            if etype == _ARRAY:
                return [self.value(_ARRAY, what) for _ in range(count)]
            raise GGUFFormatError(f"{what}: unknown array element type {etype}")
        raise GGUFFormatError(f"{what}: unknown value type {vtype}")


def read_gguf(path: str | Path) -> GGUFContents:
    """Parse ``path``; raises ``GGUFFormatError`` (bad bytes) or ``OSError`` (cannot read)."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(mm)
    c = _Cursor(buf)
    c.need(4, "the magic")
    if c.raw[:4] != MAGIC:
        raise GGUFFormatError(f"not a GGUF file (magic {c.raw[:4]!r})")
    c.pos = 4
    version = c.u32("the version")
    if version not in (2, 3):
        raise GGUFFormatError(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = c.u64("the tensor count")
    n_kv = c.u64("the metadata count")
    if n_tensors > 1 << 20 or n_kv > 1 << 20:
        raise GGUFFormatError(f"implausible counts: {n_tensors} tensors, {n_kv} metadata keys")
    metadata: dict = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        vtype = c.u32(f"the type of {key}")
        metadata[key] = c.value(vtype, key)
    infos = []
    for i in range(n_tensors):
        name = c.string(f"tensor name {i}")
        n_dims = c.u32(f"the dimension count of {name}")
        if not 1 <= n_dims <= 4:
            raise GGUFFormatError(f"tensor {name} has {n_dims} dimensions")
        dims = tuple(c.u64(f"the shape of {name}") for _ in range(n_dims))
        ggml_type = c.u32(f"the type of {name}")
        offset = c.u64(f"the offset of {name}")
        infos.append((name, dims, ggml_type, offset))
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if align <= 0 or align & (align - 1):
        raise GGUFFormatError(f"general.alignment {align} is not a power of two")
    data_start = (c.pos + align - 1) // align * align
    if infos and data_start > c.size:
        raise GGUFFormatError(f"truncated: the tensor data should start at offset {data_start}, the file has {c.size}")
    tensors = tuple(TensorInfo(name, dims, t, data_start + off) for name, dims, t, off in infos)
    return GGUFContents(version, metadata, tensors, data_start, mm)
