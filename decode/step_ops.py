"""The cache and attention part of ``Model.step_layer``: B rows in one call.

The rows' q, k and v come out of one product as ``qkv (B, q_dim + 2 * kv_dim)`` (RoPE already
applied): one token each of B sequences, each with its own KV cache and position, or B tokens of
one sequence at consecutive positions.  ``cache_attend`` writes each row's k and v into its cache
at its position, then runs causal grouped-query attention for every (row, head) pair in one
parallel loop, the softmax's exponentials on ``qint.exp_f32`` (vectorized, 1.3 ulp) instead of
``math.exp``.  A row's numbers do not depend on the other rows, so a sequence alone gets what it
gets in a batch, and a prompt's token what it gets as a decode step.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .qint import MAX_BATCH, exp_f32

_JIT = dict(cache=True, nogil=True)
#: Caches per ``cache_attend`` call (the most sequences a decode step batches).
CACHE_SLOTS = MAX_BATCH
_FAST = {"reassoc", "contract", "nsz", "arcp"}


# Not inlined: every caller (any batch size, one cache or several) runs this one compiled
# function, so a row's result cannot depend on where it was called from.
@njit(fastmath=_FAST, error_model="numpy", **_JIT)
def _head(qh, kc, vc, kvo, n, head_dim, scale, out):
    """``out = softmax(K qh * scale) V`` over positions ``0 .. n - 1`` of one KV head (columns
    ``kvo .. kvo + head_dim`` of ``kc``/``vc``)."""
    scores = np.empty(n, np.float32)
    best = np.float32(-np.inf)
    for p in range(n):
        s = np.float32(0.0)
        kp = kc[p, kvo:kvo + head_dim]  # a slice, not kc[p, kvo + i]: only so does the loop vectorize
        for i in range(head_dim):
            s += qh[i] * kp[i]
        s *= scale
        scores[p] = s
        best = s if s > best else best
    total = np.float32(0.0)
    for p in range(n):
        e = exp_f32(scores[p] - best)
        scores[p] = e
        total += e
    acc = np.zeros(head_dim, np.float32)  # local: no aliasing with the cache, so it vectorizes
    for p in range(n):
        wgt = scores[p]
        vp = vc[p, kvo:kvo + head_dim]
        for i in range(head_dim):
            acc[i] += wgt * vp[i]
    inv = np.float32(1.0) / total
    for i in range(head_dim):
        out[i] = acc[i] * inv


@njit(parallel=True, fastmath=_FAST, **_JIT)
def cache_attend(qkv, k_caches, v_caches, n_caches, layer, positions, n_heads, n_kv_heads, head_dim, att):
    """Row ``r`` of ``qkv`` is a token at ``positions[r]``: its k and v go into
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
        for j in range(kv):
            kc[pos, j] = qkv[r, qd + j]
            vc[pos, j] = qkv[r, qd + kv + j]
    group = n_heads // n_kv_heads
    scale = np.float32(1.0 / math.sqrt(head_dim))
    for task in prange(B * n_heads):
        r = task // n_heads
        h = task % n_heads
        c = r if n_caches > 1 else 0
        qo = h * head_dim
        _head(qkv[r, qo:qo + head_dim], k_caches[c][layer], v_caches[c][layer], (h // group) * head_dim,
              positions[r] + 1, head_dim, scale, att[r, qo:qo + head_dim])


def cache_tuples(states) -> tuple[tuple, tuple, int]:
    """``cache_attend``'s cache arguments for ``states`` (at most ``CACHE_SLOTS``)."""
    ks = tuple(s.k_cache for s in states)
    vs = tuple(s.v_cache for s in states)
    pad = CACHE_SLOTS - len(ks)
    return ks + ks[:1] * pad, vs + vs[:1] * pad, len(ks)
