"""Integer matrix-vector kernels: 8-bit activations times 4/8-bit weights, int32 sums, one scale per block.

llama.cpp's decode arithmetic.  The activation vector of each product is quantized once, per
32-element block ``b``, as llama.cpp's ``block_q8_0`` / ``block_q8_1``: ``d = max|x| / 127``,
``q = rint(x / d)`` (int8), the block's integer sum ``sx[b] = sum(q)``, and the scale stored as
a half, ``dx[b] = half(d)`` (Q4_1's min term too: ``mx[b] = half(d * sx[b])``).  A weight
block holds unsigned codes ``u`` (Q4: the nibble 0..15; Q8_0: the int8 plus 128), so each
block's dot product is an exact int32 ``S = sum(u * q)`` and

======  ==========================================================  ================
type    block value                                                 offset ``off``
======  ==========================================================  ================
Q4_0    ``d * dx * (S - 8 * sx)``                                   8
Q4_1    ``d * dx * S + m * mx``                                     0 (min term)
Q8_0    ``d * dx * (S - 128 * sx)``                                 128
======  ==========================================================  ================

added into a float32 accumulator block after block, in block order (``combine``).

Layout (``PackedMatrix``, repacked at load from the memory-mapped GGUF blocks, which stay
untouched): rows in tiles of 16, one 32-bit lane per row.  For tile ``t`` and block ``b``,
``qs[t, b]`` is 4 (Q4) or 8 (Q8_0) groups of 64 bytes; group ``g``, lane ``r`` holds 4 bytes of
row ``16t + r``: for Q4 the GGML bytes ``qs[4g : 4g+4]`` as stored (low nibbles: elements
``4g..4g+3``, high nibbles: ``16+4g..16+4g+3``), for Q8_0 elements ``4g..4g+3`` plus 128.  The
f16 scales ``d[t, b, r]`` (and Q4_1's mins ``m``) sit in their own contiguous arrays, so a tile's
block is one streak of ``qs`` plus 32 (64) bytes of halves: as many bytes as the GGUF block.
With this layout a 64-byte load times one broadcast 4-byte activation group is one ``vpdpbusd``
giving 16 rows' partial sums at once, and the 16 lanes finish as the 16 rows' results (no
horizontal sums).

Three implementations of the integer sums, chosen at load from the CPU (``select``): AVX-512
VNNI through ``decode.simd``'s intrinsics (with the quants prefetched ``PREFETCH_BYTES`` ahead),
the same kernels with AVX2's ``pmaddubsw`` + ``pmaddwd`` for the sums (CPUs without VNNI), and
plain numba loops for any other CPU.  All produce the same int32 sums and share ``combine`` (no
fast-math: every float operation in a fixed order), so their results are identical.  Each kernel is
written once (``_instantiate``) and compiled per path, with the path's name a constant that picks
its integer sums at compile time (see "the paths" below).  Every
kernel takes ``B`` activation rows (batched decode, B up to 8): each weight block is read and
unpacked once for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from . import simd
from .ops import rmsnorm
from .quant import F16_TABLE, QType

#: Rows per tile (one 32-bit vector lane each).
LANES = 16
#: Bytes of one tile's block of quants: 4 groups of 64 (Q4_0/Q4_1), 8 groups (Q8_0).
TILE_BLOCK_BYTES = {QType.Q4_0: 256, QType.Q4_1: 256, QType.Q8_0: 512}
#: The weight types with integer kernels.
INT_TYPES = tuple(TILE_BLOCK_BYTES)
#: The most activation rows one call takes (the scratch of a batched call is sized by it).
MAX_BATCH = 8

_Q4_0, _Q4_1, _Q8_0 = int(QType.Q4_0), int(QType.Q4_1), int(QType.Q8_0)
#: (block bytes, offset of the quants, has a min) of each GGUF block type.
_GGUF_BLOCK = {QType.Q4_0: (18, 2, False), QType.Q4_1: (20, 4, True), QType.Q8_0: (34, 2, False)}

_JIT = dict(cache=True, nogil=True)


@dataclass(frozen=True, slots=True)
class PackedMatrix:
    """One or more row-concatenated GGUF matrices of one type, in the tile layout above."""

    qtype: QType
    rows: int
    cols: int
    qs: np.ndarray  # (tiles, cols/32, 256 or 512) uint8
    d: np.ndarray  # (tiles, cols/32, 16) uint16: f16 scales
    m: np.ndarray  # (tiles, cols/32, 16) uint16: Q4_1's f16 mins; (0, cols/32, 16) otherwise

    @property
    def nbytes(self) -> int:
        return int(self.qs.nbytes + self.d.nbytes + self.m.nbytes)


# -- repacking from the GGUF blocks ------------------------------------------------------------


@njit(parallel=True, **_JIT)
def _repack(src, bs, qoff, flip, row0, qs, d, m):
    """Rows of GGUF matrix ``src`` (blocks of ``bs`` bytes: d at 0, min at 2 when ``m`` has tiles,
    quants from ``qoff``) into rows ``row0 ..`` of the tile arrays; quant bytes are xor-ed with ``flip``."""
    rows = src.shape[0]
    nb, nbytes = qs.shape[1], qs.shape[2]
    ngroups = nbytes // 64
    has_m = m.shape[0] > 0
    t_first = row0 // LANES
    t_last = (row0 + rows - 1) // LANES
    for t in prange(t_first, t_last + 1):
        lo = max(row0, t * LANES)
        hi = min(row0 + rows, t * LANES + LANES)
        for b in range(nb):
            o = b * bs
            for row in range(lo, hi):
                r = row - row0
                lane = row - t * LANES
                d[t, b, lane] = np.uint16(src[r, o]) | (np.uint16(src[r, o + 1]) << np.uint16(8))
                if has_m:
                    m[t, b, lane] = np.uint16(src[r, o + 2]) | (np.uint16(src[r, o + 3]) << np.uint16(8))
                for g in range(ngroups):
                    for i in range(4):
                        qs[t, b, g * 64 + lane * 4 + i] = src[r, o + qoff + 4 * g + i] ^ flip


def pack(mats, into: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> PackedMatrix | None:
    """``mats`` (``(qtype, data)`` pairs, ``data`` a GGUF ``uint8 (rows, row_bytes)`` view) stacked
    by rows into one ``PackedMatrix``; ``None`` unless all share one integer type and width.
    ``into``: zeroed ``(qs, d, m)`` arrays of the right shapes to fill (views of a stack of layers)
    instead of new ones."""
    qtypes = {QType(q) for q, _ in mats}
    if len(qtypes) != 1 or (qtype := qtypes.pop()) not in INT_TYPES:
        return None
    bs, qoff, has_min = _GGUF_BLOCK[qtype]
    widths = {data.shape[1] for _, data in mats}
    if len(widths) != 1:
        return None
    nb = widths.pop() // bs
    rows = sum(data.shape[0] for _, data in mats)
    tiles = (rows + LANES - 1) // LANES
    shapes = ((tiles, nb, TILE_BLOCK_BYTES[qtype]), (tiles, nb, LANES), (tiles if has_min else 0, nb, LANES))
    if into is None:
        qs, d, m = (np.zeros(sh, dt) for sh, dt in zip(shapes, (np.uint8, np.uint16, np.uint16), strict=True))
    else:
        qs, d, m = into
        if tuple(a.shape for a in into) != shapes:
            raise ValueError(f"pack: into has shapes {[a.shape for a in into]}, the matrix needs {shapes}")
    flip = np.uint8(128 if qtype == QType.Q8_0 else 0)
    row0 = 0
    for _, data in mats:
        src = data.view()
        src.setflags(write=False)  # as a GGUF file's are: one compiled signature for every caller
        _repack(src, bs, qoff, flip, row0, qs, d, m)
        row0 += data.shape[0]
    for a in (qs, d, m):
        a.setflags(write=False)
    return PackedMatrix(qtype, rows, nb * 32, qs, d, m)


# -- the activations ----------------------------------------------------------------------------


@njit(inline="always", **_JIT)
def half_round(v):
    """float32 ``v`` rounded to the nearest IEEE half (ties to even), as float32 (``|v|`` below
    65520: activations' scales are far smaller)."""
    a = abs(v)
    if a < np.float32(6.103515625e-05):  # half subnormals: multiples of 2**-24, exact in float32
        r = np.float32(np.rint(a * np.float32(16777216.0)) * np.float32(5.9604644775390625e-08))
    else:  # 10 mantissa bits: round the float32's 23 at bit 13
        b = simd.f32_bits(a)
        r = simd.bits_f32((b + np.int32(0xFFF) + ((b >> np.int32(13)) & np.int32(1))) & np.int32(~0x1FFF))
    return r if v >= np.float32(0.0) else -r


@njit(**_JIT)
def quantize_q8(x, xq, xd, xs, xm):
    """Rows ``x (B, n)`` (C-contiguous) as 8-bit blocks: ``xq`` (flat int8, ``B * n``), scales ``xd``,
    integer sums ``xs`` and min terms ``xm`` (flat, ``B * n / 32``), row after row.
    ``q = rint(x * (1 / d))`` with ``d = max|x| / 127`` (ties to even, as llama.cpp's vectorized
    ``quantize_row_q8_0``), then ``xd = half(d)`` and ``xm = half(d * sum(q))``: the halves its Q8
    blocks store."""
    _quantize(x, x.shape[1], xq, xd, xs, xm)


@njit(inline="always", **_JIT)
def _quantize(x, n, xq, xd, xs, xm):
    """``quantize_q8`` of the first ``n`` columns of each row of ``x`` (C-contiguous), 16 lanes at
    a time: the largest ``|x|`` and the codes' sum are order-free, the rest is per element, so
    the numbers are those of the scalar definition."""
    B, stride = x.shape
    nb = n // 32
    for s in range(B):
        for b in range(nb):
            lo, hi = simd.fload(x, s * stride + b * 32), simd.fload(x, s * stride + b * 32 + 16)
            a, c = simd.fabsmax(lo), simd.fabsmax(hi)
            dx = (a if a > c else c) / np.float32(127.0)
            inv = np.float32(1.0) / dx if dx != np.float32(0.0) else np.float32(0.0)
            q0, q1 = simd.vquant(lo, inv), simd.vquant(hi, inv)
            o = s * n + b * 32
            simd.vstore_i8(xq, o, q0)
            simd.vstore_i8(xq, o + 16, q1)
            xd[s * nb + b] = half_round(dx)
            total = simd.vhsum(simd.vadd(q0, q1))
            xs[s * nb + b] = total
            xm[s * nb + b] = half_round(dx * np.float32(total))


@njit(inline="always", **_JIT)
def exp_f32(v):
    """``exp(v)`` in float32 within 2 ulp (Cephes ``expf``), written so that loops of it vectorize:
    ``2**n * e**r`` with ``n = round(v / ln 2)``, ``e**r`` a polynomial, ``2**n`` from its bits."""
    v = v if v < np.float32(88.0) else np.float32(88.0)
    v = v if v > np.float32(-87.0) else np.float32(-87.0)
    n = np.floor(v * np.float32(1.44269504088896341) + np.float32(0.5))
    r = v - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    e = p * (r * r) + r + np.float32(1.0)
    return e * simd.bits_f32((np.int32(n) + np.int32(127)) << np.int32(23))


@njit(error_model="numpy", **_JIT)  # no division-by-zero check: the loop vectorizes
def swiglu_rows(x):
    """``x[s, :n] = silu(x[s, :n]) * x[s, n:]`` for each row of ``x (B, 2n)`` (gate | up), in place."""
    B, n2 = x.shape
    n = n2 // 2
    for s in range(B):
        for j in range(n):
            g = x[s, j]
            x[s, j] = g / (np.float32(1.0) + exp_f32(-g)) * x[s, n + j]


#: What the kernels do to ``x`` before quantizing it: nothing; RMS-normalize each row (times a
#: weight, into ``xn``); SwiGLU of the gate | up halves (in place).
PREP_NONE, PREP_RMSNORM, PREP_SWIGLU = 0, 1, 2
#: The weight and output of PREP_RMSNORM when there is no norm (read-only, like the file's norms).
NO_NORM = np.zeros(0, np.float32)
NO_NORM.setflags(write=False)
NO_ROWS = np.zeros((0, 0), np.float32)


@njit(inline="always", **_JIT)
def _check(qs, x, prep, out, xq):
    cols = qs.shape[1] * 32
    if x.shape[0] != out.shape[0] or x.shape[1] != (2 * cols if prep == PREP_SWIGLU else cols):
        raise ValueError("qmatvec: x must be (B, cols) (gate | up: (B, 2 * cols)) and out (B, rows)")
    if out.shape[1] > qs.shape[0] * LANES or xq.shape[0] < x.shape[0] * cols:
        raise ValueError("qmatvec: out has more rows than the matrix, or the activation scratch is too small")


@njit(inline="always", **_JIT)
def _prepare(x, prep, norm, eps, xn, xq, xd, xs, xm):
    """Quantize the kernels' input (see ``PREP_*``); returns its length."""
    if prep == PREP_SWIGLU:
        swiglu_rows(x)
        _quantize(x, x.shape[1] // 2, xq, xd, xs, xm)
        return x.shape[1] // 2
    if prep == PREP_RMSNORM:
        rmsnorm(x, norm, eps, xn)
        _quantize(xn, xn.shape[1], xq, xd, xs, xm)
    else:
        _quantize(x, x.shape[1], xq, xd, xs, xm)
    return x.shape[1]


# -- the paths -------------------------------------------------------------------------------------
# One source per kernel for all three paths: ``_instantiate(kind)`` compiles the kernels below with the path's
# name as a constant, and the few steps that differ per path branch on it (``if kind == "vnni"``).  numba drops
# the branches of the other paths (its dead-branch pruning, on a constant) before it types a kernel, so a path
# compiles only its own integer sums (the avx2 and plain kernels never an AVX-512 intrinsic), and numba caches
# each path's kernels like any function (a closure over a string is keyed by the string).


def path_jit(fn, kind: str, **options):
    """``fn`` (a closure over ``kind``) compiled as ``<name>_<kind>`` (the name profiles and the numba cache show)."""
    fn.__name__ = fn.__qualname__ = f"{fn.__name__}_{kind}"
    return njit(**_JIT, **options)(fn)


# -- the float half, shared by every path ----------------------------------------------------------


@njit(inline="always", **_JIT)
def combine(q4_1, off, dsc, msc, isum, dx, sx, mx, acc, s):
    """Add one block of 16 rows into ``acc[s]``: ``isum`` their int32 sums, ``dsc``/``msc`` their
    scales and mins as float32, ``dx``/``sx``/``mx`` the activation block's scale, integer sum
    and min term."""
    if q4_1:
        ms = mx
        for r in range(LANES):
            acc[s, r] = acc[s, r] + ((dsc[r] * dx) * np.float32(isum[r]) + msc[r] * ms)
    else:
        c = off * sx
        for r in range(LANES):
            acc[s, r] = acc[s, r] + (dsc[r] * dx) * np.float32(isum[r] - c)


@njit(inline="always", **_JIT)
def _vcombine(q4_1, off, d, m, a, dx, sx, mx, acc):
    """``combine`` on vectors (the vector paths): the same float operations in the same order."""
    if q4_1:
        t = simd.fmul(simd.fmul(d, simd.fsplat(dx)), simd.vtofloat(a))
        return simd.fadd(acc, simd.fadd(t, simd.fmul(m, simd.fsplat(mx))))
    return simd.fadd(acc, simd.fmul(simd.fmul(d, simd.fsplat(dx)), simd.vtofloat(simd.vsub(a, simd.vsplat(off * sx)))))


@njit(inline="always", **_JIT)
def _store(acc, out, t, rows, add):
    B = out.shape[0]
    for r in range(min(LANES, rows - t * LANES)):
        row = t * LANES + r
        for s in range(B):
            out[s, row] = out[s, row] + acc[s, r] if add else acc[s, r]


@njit(inline="always", **_JIT)
def _halves_table(h, t, blk, out):
    """``simd.fhalves`` of ``h[t, blk]``, by table (any CPU; the same exact values)."""
    for r in range(LANES):
        out[r] = F16_TABLE[h[t, blk, r]]


@njit(inline="always", **_JIT)
def _offset(qtype):
    return 128 if qtype == _Q8_0 else (8 if qtype == _Q4_0 else 0)


# -- integer sums: AVX-512 VNNI ------------------------------------------------------------------


@njit(inline="always", **_JIT)
def _chains_vnni(w, xq, xo, step, odd):
    """Per lane, the sums of the 8 unpacked groups ``w`` times their 4 activations: group ``2k`` at
    ``xq[xo + k * step]``, group ``2k + 1`` at ``xq[xo + odd + k * step]`` (two independent chains of
    ``vpdpbusd``, added at the end: integer sums, so the same result)."""
    z = simd.vsplat(np.int32(0))
    a = simd.vdpbusd(z, w[0], simd.vbcast4(xq, xo))
    b = simd.vdpbusd(z, w[1], simd.vbcast4(xq, xo + odd))
    a = simd.vdpbusd(a, w[2], simd.vbcast4(xq, xo + step))
    b = simd.vdpbusd(b, w[3], simd.vbcast4(xq, xo + odd + step))
    a = simd.vdpbusd(a, w[4], simd.vbcast4(xq, xo + 2 * step))
    b = simd.vdpbusd(b, w[5], simd.vbcast4(xq, xo + odd + 2 * step))
    a = simd.vdpbusd(a, w[6], simd.vbcast4(xq, xo + 3 * step))
    b = simd.vdpbusd(b, w[7], simd.vbcast4(xq, xo + odd + 3 * step))
    return simd.vadd(a, b)


# -- integer sums: AVX2 --------------------------------------------------------------------------
# AVX2's pmaddubsw + pmaddwd for the sums (simd.vdpbusd_avx2, vdpbusd_q8_avx2), for CPUs without AVX-512
# VNNI; LLVM splits the 512-bit vectors into two 256-bit halves.  Q8_0's sums come out as
# S - 128 * sx (its codes less 128), so its offset is applied already: the same float operations
# follow on the same values.


@njit(inline="always", **_JIT)
def _chain_avx2(q8, w, xq, xo, step, odd):
    """``_chains_vnni`` on AVX2 in one chain, groups in order (``q8``: Q8_0's codes, ``simd.vdpbusd_q8_avx2``)."""
    a = simd.vsplat(np.int32(0))
    for k in range(4):
        a = _vdpbusd_avx2(q8, a, w[2 * k], simd.vbcast4(xq, xo + k * step))
        a = _vdpbusd_avx2(q8, a, w[2 * k + 1], simd.vbcast4(xq, xo + odd + k * step))
    return a


@njit(inline="always", **_JIT)
def _vdpbusd_avx2(q8, acc, u, s):
    return simd.vdpbusd_q8_avx2(acc, u, s) if q8 else simd.vdpbusd_avx2(acc, u, s)


@njit(inline="always", **_JIT)
def _q4_dot(kind, w, xq, xo):
    """Per lane, the int32 sums of the unpacked Q4 tile block ``w`` (lo0, hi0, lo1, ..: elements ``4g..`` and
    ``16 + 4g..``) times activations ``xq[xo : xo + 32]``, on path ``kind`` (``vnni`` or ``avx2``)."""
    if kind == "vnni":
        return _chains_vnni(w, xq, xo, 4, 16)
    return _chain_avx2(False, w, xq, xo, 4, 16)


@njit(inline="always", **_JIT)
def _q8_dot(kind, w, xq, xo):
    """``_q4_dot`` for a Q8_0 tile block (its 8 groups in order: elements ``4g..``); AVX2's sums are less ``128 * sx``."""
    if kind == "vnni":
        return _chains_vnni(w, xq, xo, 8, 4)
    return _chain_avx2(True, w, xq, xo, 8, 4)


@njit(inline="always", **_JIT)
def _sums_offset(kind, qtype):
    """The offset ``off`` of the combine for ``qtype``'s sums on vector path ``kind`` (AVX2's Q8_0 sums have it applied)."""
    if kind == "avx2" and qtype == _Q8_0:
        return 0
    return _offset(qtype)


# -- the vector paths' tiles (VNNI, AVX2) --------------------------------------------------------


@njit(inline="always", **_JIT)
def _q4_unpack(qs, base):
    """The 4 groups of a Q4 tile block as 8 vectors of unsigned nibbles: (lo0, hi0, .. lo3, hi3)."""
    mask = simd.vsplat(np.int32(0x0F0F0F0F))
    v0 = simd.vload(qs, base)
    v1 = simd.vload(qs, base + 64)
    v2 = simd.vload(qs, base + 128)
    v3 = simd.vload(qs, base + 192)
    return (simd.vand(v0, mask), simd.vand(simd.vsrl4(v0), mask), simd.vand(v1, mask), simd.vand(simd.vsrl4(v1), mask),
            simd.vand(v2, mask), simd.vand(simd.vsrl4(v2), mask), simd.vand(v3, mask), simd.vand(simd.vsrl4(v3), mask))


@njit(inline="always", **_JIT)
def _q8_load(qs, base):
    return (simd.vload(qs, base), simd.vload(qs, base + 64), simd.vload(qs, base + 128), simd.vload(qs, base + 192),
            simd.vload(qs, base + 256), simd.vload(qs, base + 320), simd.vload(qs, base + 384), simd.vload(qs, base + 448))


@njit(inline="always", **_JIT)
def _dot(kind, is_q8, qs, base, xq, xo):
    """The 16 lanes' int32 sums of the tile block at ``qs[base]`` times activations ``xq[xo : xo + 32]``."""
    if is_q8:
        return _q8_dot(kind, _q8_load(qs, base), xq, xo)
    return _q4_dot(kind, _q4_unpack(qs, base), xq, xo)


#: How far ahead of the block being read its quants are prefetched (bytes; measured: 1 KiB 20%
#: slower per token than 4 KiB, 8-16 KiB the same).  The hardware prefetchers alone left the
#: layers' small matrices at ~25 GB/s, the head at ~38.
PREFETCH_BYTES = 4096


@njit(inline="always", **_JIT)
def _prefetch_ahead(qs, base, is_q8):
    """The quants of the tile block ``PREFETCH_BYTES`` past ``base`` (4 or 8 cache lines)."""
    ahead = base + PREFETCH_BYTES
    simd.prefetch(qs, ahead)
    simd.prefetch(qs, ahead + 64)
    simd.prefetch(qs, ahead + 128)
    simd.prefetch(qs, ahead + 192)
    if is_q8:
        simd.prefetch(qs, ahead + 256)
        simd.prefetch(qs, ahead + 320)
        simd.prefetch(qs, ahead + 384)
        simd.prefetch(qs, ahead + 448)


@njit(inline="always", **_JIT)
def _block_head(qs, dh, mh, t, blk, q4_1, is_q8):
    """Tile ``t``'s block ``blk``: where its quants start in ``qs`` (the block ``PREFETCH_BYTES`` further is
    prefetched), and its scales and mins as float32 vectors."""
    nb = qs.shape[1]
    hb = (t * nb + blk) * LANES
    base = (t * nb + blk) * qs.shape[2]
    _prefetch_ahead(qs, base, is_q8)
    d = simd.fhalves(dh, hb)
    return base, d, simd.fhalves(mh, hb) if q4_1 else d


@njit(inline="always", **_JIT)
def _rows(kind, is_q8, w, q4_1, off, d, m, xq, xd, xs, xm, n, nb, blk, acc):
    """Block ``blk``'s unpacked quants ``w`` times each row's activations, added into the row's ``acc[s]``."""
    for s in range(acc.shape[0]):
        a = _q8_dot(kind, w, xq, s * n + blk * 32) if is_q8 else _q4_dot(kind, w, xq, s * n + blk * 32)
        i = s * nb + blk
        simd.fstore(acc, s * LANES, _vcombine(q4_1, off, d, m, a, xd[i], xs[i], xm[i], simd.fload(acc, s * LANES)))


@njit(inline="always", **_JIT)
def _tile_simd(kind, qtype, qs, dh, mh, xq, xd, xs, xm, n, t, acc):
    """Tile ``t``'s 16 rows times the ``B`` activation rows into ``acc (B, 16)``, 16 lanes at a time."""
    nb = qs.shape[1]
    q4_1, is_q8, off = qtype == _Q4_1, qtype == _Q8_0, _sums_offset(kind, qtype)
    if acc.shape[0] == 1:  # one row: the 16 lanes' accumulator stays in a register over the blocks
        v = simd.fsplat(np.float32(0.0))
        for blk in range(nb):
            base, d, m = _block_head(qs, dh, mh, t, blk, q4_1, is_q8)
            v = _vcombine(q4_1, off, d, m, _dot(kind, is_q8, qs, base, xq, blk * 32), xd[blk], xs[blk], xm[blk], v)
        simd.fstore(acc, 0, v)
    else:  # B rows: each block's quants are loaded and unpacked once, then used for every row
        zero = simd.fsplat(np.float32(0.0))
        for s in range(acc.shape[0]):
            simd.fstore(acc, s * LANES, zero)
        for blk in range(nb):
            base, d, m = _block_head(qs, dh, mh, t, blk, q4_1, is_q8)
            if is_q8:
                _rows(kind, True, _q8_load(qs, base), q4_1, off, d, m, xq, xd, xs, xm, n, nb, blk, acc)
            else:
                _rows(kind, False, _q4_unpack(qs, base), q4_1, off, d, m, xq, xd, xs, xm, n, nb, blk, acc)


@njit(inline="always", **_JIT)
def _isums_simd(kind, qtype, qs, t, blk, xq, xo, isum):
    """``isum[r] = sum(u * q)`` for the 16 lanes of tile ``t``'s block ``blk``, activations from ``xq[xo]`` (AVX2's
    Q8_0 sums with their ``128 * sx`` added back, as the other paths give them)."""
    simd.vstore(isum, 0, _dot(kind, qtype == _Q8_0, qs, (t * qs.shape[1] + blk) * qs.shape[2], xq, xo))
    back = _offset(qtype) - _sums_offset(kind, qtype)
    if back != 0:
        sx = np.int32(0)
        for j in range(32):
            sx += np.int32(xq[xo + j])
        for r in range(LANES):
            isum[r] += np.int32(back) * sx


# -- integer sums: plain numba ------------------------------------------------------------------


@njit(inline="always", **_JIT)
def _isums_plain(qtype, qs, t, blk, xq, xo, isum):
    """``isum[r] = sum(u * q)`` for the 16 lanes of tile ``t``'s block ``blk``, activations from ``xq[xo]``."""
    if qtype == _Q8_0:
        for r in range(LANES):
            a = np.int32(0)
            for g in range(8):
                for i in range(4):
                    a += np.int32(qs[t, blk, g * 64 + r * 4 + i]) * np.int32(xq[xo + 4 * g + i])
            isum[r] = a
    else:
        for r in range(LANES):
            a = np.int32(0)
            for g in range(4):
                for i in range(4):
                    u = np.int32(qs[t, blk, g * 64 + r * 4 + i])
                    a += (u & 15) * np.int32(xq[xo + 4 * g + i]) + (u >> 4) * np.int32(xq[xo + 16 + 4 * g + i])
            isum[r] = a


@njit(inline="always", **_JIT)
def _tile_plain(qtype, qs, dh, mh, xq, xd, xs, xm, n, t, acc):
    """``_tile_simd`` in plain numba (any CPU): the same sums, the same combine on scalars, the same results."""
    nb = qs.shape[1]
    q4_1 = qtype == _Q4_1
    off = _offset(qtype)
    dsc = np.empty(LANES, np.float32)
    msc = np.zeros(LANES, np.float32)
    isum = np.empty(LANES, np.int32)
    acc[:] = np.float32(0.0)
    for blk in range(nb):
        _halves_table(dh, t, blk, dsc)
        if q4_1:
            _halves_table(mh, t, blk, msc)
        for s in range(acc.shape[0]):
            _isums_plain(qtype, qs, t, blk, xq, s * n + blk * 32, isum)
            combine(q4_1, off, dsc, msc, isum, xd[s * nb + blk], xs[s * nb + blk], xm[s * nb + blk], acc, s)


# -- the kernels, once for every path ----------------------------------------------------------------


def _instantiate(kind: str) -> IntKernels:
    """Path ``kind``'s kernels: the functions below with ``kind`` a constant (compiled, or loaded from numba's
    cache, at their first call: only the path a process uses is ever compiled).  ``vector`` is a constant too: numba
    drops the branch of the other kind of path before it types the kernel."""
    vector = kind != "plain"

    def qmatvec(qtype, qs, dh, mh, x, prep, norm, eps, xn, xq, xd, xs, xm, out, add):
        """``out[s] (+)= W . x[s]`` for the ``B`` rows of ``x (B, cols)``, ``W`` a ``PackedMatrix``'s
        ``qs, d, m`` of type ``qtype``; ``out (B, rows)`` is overwritten, or added to when ``add``.
        The input is ``x`` as it is (``prep`` PREP_NONE), RMS-normalized times ``norm`` into ``xn``
        (PREP_RMSNORM, ``ops.rmsnorm``), or with PREP_SWIGLU ``silu(gate) * up`` of ``x (B, 2 * cols)``
        (gate | up; written over the gate half).  ``xq, xd, xs, xm`` (flat, at least ``B * cols`` and
        ``B * cols / 32``) receive the input quantized."""
        _check(qs, x, prep, out, xq)
        n = _prepare(x, prep, norm, eps, xn, xq, xd, xs, xm)
        B, rows = out.shape
        for t in prange(qs.shape[0]):
            acc = np.empty((B, LANES), np.float32)  # hoisted by numba: one per thread and call
            if vector:
                _tile_simd(kind, qtype, qs, dh, mh, xq, xd, xs, xm, n, t, acc)
            else:
                _tile_plain(qtype, qs, dh, mh, xq, xd, xs, xm, n, t, acc)
            _store(acc, out, t, rows, add)

    def block_isums(qtype, qs, xq, n, out):
        """The raw int32 block sums ``out[s, row, b] = sum(u * q)`` of the path (for the tests)."""
        isum = np.empty(LANES, np.int32)
        for t in range(qs.shape[0]):
            for blk in range(qs.shape[1]):
                for s in range(out.shape[0]):
                    if vector:
                        _isums_simd(kind, qtype, qs, t, blk, xq, s * n + blk * 32, isum)
                    else:
                        _isums_plain(qtype, qs, t, blk, xq, s * n + blk * 32, isum)
                    for r in range(LANES):
                        out[s, t * LANES + r, blk] = isum[r]

    return IntKernels(kind, path_jit(qmatvec, kind, parallel=True), path_jit(block_isums, kind))


# -- choosing the implementation ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IntKernels:
    """The integer kernels one model uses: ``name`` is ``"vnni"``, ``"avx2"`` or ``"plain"``."""

    name: str
    matvec: object  # the path's ``qmatvec``
    block_isums: object

    def __call__(self, p: PackedMatrix, x: np.ndarray, act: Activations, out: np.ndarray, add: bool = False,
                 swiglu: bool = False, norm: np.ndarray | None = None, eps: float = 0.0, normed: np.ndarray | None = None) -> None:
        """``out (+)= p . x`` for each row of ``x (B, p.cols)``: of ``silu(gate) * up`` with ``swiglu``,
        of ``rmsnorm(x) * norm`` (written into ``normed``) when ``norm`` is given; ``act`` takes the
        input quantized."""
        if norm is not None:
            self.matvec(int(p.qtype), p.qs, p.d, p.m, x, PREP_RMSNORM, norm, eps, normed, act.q, act.d, act.s, act.m, out, add)
        else:
            self.matvec(int(p.qtype), p.qs, p.d, p.m, x, PREP_SWIGLU if swiglu else PREP_NONE, NO_NORM, 0.0, NO_ROWS,
                        act.q, act.d, act.s, act.m, out, add)


#: The environment variable that picks the integer kernels for the whole process (tests, benchmarks, users):
#: ``plain``, ``avx2``, ``vnni`` or ``auto`` (the fastest this CPU has; the default).
KERNELS_ENV = "WAFERVOX_KERNELS"
#: The paths, slowest first: a CPU that runs one runs every one before it.
KINDS = ("plain", "avx2", "vnni")
#: Each path's kernels (none compiled before its first call).
KERNELS = {kind: _instantiate(kind) for kind in KINDS}


#: Each path's ``IntKernels.matvec``, by name (for ``qmatvec``).
qmatvec_plain, qmatvec_avx2, qmatvec_vnni = (KERNELS[kind].matvec for kind in KINDS)


@njit(inline="always", **_JIT)
def qmatvec(kind, qtype, qs, dh, mh, x, prep, norm, eps, xn, xq, xd, xs, xm, out, add):
    """Path ``kind``'s ``IntKernels.matvec`` (its other arguments), for kernels compiled per path (``step_ops.LAYERS``,
    the Whisper decoder's step) to call: only that path's is compiled with them.  ``prep`` and ``add`` go on as
    plain values, never as the literals a caller writes: numba would compile the kernel once per literal (six
    parallel compiles of a first run instead of one); callers pass read-only weights and norms for the same reason."""
    p = np.int64(prep)
    a = np.bool_(add)
    if kind == "vnni":
        qmatvec_vnni(qtype, qs, dh, mh, x, p, norm, eps, xn, xq, xd, xs, xm, out, a)
    elif kind == "avx2":
        qmatvec_avx2(qtype, qs, dh, mh, x, p, norm, eps, xn, xq, xd, xs, xm, out, a)
    else:
        qmatvec_plain(qtype, qs, dh, mh, x, p, norm, eps, xn, xq, xd, xs, xm, out, a)


def available() -> tuple[str, ...]:
    """The paths this CPU (the one numba compiles for) can run, slowest first: ``plain`` always, ``avx2`` with AVX2
    and F16C, ``vnni`` with AVX-512 VNNI too."""
    kinds = ["plain"]
    if simd.has_avx2():
        kinds.append("avx2")
        if simd.has_vnni():
            kinds.append("vnni")
    return tuple(kinds)


def requested() -> str:
    """The path asked for by ``WAFERVOX_KERNELS`` (``auto`` when unset or empty), checked against the names."""
    import os

    kind = os.environ.get(KERNELS_ENV, "").strip().lower() or "auto"
    if kind != "auto" and kind not in KINDS:
        raise ValueError(f"{KERNELS_ENV}={kind!r} is not a kernel path: auto, {', '.join(KINDS)}")
    return kind


def select(kind: str = "auto") -> IntKernels:
    """The integer kernels ``kind`` names; ``"auto"``: those ``WAFERVOX_KERNELS`` names, else the fastest this CPU
    has (``vnni`` with AVX-512 VNNI, else ``avx2`` with AVX2 and F16C, else ``plain``).  A path the CPU cannot run
    is an error that says so (never an illegal instruction later)."""
    if kind == "auto":
        kind = requested()
    if kind == "auto":
        kind = available()[-1]
    if kind not in KINDS:
        raise ValueError(f"unknown integer kernels {kind!r}: auto, {', '.join(KINDS)}")
    if kind not in available():
        need = "AVX-512 VNNI (avx512vnni, avx512bw)" if kind == "vnni" else "AVX2 and F16C"
        raise ValueError(f"the {kind} kernels need a CPU with {need}; this one runs {', '.join(available())} "
                         f"(set {KERNELS_ENV} to one of those, or leave it unset)")
    return KERNELS[kind]


class Activations:
    """Scratch for ``B`` quantized activation rows of up to ``n`` elements (flat, as the kernels take them)."""

    def __init__(self, n: int, rows: int = 1):
        self.q = np.zeros(rows * n, np.int8)
        self.d = np.zeros(rows * n // 32, np.float32)
        self.s = np.zeros(rows * n // 32, np.int32)
        self.m = np.zeros(rows * n // 32, np.float32)
