"""The cache and attention part of ``Model.step_layer``: B rows in one call, and the packed
layers of a step in one call.

The rows' q, k and v come out of one product as ``qkv (B, q_dim + 2 * kv_dim)``: one token each
of B sequences, each with its own KV cache and position, or B tokens of one sequence at
consecutive positions.  ``cache_attend`` applies RoPE to each row's q and k, writes its k and v
into its cache at its position (as halves), then runs causal grouped-query attention for every
(row, head) pair in one parallel loop, the softmax's exponentials on ``qint.exp_f32``
(vectorized, 1.3 ulp) instead of ``math.exp``, every sum in the source's order (no fast-math).
A row's numbers do not depend on the other rows, so a sequence alone gets what it gets in a
batch, and a prompt's token what it gets as a decode step.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import simd
from .ops import rope_row
from .qint import KINDS, LANES, MAX_BATCH, PREP_NONE, PREP_RMSNORM, PREP_SWIGLU, exp_f32, path_jit, qmatvec
from .quant import F16_TABLE

_JIT = dict(cache=True, nogil=True)
#: Caches per ``cache_attend`` call (the most sequences a decode step batches).
CACHE_SLOTS = MAX_BATCH


# -- 64-wide vectors: four F32x16 in a tuple --------------------------------------------------------


@njit(inline="always", **_JIT)
def load64(a, i):
    """The 64 float32 of ``a`` from (flat) element ``i``, as four vectors."""
    return simd.fload(a, i), simd.fload(a, i + 16), simd.fload(a, i + 32), simd.fload(a, i + 48)


@njit(inline="always", **_JIT)
def widen64(h, i):
    """The 64 halves (uint16 bits) of ``h`` from (flat) element ``i`` as float32, four vectors."""
    return simd.fhalves(h, i), simd.fhalves(h, i + 16), simd.fhalves(h, i + 32), simd.fhalves(h, i + 48)


@njit(inline="always", **_JIT)
def dot64(q, k):
    """The lane products of ``q`` and ``k`` added in order: ``((q0 k0 + q1 k1) + q2 k2) + q3 k3`` (a vector)."""
    a = simd.fmul(q[0], k[0])
    a = simd.fadd(a, simd.fmul(q[1], k[1]))
    a = simd.fadd(a, simd.fmul(q[2], k[2]))
    return simd.fadd(a, simd.fmul(q[3], k[3]))


@njit(inline="always", **_JIT)
def madd64(a, x, v):
    """``a + x * v`` for each of the four vectors (``x`` one vector: a weight in every lane)."""
    return (simd.fadd(a[0], simd.fmul(x, v[0])), simd.fadd(a[1], simd.fmul(x, v[1])),
            simd.fadd(a[2], simd.fmul(x, v[2])), simd.fadd(a[3], simd.fmul(x, v[3])))


@njit(inline="always", **_JIT)
def store64(out, o, a, scale):
    """``a * scale`` (``scale`` a float32) into ``out[o : o + 64]``."""
    s = simd.fsplat(scale)
    simd.fstore(out, o, simd.fmul(a[0], s))
    simd.fstore(out, o + 16, simd.fmul(a[1], s))
    simd.fstore(out, o + 32, simd.fmul(a[2], s))
    simd.fstore(out, o + 48, simd.fmul(a[3], s))


@njit(inline="always", error_model="numpy", **_JIT)
def _softmax_weights(scores, n, best):
    """``scores[:n] = exp(scores - best)``; returns their sum (16 lanes, then the tail, in order)."""
    for p in range(n):
        scores[p] = exp_f32(scores[p] - best)
    t = simd.fsplat(np.float32(0.0))
    n16 = n - n % LANES
    for p in range(0, n16, LANES):
        t = simd.fadd(t, simd.fload(scores, p))
    total = simd.fhsum(t)
    for p in range(n16, n):
        total += scores[p]
    return total


@njit(inline="always", error_model="numpy", **_JIT)
def _head64(q, qo, kc, vc, kvo, n, scale, out, scores):
    """``_head`` for 64-wide heads: q's four vectors and the output's four accumulators stay in
    registers; every sum is ``_head``'s, in its order, so the numbers are the same."""
    kv = kc.shape[1]
    zero = simd.fsplat(np.float32(0.0))
    qv = load64(q, qo)
    best = np.float32(-np.inf)
    for p in range(n):
        k = widen64(kc, p * kv + kvo)
        a = simd.fadd(zero, simd.fmul(qv[0], k[0]))
        a = simd.fadd(simd.fadd(simd.fadd(a, simd.fmul(qv[1], k[1])), simd.fmul(qv[2], k[2])), simd.fmul(qv[3], k[3]))
        sc = simd.fhsum(a) * scale
        scores[p] = sc
        best = sc if sc > best else best
    inv = np.float32(1.0) / _softmax_weights(scores, n, best)
    store64(out, qo, _values(scores, vc, kvo, n), inv)


