"""numba kernels of the transformer block other than the matrix products.

All write into output arguments; shapes are given as ``(tokens, features)``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from . import simd
from .quant import dequant_row_inline

_JIT = dict(cache=True, nogil=True)
_FAST = {"reassoc", "contract", "nsz", "arcp"}


@njit(**_JIT)
def rmsnorm(x, weight, eps, out):
    """``out[t] = x[t] / rms(x[t]) * weight`` for every row ``t``.  No fast-math: the sum of
    squares runs 16 lanes wide in the source's order, so it is the same in every build (the
    integer kernels normalize their input with it)."""
    ntok, d = x.shape
    d16 = d - d % 16
    for t in range(ntok):
        row = x[t]
        a = simd.fsplat(np.float32(0.0))
        for i in range(0, d16, 16):
            v = simd.fload(row, i)
            a = simd.fadd(a, simd.fmul(v, v))
        ss = simd.fhsum(a)
        for i in range(d16, d):
            ss += row[i] * row[i]
        scale = np.float32(1.0 / math.sqrt(ss / d + eps))
        for i in range(d):
            out[t, i] = x[t, i] * scale * weight[i]


def rope_tables(n_pos: int, rot_dims: int, base: float, freq_factors=None):
    """cos/sin of ``pos * base**(-2i/rot_dims)`` for every position, shape ``(n_pos, rot_dims // 2)``."""
    inv = base ** (-np.arange(0, rot_dims, 2, dtype=np.float64) / rot_dims)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@njit(inline="always", **_JIT)
def rope_row(row, off, n_heads, head_dim, rot_dims, p, cos, sin):
    """Rotate adjacent pairs ``(2i, 2i+1)`` of heads ``0 .. n_heads - 1`` starting at ``row[off]``
    by position ``p``, in place."""
    half = rot_dims // 2
    for h in range(n_heads):
        base = off + h * head_dim
        for i in range(half):
            a = row[base + 2 * i]
            b = row[base + 2 * i + 1]
            c = cos[p, i]
            s = sin[p, i]
            row[base + 2 * i] = a * c - b * s
            row[base + 2 * i + 1] = a * s + b * c


@njit(**_JIT)
def rope(x, n_heads, head_dim, rot_dims, pos0, cos, sin):
    """Rotate adjacent pairs ``(2i, 2i+1)`` of each head in place (GGML's normal RoPE mode,
    which GGUF's llama arch relies on: its Q/K rows are permuted to match); row ``t`` of ``x``
    is position ``pos0 + t``."""
    for t in range(x.shape[0]):
        rope_row(x[t], 0, n_heads, head_dim, rot_dims, pos0 + t, cos, sin)


@njit(parallel=True, fastmath=_FAST, **_JIT)
def attention(q, k_cache, v_cache, pos0, n_heads, n_kv_heads, head_dim, out):
    """Causal grouped-query attention of ``q`` (tokens at ``pos0 ...``) over the cache.

    ``k_cache``/``v_cache`` are ``(context, kv_dim)`` and already hold positions
    ``0 .. pos0 + tokens - 1``; query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)``.
    """
    ntok = q.shape[0]
    group = n_heads // n_kv_heads
    scale = np.float32(1.0 / math.sqrt(head_dim))
    for task in prange(n_heads * ntok):
        h = task % n_heads
        t = task // n_heads
        kv = (h // group) * head_dim
        qo = h * head_dim
        n = pos0 + t + 1
        scores = np.empty(n, np.float32)
        qh = q[t, qo:qo + head_dim]
        best = np.float32(-np.inf)
        for p in range(n):
            s = np.float32(0.0)
            kp = k_cache[p, kv:kv + head_dim]
            for i in range(head_dim):
                s += qh[i] * kp[i]
            s *= scale
            scores[p] = s
            if s > best:
                best = s
        total = np.float32(0.0)
        for p in range(n):
            e = np.float32(math.exp(scores[p] - best))
            scores[p] = e
            total += e
        acc = np.zeros(head_dim, np.float32)  # local: no aliasing with the cache, so it vectorizes
        for p in range(n):
            wgt = scores[p]
            vp = v_cache[p, kv:kv + head_dim]
            for i in range(head_dim):
                acc[i] += wgt * vp[i]
        inv = np.float32(1.0) / total
        for i in range(head_dim):
            out[t, qo + i] = acc[i] * inv


@njit(fastmath=_FAST, **_JIT)
def silu_mul(gate, up):
    """``gate = silu(gate) * up`` in place (SwiGLU)."""
    ntok, d = gate.shape
    for t in range(ntok):
        for i in range(d):
            g = gate[t, i]
            gate[t, i] = g / (np.float32(1.0) + np.float32(math.exp(-g))) * up[t, i]


def _embed_kernel(qtype: int):
    """``embed`` for tables of one block type: ``qtype`` a constant, so numba compiles ``dequant_row``'s branch of
    that type alone, inlined with its fast-math flags (every branch took ~10 s of a first run's compiling)."""

    def embed_rows(table, tokens, out):
        if out.shape[0] < tokens.shape[0]:
            raise ValueError("embed: out has fewer rows than there are tokens")
        for t in range(tokens.shape[0]):
            dequant_row_inline(qtype, table, tokens[t], out[t])

    embed_rows.__name__ = embed_rows.__qualname__ = f"embed_{qtype}"
    return njit(fastmath=_FAST, **_JIT)(embed_rows)


_EMBED: dict[int, object] = {}


def embed(qtype, table, tokens, out):
    """Rows ``tokens`` of the (quantized) embedding table, as float32 ``out (tokens, d)``."""
    kernel = _EMBED.get(qtype)
    if kernel is None:
        kernel = _EMBED.setdefault(qtype, _embed_kernel(int(qtype)))
    kernel(table, tokens, out)


@njit(fastmath=_FAST, **_JIT)
def add_into(x, y):
    """``x += y`` (residual connection)."""
    ntok, d = x.shape
    for t in range(ntok):
        for i in range(d):
            x[t, i] += y[t, i]
