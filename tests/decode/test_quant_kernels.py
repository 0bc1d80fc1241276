"""The numba kernels of ``decode/quant.py`` against NumPy references, for every GGML type.

``dequant_row``, ``block_sums``, ``matvec``, ``matvec3`` and ``matmat`` run on random
read-only matrices (as the memory-mapped weights are) and are compared with the
hand-written dequantizers of ``quant_reference.py``, which are themselves checked against
``gguf.quants.dequantize``.  Mutated references (nibble order swapped, nibbles interleaved)
must fail the same comparisons, which shows the tests can fail.
"""

from __future__ import annotations

import zlib
from functools import cache

import gguf
import numpy as np
import pytest
from quant_reference import BLOCK, DEQUANT, q4_k_scales, random_matrix

from decode import quant
from decode.quant import QType, block_sums, dequant_row, matmat, matvec, matvec3, row_bytes

#: Row lengths tested per type: 32-block types include 96 and 576 (not multiples of 256),
#: F32 includes 40 (not a multiple of 32, so the block sums are empty).
COLS = {
    "F32": (40, 96),
    "F16": (96,),
    "BF16": (96,),
    "Q4_0": (64, 96, 576),
    "Q4_1": (64, 96, 576),
    "Q8_0": (64, 96, 576),
    "Q4_K": (256, 512),
    "Q6_K": (256, 512),
}
ROWS = (7, 64, 130)  # below one 64-row chunk, exactly one, and two chunks plus a 2-row tail
SHAPES = [(qtype, cols) for qtype, all_cols in COLS.items() for cols in all_cols]
SUM_RTOL = 2e-4  # float32 sums in a different order than the float64 reference
DEQUANT_RTOL = 1e-6  # one fused multiply-add at most


def _seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


@cache
def matrix(qtype: str, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A read-only random matrix of ``qtype`` and its reference dequantization ``(rows, cols)``."""
    w = random_matrix(qtype, rows, cols, _seed(qtype, rows, cols, seed))
    ref = DEQUANT[qtype](w)
    w.setflags(write=False)
    ref.setflags(write=False)
    return w, ref


def activations(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def is_close(out: np.ndarray, ref: np.ndarray, rtol: float = SUM_RTOL) -> bool:
    """``out`` matches ``ref`` to ``rtol``, with an absolute slack of ``rtol`` times ``ref``'s magnitude."""
    return bool(np.allclose(out, ref, rtol=rtol, atol=rtol * np.abs(ref).max(initial=0.0)))


def assert_close(out: np.ndarray, ref: np.ndarray, rtol: float = SUM_RTOL) -> None:
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * np.abs(ref).max(initial=0.0))


def kernel_dequant(qtype: str, w: np.ndarray, cols: int) -> np.ndarray:
    """Every row of ``w`` through ``dequant_row``, into a NaN-filled matrix (unwritten slots stay NaN)."""
    out = np.full((w.shape[0], cols), np.nan, np.float32)
    for r in range(w.shape[0]):
        dequant_row(int(QType[qtype]), w, r, out[r])
    return out


def matvec_ref(ref: np.ndarray, x: np.ndarray) -> np.ndarray:
    return ref.astype(np.float64) @ x.astype(np.float64)


# -- the block table and the references themselves -----------------------------------------


@pytest.mark.parametrize("qtype", list(BLOCK))
def test_block_table_matches_gguf(qtype):
    gtype = gguf.GGMLQuantizationType[qtype]
    assert int(QType[qtype]) == int(gtype)
    assert quant.BLOCK[QType[qtype]] == BLOCK[qtype] == gguf.GGML_QUANT_SIZES[gtype]
    elems, nbytes = BLOCK[qtype]
    assert row_bytes(QType[qtype], 2 * 256) == 2 * 256 // elems * nbytes


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K"])
def test_row_bytes_rejects_partial_blocks(qtype):
    with pytest.raises(ValueError, match="multiple"):
        row_bytes(QType[qtype], BLOCK[qtype][0] + 16)


@pytest.mark.parametrize(("qtype", "cols"), SHAPES)
def test_reference_matches_gguf(qtype, cols):
    w, ref = matrix(qtype, 64, cols)
    assert ref.dtype == np.float32 and ref.shape == (64, cols)
    assert np.isfinite(ref).all()
    assert np.abs(ref).max() > 0
    theirs = gguf.quants.dequantize(w, gguf.GGMLQuantizationType[qtype]).reshape(64, cols)
    assert_close(ref, theirs, rtol=DEQUANT_RTOL)


def test_q4_k_scales_unpack_known_bytes():
    """One hand-packed scale block: sub-blocks 0-3 plain six-bit fields, 4-7 split over two bytes."""
    sc = np.array([1, 2, 63, 40, 33, 17, 62, 5])
    mn = np.array([7, 0, 21, 63, 48, 9, 30, 60])
    s = np.zeros(12, np.uint8)
    s[0:4] = sc[:4] | ((sc[4:] >> 4) << 6)
    s[4:8] = mn[:4] | ((mn[4:] >> 4) << 6)
    s[8:12] = (sc[4:] & 15) | ((mn[4:] & 15) << 4)
    got_sc, got_mn = q4_k_scales(s)
    np.testing.assert_array_equal(got_sc, sc)
    np.testing.assert_array_equal(got_mn, mn)


# -- dequant_row and block_sums ------------------------------------------------------------


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("qtype", "cols"), SHAPES)
def test_dequant_row(qtype, cols, rows):
    w, ref = matrix(qtype, rows, cols)
    assert_close(kernel_dequant(qtype, w, cols), ref, rtol=DEQUANT_RTOL)


