"""Our GGUF reader (decode/gguf_reader.py) against the ``gguf`` package's, and on broken bytes."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

from decode import default_model_path
from decode.errors import ModelFileError
from decode.gguf_file import open_gguf
from decode.gguf_reader import GGUFFormatError, read_gguf


def _same_as_the_gguf_package(path) -> None:
    ours = read_gguf(path)
    ref = gguf.GGUFReader(path, "r")
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]  # the package's own header pseudo-fields
    assert sorted(keys) == sorted(ours.metadata)
    for k in keys:
        assert ours.metadata[k] == ref.fields[k].contents(), k
    assert len(ours.tensors) == len(ref.tensors)
    for t, rt in zip(ours.tensors, ref.tensors):
        assert (t.name, t.offset, t.ggml_type, t.dims) == (rt.name, rt.data_offset, int(rt.tensor_type), tuple(int(x) for x in rt.shape))
        assert np.array_equal(ours.mm[t.offset:t.offset + rt.n_bytes], np.asarray(rt.data).view(np.uint8).reshape(-1))


@pytest.mark.engines  # reads the whole default model, twice: not a unit test
def test_the_default_model_reads_as_the_gguf_package_reads_it():
    _same_as_the_gguf_package(default_model_path())


def test_every_tensor_type_and_metadata_kind(tmp_path):
    p = tmp_path / "tiny.gguf"
    write_tiny_llama(p, extra={"test.unicode": "naïve – ok"})
    w = gguf.GGUFWriter(str(tmp_path / "kinds.gguf"), "llama")
    V = gguf.GGUFValueType
    for name, value, vt in (("u8", 7, V.UINT8), ("i8", -3, V.INT8), ("u16", 65000, V.UINT16), ("i64", -2**40, V.INT64),
                            ("f64", 0.1, V.FLOAT64), ("flag", True, V.BOOL)):
        w.add_key_value(f"k.{name}", value, vt)
    w.add_array("k.floats", [0.5, -1.25])
    w.add_array("k.strings", ["a", "", "ßx"])
    w.add_tensor("t", np.arange(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for f in (p, tmp_path / "kinds.gguf"):
        _same_as_the_gguf_package(f)
    assert read_gguf(tmp_path / "kinds.gguf").metadata["k.strings"] == ["a", "", "ßx"]


def test_truncation_anywhere_is_a_format_error(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_tiny_llama(src)
    raw = src.read_bytes()
    header_end = read_gguf(src).data_start
    cut = tmp_path / "cut.gguf"
    for n in sorted({*range(4, 64), *range(64, header_end, 97), header_end - 1}):
        cut.write_bytes(raw[:n])
        with pytest.raises(GGUFFormatError):
            read_gguf(cut)
        with pytest.raises(ModelFileError):
            open_gguf(cut)
    cut.write_bytes(raw[:header_end + 100])  # the header whole, the tensors cut
    with pytest.raises(ModelFileError, match="truncated"):
        open_gguf(cut)


@pytest.mark.parametrize(("patch", "needle"), [
    (lambda b: b[:4] + struct.pack("<I", 9) + b[8:], "version 9"),
    (lambda b: b[:8] + struct.pack("<Q", 2**40) + b[16:], "implausible"),
    (lambda b: b[:24] + struct.pack("<Q", 2**50) + b[32:], "truncated"),  # the first key's length
])
def test_bad_header_fields_are_named(tmp_path, patch, needle):
    src = tmp_path / "tiny.gguf"
    write_tiny_llama(src)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(patch(src.read_bytes()))
    with pytest.raises(GGUFFormatError, match=needle):
        read_gguf(bad)
