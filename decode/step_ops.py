"""The attention half of a decode step as one numba call per sequence (``ops``' kernels, fused).

A decode step's q, k and v come out of one product as a row of ``qkv (B, q_dim + 2 * kv_dim)``;
``attend`` rotates that row's q and k (``ops.rope``), writes its k and v into the sequence's
cache at its position and runs ``ops.attention`` over positions ``0 .. pos``, so that the step
makes one call here per sequence and layer instead of five.
"""

from __future__ import annotations

from numba import njit

from .ops import attention, rope

_JIT = dict(cache=True, nogil=True)


@njit(**_JIT)
def attend(qkv, r, k_cache, v_cache, layer, pos, n_heads, n_kv_heads, head_dim, rot_dims, cos, sin, att):
    """Row ``r`` of ``qkv`` is one token at ``pos``: RoPE on its q and k, k and v into
    ``k_cache[layer, pos]`` / ``v_cache[layer, pos]`` (caches ``(layers, context, kv_dim)``), and its
    attention over the cache into ``att[r]``."""
    qd = n_heads * head_dim
    kv = n_kv_heads * head_dim
    row = qkv[r]
    q = row[:qd].reshape((1, qd))  # contiguous views (numba keeps them 'C': the loops vectorize)
    k = row[qd:qd + kv].reshape((1, kv))
    rope(q, n_heads, head_dim, rot_dims, pos, cos, sin)
    rope(k, n_kv_heads, head_dim, rot_dims, pos, cos, sin)
    kc, vc = k_cache[layer], v_cache[layer]
    for j in range(kv):
        kc[pos, j] = qkv[r, qd + j]
        vc[pos, j] = qkv[r, qd + kv + j]
    attention(q, kc, vc, pos, n_heads, n_kv_heads, head_dim, att[r].reshape((1, qd)))