@pytest.mark.parametrize("nblocks", [1, 3, 18])
def test_block_sums(nblocks):
    x = activations(32 * nblocks, seed=nblocks)
    out = np.full(nblocks, np.nan, np.float32)
    block_sums(x, out)
    assert_close(out, x.astype(np.float64).reshape(nblocks, 32).sum(axis=1), rtol=1e-5)


# -- the matrix products -------------------------------------------------------------------


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("qtype", "cols"), SHAPES)
def test_matvec(qtype, cols, rows):
    w, ref = matrix(qtype, rows, cols)
    x = activations(cols, seed=_seed("x", cols))
    out = np.full(rows, np.nan, np.float32)
    matvec(int(QType[qtype]), w, x, out)
    assert_close(out, matvec_ref(ref, x))


MATVEC3_CASES = [
    # (type, rows) of the three matrices sharing one input of `cols` elements
    ((("Q4_K", 130), ("Q6_K", 64), ("Q8_0", 7)), 512),  # the three chunks straddle matrix boundaries
    ((("Q4_0", 7), ("Q4_1", 130), ("F16", 64)), 576),
    ((("Q8_0", 64), ("BF16", 7), ("F32", 130)), 96),
    ((("Q4_K", 64), ("Q4_K", 64), ("Q6_K", 64)), 256),  # q/k/v-like, exactly one chunk each
]


@pytest.mark.parametrize(("mats", "cols"), MATVEC3_CASES)
def test_matvec3(mats, cols):
    ws = [matrix(qtype, rows, cols) for qtype, rows in mats]
    x = activations(cols, seed=_seed("x3", cols))
    outs = [np.full(rows, np.nan, np.float32) for _, rows in mats]
    args = [a for (qtype, _), (w, _) in zip(mats, ws, strict=True) for a in (int(QType[qtype]), w)]
    matvec3(*args, x, *outs)
    for out, (_, ref) in zip(outs, ws, strict=True):
        assert_close(out, matvec_ref(ref, x))


@pytest.mark.parametrize(("qtype", "cols", "rows"), [("Q4_K", 256, 130), ("Q8_0", 576, 7), ("Q6_K", 512, 64)])
def test_matvec3_empty_third(qtype, cols, rows):
    """gate/up as ``decode/model.py`` runs them: the third matrix and output are zero-row views of the second."""
    wg, ref_g = matrix(qtype, rows, cols)
    wu, ref_u = matrix(qtype, rows, cols, seed=1)
    x = activations(cols, seed=_seed("gate-up", cols))
    gate = np.full((1, rows), np.nan, np.float32)
    up = np.full((1, rows), np.nan, np.float32)
    q = int(QType[qtype])
    matvec3(q, wg, q, wu, q, wu[:0], x, gate[0], up[0], up[0, :0])
    assert_close(gate[0], matvec_ref(ref_g, x))
    assert_close(up[0], matvec_ref(ref_u, x))


@pytest.mark.parametrize("ntok", [1, 3, 5, 17])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("qtype", "cols"), SHAPES)
def test_matmat(qtype, cols, rows, ntok):
    w, ref = matrix(qtype, rows, cols)
    x = activations((ntok, cols), seed=_seed("X", ntok, cols))
    out = np.full((ntok, rows), np.nan, np.float32)
    matmat(int(QType[qtype]), w, x, out)
    assert_close(out, x.astype(np.float64) @ ref.astype(np.float64).T)


def test_matmat_matches_matvec_per_token():
    """Prefill and decode paths agree: each token's row of ``matmat`` is ``matvec`` of that token."""
    w, _ = matrix("Q4_K", 130, 512)
    x = activations((5, 512), seed=3)
    out = np.empty((5, 130), np.float32)
    matmat(int(QType.Q4_K), w, x, out)
    for t in range(5):
        one = np.empty(130, np.float32)
        matvec(int(QType.Q4_K), w, x[t], one)
        assert_close(out[t], one.astype(np.float64), rtol=1e-5)


# -- the tests can fail: plausible layout bugs in a reference are caught ----------------------


def swap_nibbles_32(ref: np.ndarray) -> np.ndarray:
    """A Q4_0/Q4_1 reference with high nibbles first: each block's two 16-element halves swapped."""
    rows = ref.shape[0]
    return ref.reshape(rows, -1, 2, 16)[:, :, ::-1].reshape(rows, -1)


def interleave_nibbles_k4(ref: np.ndarray) -> np.ndarray:
    """A Q4_K reference that interleaves each byte's nibbles (lo, hi, lo, hi ...) inside a 64-element chunk."""
    rows = ref.shape[0]
    return ref.reshape(rows, -1, 2, 32).transpose(0, 1, 3, 2).reshape(rows, -1)


@pytest.mark.parametrize(
    ("qtype", "cols", "mutate"),
    [("Q4_0", 96, swap_nibbles_32), ("Q4_1", 576, swap_nibbles_32), ("Q4_K", 512, interleave_nibbles_k4)],
)
def test_wrong_reference_is_caught(qtype, cols, mutate):
    w, ref = matrix(qtype, 64, cols)
    wrong = mutate(ref)
    theirs = gguf.quants.dequantize(w, gguf.GGMLQuantizationType[qtype])
    assert not is_close(theirs, wrong, rtol=DEQUANT_RTOL)
    assert not is_close(kernel_dequant(qtype, w, cols), wrong, rtol=DEQUANT_RTOL)
    x = activations(cols, seed=_seed("x", cols))
    out = np.empty(64, np.float32)
    matvec(int(QType[qtype]), w, x, out)
    assert not is_close(out, matvec_ref(wrong, x))
    assert is_close(out, matvec_ref(ref, x))  # the right reference still passes on the same data