@njit(inline="always", error_model="numpy", **_JIT)
def _values(w, vc, kvo, n):
    """``sum_p w[p] * V[p]`` over positions ``0 .. n - 1`` of the KV head at columns ``kvo ..`` (64 wide), in order."""
    kv = vc.shape[1]
    z = simd.fsplat(np.float32(0.0))
    a = (z, z, z, z)
    for p in range(n):
        a = madd64(a, simd.fsplat(w[p]), widen64(vc, p * kv + kvo))
    return a


#: Fewest (row, KV head) tasks for which ``cache_attend`` gives each task a whole group of query heads (below it, a
#: decode step's few tasks would leave a core idle: a task per head instead, with the same numbers).
GROUP_TASKS = 12
#: Positions scored per block in ``_group64``: their dot products are summed across lanes together (``simd.fsum16``).
BLOCK = 16


@njit(inline="always", error_model="numpy", **_JIT)
def _values3(w, vc, kvo, n, inv, out, qo):
    """``_group64``'s weighted sums of V for three heads at once (weights ``w[h, :n]``, scaled by ``inv[h]``): the
    twelve accumulators stay in registers and each position's V is widened once; every head's adds are
    ``_head64``'s, in its order."""
    kv = vc.shape[1]
    z = simd.fsplat(np.float32(0.0))
    a, b, c = (z, z, z, z), (z, z, z, z), (z, z, z, z)
    wa, wb, wc = w[0], w[1], w[2]
    for p in range(n):
        v = widen64(vc, p * kv + kvo)
        a = madd64(a, simd.fsplat(wa[p]), v)
        b = madd64(b, simd.fsplat(wb[p]), v)
        c = madd64(c, simd.fsplat(wc[p]), v)
    store64(out, qo, a, inv[0])
    store64(out, qo + 64, b, inv[1])
    store64(out, qo + 128, c, inv[2])


# Not inlined, like ``_head``: every caller runs this one compiled function.
@njit(error_model="numpy", **_JIT)
def _group64(q, qo, group, kc, vc, kvo, n, scale, out):
    """``_head64`` for the ``group`` query heads at ``q[qo:]`` (64 wide, consecutive) that share the KV head at
    columns ``kvo .. kvo + 64``, with the same numbers: each position's K is widened once for the group, and the
    dot products' lanes are summed 16 positions at a time (``simd.fsum16``, ``fhsum``'s adds in its order) with the
    scale and the running maximum on vectors.  A head's numbers depend only on its q and the cache, never on the
    other heads of the group or on other rows."""
    kv = kc.shape[1]
    nb = (n + BLOCK - 1) // BLOCK
    scores = np.empty((group, nb * BLOCK), np.float32)
    dots = np.empty((group, BLOCK * LANES), np.float32)  # a block's per-position lane products, per head
    best = np.empty((group, LANES), np.float32)
    vscale = simd.fsplat(scale)
    for h in range(group):
        simd.fstore(best[h], 0, simd.fsplat(np.float32(-np.inf)))
    for b in range(nb):
        p0 = b * BLOCK
        for i in range(BLOCK):
            base = min(p0 + i, n - 1) * kv + kvo  # past the end: the last position again (its score is a duplicate)
            k = widen64(kc, base)
            for h in range(group):  # (_head64 adds the first product to +0.0: the same score once summed)
                simd.fstore(dots[h], i * LANES, dot64(load64(q, qo + h * 64), k))
        for h in range(group):
            sc = simd.fmul(simd.fsum16(dots[h], 0), vscale)
            simd.fstore(scores[h], p0, sc)
            simd.fstore(best[h], 0, simd.fmax(simd.fload(best[h], 0), sc))
    inv = np.empty(group, np.float32)
    for h in range(group):
        inv[h] = np.float32(1.0) / _softmax_weights(scores[h], n, simd.fhmax(simd.fload(best[h], 0)))
    if group == 3:  # (SmolLM2, Llama 3.2 3B) each position's V widened once for the three heads
        _values3(scores, vc, kvo, n, inv, out, qo)
        return
    for h in range(group):
        store64(out, qo + h * 64, _values(scores[h], vc, kvo, n), inv[h])


