"""Hand-written NumPy dequantizers for the GGML block formats, and random quantized test matrices.

Written from the block layouts in ``decode/quant.py``'s docstring (and GGML's
``dequantize_row_*``) without importing ``decode``: the kernel tests compare the numba
kernels with these, and ``test_reference_matches_gguf`` compares these with
``gguf.quants.dequantize``.  A dequantizer takes a ``uint8 (rows, row_bytes)`` matrix and
returns ``float32 (rows, elements)``; each one works on whole blocks at once (reshape,
then unpack nibbles and bit fields along a new axis).
"""

from __future__ import annotations

import numpy as np

#: (elements per block, bytes per block) of each GGML type, written out from the layouts.
BLOCK = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q6_K": (256, 210),
}

#: Byte offsets of the f16 scale fields of each block type, with the range test matrices draw them from.
SCALE_FIELDS = {
    "Q4_0": [(0, -0.1, 0.1)],  # d
    "Q4_1": [(0, -0.1, 0.1), (2, -1.0, 1.0)],  # d, m
    "Q8_0": [(0, -0.1, 0.1)],  # d
    "Q4_K": [(0, -0.1, 0.1), (2, -0.1, 0.1)],  # d, dmin
    "Q6_K": [(208, -0.1, 0.1)],  # d (the last two bytes)
}


def _blocks(w: np.ndarray, qtype: str) -> np.ndarray:
    """``w`` as ``(rows, blocks, bytes per block)``."""
    return np.asarray(w, dtype=np.uint8).reshape(w.shape[0], -1, BLOCK[qtype][1])


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian halves in the last axis (two bytes each) as float32."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _i8(b: np.ndarray) -> np.ndarray:
    """Bytes read as signed int8."""
    return np.ascontiguousarray(b).view(np.int8)


def dequant_f32(w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w).view("<f4").copy()


def dequant_f16(w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w).view("<f2").astype(np.float32)


def dequant_bf16(w: np.ndarray) -> np.ndarray:
    """Each stored half is the upper 16 bits of a float32."""
    return (np.ascontiguousarray(w).view("<u2").astype(np.uint32) << 16).view(np.float32)


def dequant_q4_0(w: np.ndarray) -> np.ndarray:
    """x[j] = (lo(qs[j]) - 8) * d, x[j + 16] = (hi(qs[j]) - 8) * d."""
    b = _blocks(w, "Q4_0")
    d = _f16(b[..., 0:2])  # (rows, blocks, 1)
    qs = b[..., 2:18]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32)  # (rows, blocks, 32)
    return ((q - 8) * d).reshape(w.shape[0], -1)


def dequant_q4_1(w: np.ndarray) -> np.ndarray:
    """x[j] = lo(qs[j]) * d + m, x[j + 16] = hi(qs[j]) * d + m."""
    b = _blocks(w, "Q4_1")
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    qs = b[..., 4:20]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32)
    return (q * d + m).reshape(w.shape[0], -1)


def dequant_q8_0(w: np.ndarray) -> np.ndarray:
    """x[j] = int8(qs[j]) * d."""
    b = _blocks(w, "Q8_0")
    d = _f16(b[..., 0:2])
    return (_i8(b[..., 2:34]).astype(np.float32) * d).reshape(w.shape[0], -1)


