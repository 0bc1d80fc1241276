"""GGML block formats and the numba kernels that read them in place.

A weight matrix is kept as the GGUF file stores it: a read-only ``uint8`` view of
shape ``(d_out, row_bytes)`` into the memory-mapped file, one row per output
feature, each row a run of quantized blocks.  Nothing here expands a matrix to
float32: the dot-product kernels read the blocks directly, and the dequantize
kernel writes one row into a caller's scratch buffer.

Block layouts (little-endian, ``f16`` = IEEE half):

======  =====  =====  ===============================================================
type    elems  bytes  layout
======  =====  =====  ===============================================================
F32     1      4      float32
F16     1      2      half
BF16    1      2      upper half of a float32
Q4_0    32     18     d:f16, qs[16]: x[j] = (lo(qs[j]) - 8)*d, x[j+16] = (hi(qs[j]) - 8)*d
Q4_1    32     20     d:f16, m:f16, qs[16]: x[j] = lo(qs[j])*d + m, x[j+16] = hi(qs[j])*d + m
Q8_0    32     34     d:f16, qs[32] int8: x[j] = qs[j]*d
Q4_K    256    144    d, dmin:f16, scales[12] (8 six-bit scale/min pairs), qs[128]
Q6_K    256    210    ql[128], qh[64], scales[16] int8, d:f16
======  =====  =====  ===============================================================
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
from numba import njit, prange


class QType(IntEnum):
    """GGML tensor type ids, as written in a GGUF file."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q8_0 = 8
    Q4_K = 12
    Q6_K = 14
    BF16 = 30


#: (elements per block, bytes per block) for each supported type.
BLOCK = {
    QType.F32: (1, 4),
    QType.F16: (1, 2),
    QType.BF16: (1, 2),
    QType.Q4_0: (32, 18),
    QType.Q4_1: (32, 20),
    QType.Q8_0: (32, 34),
    QType.Q4_K: (256, 144),
    QType.Q6_K: (256, 210),
}


def row_bytes(qtype: QType, n: int) -> int:
    """Bytes taken by one row of ``n`` elements of ``qtype``."""
    elems, nbytes = BLOCK[qtype]
    if n % elems:
        raise ValueError(f"{qtype.name} rows need a multiple of {elems} elements, got {n}")
    return n // elems * nbytes


# Every half-precision bit pattern as float32 (256 KiB); numba freezes it as a constant.
F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

_F32, _F16, _BF16 = int(QType.F32), int(QType.F16), int(QType.BF16)
_Q4_0, _Q4_1, _Q8_0 = int(QType.Q4_0), int(QType.Q4_1), int(QType.Q8_0)
_Q4_K, _Q6_K = int(QType.Q4_K), int(QType.Q6_K)

_JIT = dict(cache=True, nogil=True)
# Reassociation lets LLVM vectorize the reductions; no-NaN/no-Inf flags are left off.
_FAST = {"reassoc", "contract", "nsz", "arcp"}


@njit(inline="always", **_JIT)
def _half(w, r, o):
    """The f16 stored at bytes ``o, o+1`` of row ``r``, as float32."""
    return F16_TABLE[np.int64(w[r, o]) | (np.int64(w[r, o + 1]) << 8)]


@njit(inline="always", **_JIT)
def _k4_scale_min(w, r, o, j):
    """Six-bit scale and min of sub-block ``j`` of a Q4_K block whose scales start at ``o``."""
    if j < 4:
        sc = np.int64(w[r, o + j]) & 63
        mn = np.int64(w[r, o + j + 4]) & 63
    else:
        sc = (np.int64(w[r, o + j + 4]) & 15) | ((np.int64(w[r, o + j - 4]) >> 6) << 4)
        mn = (np.int64(w[r, o + j + 4]) >> 4) | ((np.int64(w[r, o + j]) >> 6) << 4)
    return sc, mn


@njit(inline="always", fastmath=_FAST, **_JIT)
def _dequant_q4(w, r, out, has_min):
    """Row ``r`` of a Q4_1 (``has_min``: 20-byte blocks ``d, m, qs``) or Q4_0 matrix (18-byte blocks ``d, qs``, codes
    less 8) as float32 into ``out``; ``has_min`` is a constant at each call."""
    nb = out.shape[0] // 32
    bs, qo = (20, 4) if has_min else (18, 2)
    half = w.shape[1] // nb - qo  # 16, as a run-time value (see the note above _dot_q4)
    for b in range(nb):
        o = b * bs
        d = _half(w, r, o)
        m = _half(w, r, o + 2) if has_min else np.float32(0.0)
        for j in range(half):
            q = np.int32(w[r, o + qo + j])
            if has_min:
                out[b * 32 + j] = np.float32(q & 15) * d + m
                out[b * 32 + j + 16] = np.float32(q >> 4) * d + m
            else:
                out[b * 32 + j] = np.float32((q & 15) - 8) * d
                out[b * 32 + j + 16] = np.float32((q >> 4) - 8) * d