# Not inlined: every caller (any batch size, one cache or several) runs this one compiled
# function, so a row's result cannot depend on where it was called from.  No fast-math: the
# sums run 16 lanes wide on ``simd``'s vectors, whose order is the source's, so the numbers do
# not depend on what LLVM chose to vectorize in one build or another.
@njit(error_model="numpy", **_JIT)
def _head(q, qo, kc, vc, kvo, n, head_dim, scale, out):
    """``out[qo : qo + head_dim] = softmax(K qh * scale) V`` with ``qh = q[qo : qo + head_dim]``
    (``q``, ``out``: one row's q and attention output), over positions ``0 .. n - 1`` of one KV
    head (columns ``kvo .. kvo + head_dim`` of ``kc``/``vc``: ``(context, kv_dim)`` halves)."""
    kv = kc.shape[1]
    scores = np.empty(n, np.float32)
    nv = head_dim // LANES
    rest = nv * LANES
    best = np.float32(-np.inf)
    if head_dim == 4 * LANES:  # 64 (SmolLM2, Llama 3.2 1B/3B): the same sums with q and the output in registers
        return _head64(q, qo, kc, vc, kvo, n, scale, out, scores)
    for p in range(n):
        base = p * kv + kvo
        a = simd.fsplat(np.float32(0.0))
        for j in range(nv):
            a = simd.fadd(a, simd.fmul(simd.fload(q, qo + j * LANES), simd.fhalves(kc, base + j * LANES)))
        s = simd.fhsum(a)
        for i in range(rest, head_dim):
            s += q[qo + i] * F16_TABLE[kc[p, kvo + i]]
        s *= scale
        scores[p] = s
        best = s if s > best else best
    inv = np.float32(1.0) / _softmax_weights(scores, n, best)
    acc = np.zeros(head_dim, np.float32)
    for p in range(n):
        wgt = simd.fsplat(scores[p])
        base = p * kv + kvo
        for j in range(nv):
            o = j * LANES
            simd.fstore(acc, o, simd.fadd(simd.fload(acc, o), simd.fmul(wgt, simd.fhalves(vc, base + o))))
        for i in range(rest, head_dim):
            acc[i] += scores[p] * F16_TABLE[vc[p, kvo + i]]
    for i in range(head_dim):
        out[qo + i] = acc[i] * inv