def q4_k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight six-bit (scale, min) pairs packed in the 12 scale bytes ``s (..., 12)``.

    Sub-blocks 0-3 take the low six bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks
    4-7 take a nibble of bytes 8-11 (low: scale, high: min) plus the top two bits of
    bytes 0-3 (scale) and 4-7 (min) as bits 4-5.
    """
    s = s.astype(np.int32)
    lo_sc, lo_mn, packed = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo_sc & 63, (packed & 15) | ((lo_sc >> 6) << 4)], axis=-1)
    mn = np.concatenate([lo_mn & 63, (packed >> 4) | ((lo_mn >> 6) << 4)], axis=-1)
    return sc, mn


def dequant_q4_k(w: np.ndarray) -> np.ndarray:
    """d, dmin, scales[12], qs[128]: 64-element chunk c reads qs[32c : 32c + 32];
    its low nibbles are sub-block 2c, its high nibbles sub-block 2c + 1;
    x = d * scale[s] * q - dmin * min[s]."""
    b = _blocks(w, "Q4_K")
    rows, nb = b.shape[:2]
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])  # (rows, blocks, 1)
    sc, mn = q4_k_scales(b[..., 4:16])  # (rows, blocks, 8)
    qs = b[..., 16:144].reshape(rows, nb, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(rows, nb, 8, 32).astype(np.float32)
    scale = (d * sc.astype(np.float32))[..., None]
    offset = (dmin * mn.astype(np.float32))[..., None]
    return (scale * q - offset).reshape(rows, -1)


def dequant_q6_k(w: np.ndarray) -> np.ndarray:
    """ql[128], qh[64], scales[16] int8, d: two 128-element halves, half h reading
    ql[64h : 64h + 64] and qh[32h : 32h + 32]; for lane l < 32 the four quarters are
    q1 = lo(ql[l])      | bits 0-1 of qh[l] << 4,   q2 = lo(ql[l + 32]) | bits 2-3 << 4,
    q3 = hi(ql[l])      | bits 4-5 of qh[l] << 4,   q4 = hi(ql[l + 32]) | bits 6-7 << 4,
    minus 32; element e of the block (16-element sub-block e // 16) is d * scales[e // 16] * q."""
    b = _blocks(w, "Q6_K")
    rows, nb = b.shape[:2]
    ql = b[..., 0:128].reshape(rows, nb, 2, 2, 32).astype(np.int32)  # (half, first/second 32 bytes, lane)
    qh = b[..., 128:192].reshape(rows, nb, 2, 32).astype(np.int32)
    sc = _i8(b[..., 192:208]).astype(np.float32)  # (rows, blocks, 16)
    d = _f16(b[..., 208:210])
    q1 = (ql[:, :, :, 0] & 15) | ((qh & 3) << 4)
    q2 = (ql[:, :, :, 1] & 15) | (((qh >> 2) & 3) << 4)
    q3 = (ql[:, :, :, 0] >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (ql[:, :, :, 1] >> 4) | (((qh >> 6) & 3) << 4)
    q = (np.stack([q1, q2, q3, q4], axis=3) - 32).reshape(rows, nb, 16, 16).astype(np.float32)
    return ((d * sc)[..., None] * q).reshape(rows, -1)


DEQUANT = {
    "F32": dequant_f32,
    "F16": dequant_f16,
    "BF16": dequant_bf16,
    "Q4_0": dequant_q4_0,
    "Q4_1": dequant_q4_1,
    "Q8_0": dequant_q8_0,
    "Q4_K": dequant_q4_k,
    "Q6_K": dequant_q6_k,
}


def random_matrix(qtype: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """A random ``uint8 (rows, row_bytes)`` matrix of ``qtype`` with finite values.

    Float types get random finite values; block types get random bytes per block, with
    every f16 scale field overwritten by a random half from ``SCALE_FIELDS``'s range
    (Q4_K's packed scale bytes and Q6_K's int8 scales stay fully random).
    """
    rng = np.random.default_rng(seed)
    if qtype == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint8)
    if qtype == "F16":
        return rng.uniform(-2.0, 2.0, (rows, cols)).astype("<f2").view(np.uint8)
    if qtype == "BF16":
        bits = rng.standard_normal((rows, cols), dtype=np.float32).view(np.uint32) >> 16
        return bits.astype("<u2").view(np.uint8)
    elems, nbytes = BLOCK[qtype]
    b = rng.integers(0, 256, (rows, cols // elems, nbytes), dtype=np.uint8)
    for offset, lo, hi in SCALE_FIELDS[qtype]:
        b[..., offset:offset + 2] = rng.uniform(lo, hi, (rows, cols // elems, 1)).astype("<f2").view(np.uint8)
    return b.reshape(rows, -1)


# -- the integer decode path (decode/qint.py), written from its docstring -----------------------

#: Rows per tile of the packed layout, and the code offset each integer type subtracts.
LANES = 16
INT_OFFSET = {"Q4_0": 8, "Q4_1": 0, "Q8_0": 128}


def quantize_q8_exact(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's 8-bit activations of rows ``x (B, n)`` before its scales are stored as halves:
    per 32-block ``d = max|x| / 127``, ``q = rint(x * (1 / d))`` (0 where ``d`` is 0), and
    ``sum(q)``; float32 throughout.  Returns ``q int8 (B, n)``, ``d float32 (B, n/32)``,
    ``sums int32 (B, n/32)``."""
    x = np.asarray(x, np.float32)
    xb = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(xb).max(axis=-1) / np.float32(127.0)).astype(np.float32)
    inv = np.zeros_like(d)
    np.divide(np.float32(1.0), d, out=inv, where=d != 0)
    q = np.rint(xb * inv[..., None]).astype(np.int8)
    return q.reshape(x.shape), d, q.astype(np.int32).sum(axis=-1).astype(np.int32)


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``quantize_q8_exact`` as llama.cpp's ``block_q8_0``/``block_q8_1`` store it: the scale as a
    half, ``half(d)``, and the Q8_1 min term ``half(d * sum(q))`` (numpy's float16 rounds to
    nearest, ties to even).  Returns ``q``, ``half(d)``, ``sums``, ``half(d * sums)``, the last
    three ``(B, n/32)``, float32 / int32 / float32."""
    q, d, sums = quantize_q8_exact(x)
    dh = d.astype(np.float16).astype(np.float32)
    mh = (d * sums.astype(np.float32)).astype(np.float16).astype(np.float32)
    return q, dh, sums, mh


def int_codes(qtype: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unsigned codes ``u (rows, blocks, 32)`` of a Q4_0 / Q4_1 / Q8_0 matrix in element order
    (Q4: element ``j`` is the low nibble of ``qs[j]``, element ``j + 16`` its high nibble; Q8_0:
    the int8 plus 128), its scales ``d`` and (Q4_1) mins ``m`` as float32 ``(rows, blocks)``."""
    b = _blocks(w, qtype)
    d = _f16(b[..., 0:2])[..., 0]
    m = _f16(b[..., 2:4])[..., 0] if qtype == "Q4_1" else np.zeros_like(d)
    if qtype == "Q8_0":
        u = _i8(b[..., 2:34]).astype(np.int32) + 128
    else:
        qs = b[..., 4:20] if qtype == "Q4_1" else b[..., 2:18]
        u = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int32)
    return u, d, m


def int_block_sums(u: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``S[s, row, b] = sum_j u[row, b, j] * q[s, b, j]``: the exact int32 sums, ``(B, rows, blocks)``."""
    qb = q.reshape(q.shape[0], -1, 32).astype(np.int64)
    return np.einsum("rbj,sbj->srb", u.astype(np.int64), qb).astype(np.int32)


def int_matvec(qtype: str, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``W . x[s]`` the integer way, ``float32 (B, rows)``: block after block in order,
    ``acc + (d * dx) * float(S - off * sx)`` (Q4_1: ``acc + ((d * dx) * float(S) + m * mx)``)."""
    u, d, m = int_codes(qtype, w)
    q, dx, sx, mx = quantize_q8(x)
    S = int_block_sums(u, q)
    off = INT_OFFSET[qtype]
    acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for b in range(u.shape[1]):
        scale = d[None, :, b] * dx[:, b, None]
        if qtype == "Q4_1":
            acc = acc + (scale * S[:, :, b].astype(np.float32) + m[None, :, b] * mx[:, b, None])
        else:
            acc = acc + scale * (S[:, :, b] - off * sx[:, b, None]).astype(np.float32)
    return acc


def int_error_bound(dense: np.ndarray, x: np.ndarray, mins: np.ndarray | None = None) -> np.ndarray:
    """How far the integer product may be from ``dense . x`` through the 8-bit activations'
    rounding alone, ``(B, rows)``: half a step per element, ``|w| * d / 2``; the scale stored as a
    half, ``|w| * |q| * |half(d) - d|``; and, given a Q4_1 matrix's ``mins (rows, blocks)``, its
    min term stored as a half, ``|m| * |half(d * sx) - d * sx|`` per block."""
    q, d, sx = quantize_q8_exact(x)
    dh = d.astype(np.float16).astype(np.float64)
    d64 = d.astype(np.float64)
    absw = np.abs(dense.astype(np.float64))
    per_elem = np.repeat(d64, 32, axis=1) / 2 + np.abs(q.astype(np.float64)) * np.repeat(np.abs(dh - d64), 32, axis=1)
    bound = per_elem @ absw.T
    if mins is not None:
        ms = (d * sx.astype(np.float32)).astype(np.float64)
        ms_err = np.abs(ms.astype(np.float16).astype(np.float64) - ms)  # (B, blocks)
        bound = bound + ms_err @ np.abs(mins.astype(np.float64)).T
    return bound


def pack(qtype: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tile layout of ``qint.PackedMatrix`` for GGUF matrix ``w``: ``qs (tiles, blocks, 64 * groups)``
    (group ``g``, lane ``r``: 4 bytes of row ``16t + r``; Q4: the stored ``qs[4g : 4g + 4]``; Q8_0:
    the int8 elements ``4g .. 4g + 3`` plus 128), f16 bits ``d`` and ``m (tiles, blocks, 16)``;
    rows past the end are zero."""
    b = _blocks(w, qtype)
    rows, nb = b.shape[:2]
    tiles = -(-rows // LANES)
    pad = np.zeros((tiles * LANES, nb, b.shape[2]), np.uint8)
    pad[:rows] = b
    if qtype == "Q8_0":
        quants = pad[..., 2:34] ^ np.uint8(128)
        quants[rows:] = 0
    else:
        quants = pad[..., 4:20] if qtype == "Q4_1" else pad[..., 2:18]
    groups = quants.shape[-1] // 4
    qs = quants.reshape(tiles, LANES, nb, groups, 4).transpose(0, 2, 3, 1, 4).reshape(tiles, nb, groups * 64)
    d = np.ascontiguousarray(pad[..., 0:2]).view("<u2")[..., 0].reshape(tiles, LANES, nb).transpose(0, 2, 1)
    m = np.ascontiguousarray(pad[..., 2:4]).view("<u2")[..., 0].reshape(tiles, LANES, nb).transpose(0, 2, 1)
    return np.ascontiguousarray(qs), np.ascontiguousarray(d), np.ascontiguousarray(m if qtype == "Q4_1" else m[:0])