@njit(fastmath=_FAST, **_JIT)
def dequant_row(qtype, w, r, out):
    """Write row ``r`` of quantized matrix ``w`` as float32 into ``out`` (length = row elements)."""
    dequant_row_inline(qtype, w, r, out)


@njit(inline="always", fastmath=_FAST, **_JIT)
def dequant_row_inline(qtype, w, r, out):
    """``dequant_row`` inlined where it is called: with ``qtype`` a constant there, only that type's branch is
    compiled (the caller compiles with the same fast-math flags, so the numbers are the same)."""
    n = out.shape[0]
    if qtype == _F32:
        out[:] = w[r].view(np.float32)
    elif qtype == _F16:
        h = w[r].view(np.uint16)
        for j in range(n):
            out[j] = F16_TABLE[h[j]]
    elif qtype == _BF16:
        h = w[r].view(np.uint16)
        bits = out.view(np.uint32)
        for j in range(n):
            bits[j] = np.uint32(h[j]) << 16
    elif qtype == _Q4_0 or qtype == _Q4_1:
        if qtype == _Q4_1:
            _dequant_q4(w, r, out, True)
        else:
            _dequant_q4(w, r, out, False)
    elif qtype == _Q8_0:
        nb = n // 32
        qk = w.shape[1] // nb - 2
        for b in range(nb):
            o = b * 34
            d = _half(w, r, o)
            for j in range(qk):
                q = np.int32(w[r, o + 2 + j])
                out[b * 32 + j] = np.float32((q ^ 128) - 128) * d
    elif qtype == _Q4_K:
        nb = n // 256
        lanes = w.shape[1] // nb - 112  # 32
        for b in range(nb):
            o = b * 144
            d = _half(w, r, o)
            dmin = _half(w, r, o + 2)
            for c in range(4):  # four 64-element chunks, 32 bytes of qs each
                sc1, m1 = _k4_scale_min(w, r, o + 4, 2 * c)
                sc2, m2 = _k4_scale_min(w, r, o + 4, 2 * c + 1)
                d1 = d * np.float32(sc1)
                d2 = d * np.float32(sc2)
                mm1 = dmin * np.float32(m1)
                mm2 = dmin * np.float32(m2)
                qo = o + 16 + 32 * c
                yo = b * 256 + 64 * c
                for lane in range(lanes):
                    q = np.int32(w[r, qo + lane])
                    out[yo + lane] = d1 * np.float32(q & 15) - mm1
                    out[yo + 32 + lane] = d2 * np.float32(q >> 4) - mm2
    elif qtype == _Q6_K:
        nb = n // 256
        lanes = w.shape[1] // nb - 178  # 32
        for b in range(nb):
            o = b * 210
            d = _half(w, r, o + 208)
            for half in range(2):
                ql = o + 64 * half
                qh = o + 128 + 32 * half
                sc = o + 192 + 8 * half
                yo = b * 256 + 128 * half
                for lane in range(lanes):
                    s = lane // 16
                    h = np.int32(w[r, qh + lane])
                    lo0 = np.int32(w[r, ql + lane])
                    lo1 = np.int32(w[r, ql + lane + 32])
                    q1 = ((lo0 & 15) | ((h & 3) << 4)) - 32
                    q2 = ((lo1 & 15) | (((h >> 2) & 3) << 4)) - 32
                    q3 = ((lo0 >> 4) | (((h >> 4) & 3) << 4)) - 32
                    q4 = ((lo1 >> 4) | (((h >> 6) & 3) << 4)) - 32
                    out[yo + lane] = d * np.float32(_i8(w[r, sc + s])) * np.float32(q1)
                    out[yo + lane + 32] = d * np.float32(_i8(w[r, sc + s + 2])) * np.float32(q2)
                    out[yo + lane + 64] = d * np.float32(_i8(w[r, sc + s + 4])) * np.float32(q3)
                    out[yo + lane + 96] = d * np.float32(_i8(w[r, sc + s + 6])) * np.float32(q4)


@njit(inline="always", **_JIT)
def _i8(b):
    """A stored byte read as a signed int8."""
    return (np.int32(b) ^ 128) - 128


@njit(fastmath=_FAST, **_JIT)
def block_sums(x, out):
    """Sums of ``x`` over consecutive 32-element blocks (the min/offset terms of Q4_0/Q4_1)."""
    for b in range(out.shape[0]):
        s = np.float32(0.0)
        for j in range(32):
            s += x[b * 32 + j]
        out[b] = s


# The block loops below take their trip count (``half`` = 16, ``qk`` = 32) as a
# run-time value on purpose: with a literal 16 LLVM unrolls the loop and vectorizes
# across blocks with gathers, about 4x slower than one vector per block.