def _cache_attend(width: str):
    """``cache_attend`` for heads ``width`` wide: ``"64"`` (SmolLM2, Llama 3.2: ``_group64`` only) or ``"any"``
    (``_head``, a task per row and head).  numba drops the other width's branch (its dead-branch pruning, on a
    constant), so a 64-wide model never compiles ``_head``: in the parallel loop each kernel called costs ~1 s of a
    first run's compiling."""

    def cache_attend(qkv, k_caches, v_caches, n_caches, layer, positions, n_heads, n_kv_heads, head_dim, rot_dims, cos,
                     sin, att):
        """Row ``r`` of ``qkv`` is a token at ``positions[r]``: its q and k are rotated (RoPE by the
        ``cos``/``sin`` tables, ``ops.rope``'s arithmetic) in place, its k and v (as halves) go into
        ``k_caches[c][layer, pos]`` / ``v_caches[c][layer, pos]`` and its attention over that cache
        into ``att[r]``; ``c = r`` when ``n_caches`` > 1 (one sequence per row), else 0 (the rows are one
        sequence's tokens: all are written before any attends, each attends up to its own position).
        Caches are ``(layers, context, kv_dim)``; the tuples always hold ``CACHE_SLOTS`` (unused ones
        repeat the first), so that every call runs one compiled function and a row's numbers are
        the same whatever the batch."""
        B = qkv.shape[0]
        qd = n_heads * head_dim
        kv = n_kv_heads * head_dim
        for r in range(B):
            c = r if n_caches > 1 else 0
            kc, vc = k_caches[c][layer], v_caches[c][layer]
            pos = positions[r]
            rope_row(qkv[r], 0, n_heads, head_dim, rot_dims, pos, cos, sin)
            rope_row(qkv[r], qd, n_kv_heads, head_dim, rot_dims, pos, cos, sin)
            for j in range(kv):
                kc[pos, j] = simd.half_bits(qkv[r, qd + j])
                vc[pos, j] = simd.half_bits(qkv[r, qd + kv + j])
        group = n_heads // n_kv_heads
        scale = np.float32(1.0 / math.sqrt(head_dim))
        # 64-wide heads with many rows: a task per row and KV head (its query heads read the cache once); else a task
        # per head, so that the threads share a decode step's few rows evenly (the same numbers either way).  One
        # parallel loop: each one more costs seconds of a first run's compiling.
        by_group = width == "64" and B * n_kv_heads >= GROUP_TASKS
        per_row = n_kv_heads if by_group else n_heads
        for task in prange(B * per_row):
            r = task // per_row
            i = task % per_row
            c = r if n_caches > 1 else 0
            keys, values = k_caches[c][layer], v_caches[c][layer]
            n = positions[r] + 1
            if width == "any":  # (64-wide heads too, through _head64: _group64's bits)
                _head(qkv[r], i * head_dim, keys, values, (i // group) * head_dim, n, head_dim, scale, att[r])
            elif by_group:
                _group64(qkv[r], i * group * head_dim, group, keys, values, i * head_dim, n, scale, att[r])
            else:
                _group64(qkv[r], i * head_dim, np.int64(1), keys, values, (i // group) * head_dim, n, scale, att[r])

    return path_jit(cache_attend, width, parallel=True)


#: The head widths with an attention kernel of their own.
WIDTHS = ("64", "any")
#: ``cache_attend`` of each head width (``head_width``); none compiled before its first call.
ATTEND = {width: _cache_attend(width) for width in WIDTHS}
cache_attend_64, cache_attend_any = ATTEND["64"], ATTEND["any"]


def head_width(head_dim: int) -> str:
    """The head width whose kernels run heads ``head_dim`` wide (a key of ``ATTEND`` and of ``LAYERS``)."""
    return "64" if head_dim == 4 * LANES else "any"


def cache_attend(qkv, k_caches, v_caches, n_caches, layer, positions, n_heads, n_kv_heads, head_dim, rot_dims, cos, sin,
                 att):
    """``ATTEND[head_width(head_dim)]``'s ``cache_attend`` on these arguments (from Python: the layer stack calls its
    width's own)."""
    attend = ATTEND[head_width(head_dim)]
    attend(qkv, k_caches, v_caches, n_caches, layer, positions, n_heads, n_kv_heads, head_dim, rot_dims, cos, sin, att)


# -- packed layers in one call ---------------------------------------------------------------------
# Model.layers' fast path: blocks lo .. hi - 1, each its five calls (q|k|v, cache_attend, wo,
# gate|up, down) from inside numba, so a decode step enters numba once for all its layers.  The
# weights are the stacks of ``PackedWeights.stack`` (a leading layer axis).  One function, compiled
# per integer-kernel path (``qint.qmatvec(kind, ...)`` is that path's kernel): only the path the
# CPU runs is ever compiled.  The products without a norm get a norm and ``xb`` all the same
# (unused there): numba's own constant arrays would be read-only.


def _layers(kind: str, width: str):
    def layers(lo, hi, x, xb, qkv, att, gu, aq, ad, as_, am, t0, qs0, d0, m0, t1, qs1, d1, m1, t2, qs2, d2, m2,
               t3, qs3, d3, m3, attn_norms, ffn_norms, eps, k_caches, v_caches, n_caches, positions, n_heads, n_kv_heads,
               head_dim, rot_dims, cos, sin):
        """Blocks ``lo .. hi - 1`` on rows ``x`` with the path's ``qint`` kernel: the stacks ``(qtype, qs, d, m)``
        of q|k|v, wo, gate|up and down in that order, the norms ``(layers, d_model)``; ``xb, qkv, att,
        gu`` the step's scratch and ``aq, ad, as_, am`` its quantized activations."""
        for i in range(lo, hi):
            qmatvec(kind, t0, qs0[i], d0[i], m0[i], x, PREP_RMSNORM, attn_norms[i], eps, xb, aq, ad, as_, am, qkv, False)
            if width == "64":
                cache_attend_64(qkv, k_caches, v_caches, n_caches, i, positions, n_heads, n_kv_heads, head_dim, rot_dims,
                                cos, sin, att)
            else:
                cache_attend_any(qkv, k_caches, v_caches, n_caches, i, positions, n_heads, n_kv_heads, head_dim, rot_dims,
                                 cos, sin, att)
            qmatvec(kind, t1, qs1[i], d1[i], m1[i], att, PREP_NONE, attn_norms[i], 0.0, xb, aq, ad, as_, am, x, True)
            qmatvec(kind, t2, qs2[i], d2[i], m2[i], x, PREP_RMSNORM, ffn_norms[i], eps, xb, aq, ad, as_, am, gu, False)
            qmatvec(kind, t3, qs3[i], d3[i], m3[i], gu, PREP_SWIGLU, ffn_norms[i], 0.0, xb, aq, ad, as_, am, x, True)

    return path_jit(layers, kind if width == "64" else f"{kind}_{width}")


#: The layer stack's function of each integer-kernel path and head width (``LAYERS[kind, width]``; none compiled
#: before its first call).
LAYERS = {(kind, w): _layers(kind, w) for kind in KINDS for w in WIDTHS}


def cache_tuples(states) -> tuple[tuple, tuple, int]:
    """``cache_attend``'s cache arguments for ``states`` (at most ``CACHE_SLOTS``)."""
    ks = tuple(s.k_cache for s in states)
    vs = tuple(s.v_cache for s in states)
    pad = CACHE_SLOTS - len(ks)
    return ks + ks[:1] * pad, vs + vs[:1] * pad, len(ks)