@njit(inline="always", fastmath=_FAST, **_JIT)
def _dot_q4(w, r, x, xs, half, has_min):
    """Row ``r`` of a Q4_1 (``has_min``: 20-byte blocks ``d, m, qs``) or Q4_0 matrix (18-byte blocks ``d, qs``, codes
    less 8) times ``x``; ``has_min`` is a constant at each call, so each type compiles only its own sums."""
    bs, qo = (20, 4) if has_min else (18, 2)
    acc = np.float32(0.0)
    for b in range(xs.shape[0]):
        o = b * bs
        xo = b * 32
        s = np.float32(0.0)
        for j in range(half):
            q = np.int32(w[r, o + qo + j])
            s += np.float32(q & 15) * x[xo + j] + np.float32(q >> 4) * x[xo + j + half]
        if has_min:
            acc += _half(w, r, o) * s + _half(w, r, o + 2) * xs[b]
        else:
            acc += _half(w, r, o) * (s - np.float32(8.0) * xs[b])
    return acc


@njit(inline="always", fastmath=_FAST, **_JIT)
def _dot_q8_0(w, r, x, nb, qk):
    acc = np.float32(0.0)
    for b in range(nb):
        o = b * 34
        xo = b * 32
        s = np.float32(0.0)
        for j in range(qk):
            s += np.float32((np.int32(w[r, o + 2 + j]) ^ 128) - 128) * x[xo + j]
        acc += _half(w, r, o) * s
    return acc


@njit(inline="always", fastmath=_FAST, **_JIT)
def _dot(a, b):
    s = np.float32(0.0)
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@njit(inline="always", fastmath=_FAST, **_JIT)
def row_dot(qtype, w, r, x, xs, buf):
    """Dot product of row ``r`` of ``w`` with ``x``.

    ``xs`` holds the 32-block sums of ``x`` (used by Q4_0/Q4_1); ``buf`` is a
    float32 scratch row for the types read by dequantizing one row first.
    """
    n = x.shape[0]
    if qtype == _Q4_1:
        return _dot_q4(w, r, x, xs, n // xs.shape[0] // 2, True)
    if qtype == _Q8_0:
        return _dot_q8_0(w, r, x, xs.shape[0], n // xs.shape[0])
    if qtype == _Q4_0:
        return _dot_q4(w, r, x, xs, n // xs.shape[0] // 2, False)
    dequant_row(qtype, w, r, buf)
    return _dot(buf, x)


@njit(parallel=True, fastmath=_FAST, **_JIT)
def matvec(qtype, w, x, out):
    """``out[r] = W[r] . x`` for every row of quantized ``w`` (decode: one token)."""
    n = x.shape[0]
    xs = np.empty(n // 32 if n % 32 == 0 else 0, np.float32)
    block_sums(x, xs)
    rows = out.shape[0]
    nchunk = (rows + 63) // 64
    for c in prange(nchunk):
        buf = np.empty(n, np.float32)
        for r in range(c * 64, min(rows, c * 64 + 64)):
            out[r] = row_dot(qtype, w, r, x, xs, buf)


@njit(parallel=True, fastmath=_FAST, **_JIT)
def matvec3(qa, wa, qb, wb, qc, wc, x, oa, ob, oc):
    """Three matvecs sharing one input (q/k/v, or gate/up with ``oc`` empty) in one parallel pass."""
    n = x.shape[0]
    xs = np.empty(n // 32 if n % 32 == 0 else 0, np.float32)
    block_sums(x, xs)
    na, nb, nc = oa.shape[0], ob.shape[0], oc.shape[0]
    total = na + nb + nc
    nchunk = (total + 63) // 64
    for c in prange(nchunk):
        buf = np.empty(n, np.float32)
        for i in range(c * 64, min(total, c * 64 + 64)):
            if i < na:
                oa[i] = row_dot(qa, wa, i, x, xs, buf)
            elif i < na + nb:
                ob[i - na] = row_dot(qb, wb, i - na, x, xs, buf)
            else:
                oc[i - na - nb] = row_dot(qc, wc, i - na - nb, x, xs, buf)


_TILE = 4  # weight rows dequantized together in matmat, reusing each loaded activation


@njit(parallel=True, fastmath=_FAST, **_JIT)
def matmat(qtype, w, x, out):
    """``out[t, r] = W[r] . x[t]`` for a batch of tokens (prefill, matrix-matrix).

    Each weight row is dequantized once into a small per-task scratch tile and used
    for every token of the batch, so the weights are read once per batch.
    """
    ntok, n = x.shape
    rows = out.shape[1]
    ntile = (rows + _TILE - 1) // _TILE
    for c in prange(ntile):
        r0 = c * _TILE
        k = min(_TILE, rows - r0)
        buf = np.empty((_TILE, n), np.float32)
        for i in range(k):
            dequant_row(qtype, w, r0 + i, buf[i])
        if k == _TILE:
            for t in range(ntok):
                s0 = np.float32(0.0)
                s1 = np.float32(0.0)
                s2 = np.float32(0.0)
                s3 = np.float32(0.0)
                for j in range(n):
                    xv = x[t, j]
                    s0 += buf[0, j] * xv
                    s1 += buf[1, j] * xv
                    s2 += buf[2, j] * xv
                    s3 += buf[3, j] * xv
                out[t, r0] = s0
                out[t, r0 + 1] = s1
                out[t, r0 + 2] = s2
                out[t, r0 + 3] = s3
        else:
            for t in range(ntok):
                for i in range(k):
                    out[t, r0 + i] = _dot(buf[i], x[t])
