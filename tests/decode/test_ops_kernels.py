"""The numba kernels of ``decode/ops.py`` against straightforward NumPy references.

Covers ``rmsnorm``, ``rope_tables`` and ``rope`` (adjacent pairs ``(2i, 2i+1)``, norm kept),
``attention`` (causal grouped-query attention over a KV cache, queries at ``pos0 > 0``),
``silu_mul``, ``embed`` and ``add_into``.  References run in float64; wrong references
(half-split RoPE, a wrong KV-head mapping) must fail the same comparisons.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from quant_reference import DEQUANT, random_matrix

from decode.ops import add_into, attention, embed, rmsnorm, rope, rope_tables, silu_mul
from decode.quant import QType

RTOL = 1e-5


def assert_close(out: np.ndarray, ref: np.ndarray, rtol: float = RTOL) -> None:
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * np.abs(ref).max(initial=1.0))


def is_close(out: np.ndarray, ref: np.ndarray, rtol: float = RTOL) -> bool:
    return bool(np.allclose(out, ref, rtol=rtol, atol=rtol * np.abs(ref).max(initial=1.0)))


def randn(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


# -- references --------------------------------------------------------------------------------


def rmsnorm_ref(x, weight, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * weight


def rope_ref(x, n_heads, head_dim, rot_dims, pos0, cos, sin, pairs="adjacent"):
    """Rotate pair ``i`` of each head by angle ``pos * theta_i``; pairs are ``(2i, 2i+1)``
    (``"adjacent"``, GGML's normal mode) or ``(i, i + rot_dims/2)`` (``"split"``, NeoX mode)."""
    ntok = x.shape[0]
    y = x.astype(np.float64).reshape(ntok, n_heads, head_dim).copy()
    c = cos[pos0:pos0 + ntok, None, :].astype(np.float64)  # (tokens, 1, rot_dims/2)
    s = sin[pos0:pos0 + ntok, None, :].astype(np.float64)
    if pairs == "adjacent":
        ia, ib = np.arange(0, rot_dims, 2), np.arange(1, rot_dims, 2)
    else:
        ia, ib = np.arange(rot_dims // 2), np.arange(rot_dims // 2, rot_dims)
    a, b = y[..., ia].copy(), y[..., ib].copy()
    y[..., ia] = a * c - b * s
    y[..., ib] = a * s + b * c
    return y.reshape(ntok, -1)


def attention_ref(q, k_cache, v_cache, pos0, n_heads, n_kv_heads, head_dim, kv_head=None):
    """Per token ``t`` and head ``h``: softmax(q . K[0 .. pos0+t] / sqrt(head_dim)) @ V over KV head
    ``kv_head(h)`` (default ``h // (n_heads // n_kv_heads)``)."""
    kv_head = kv_head or (lambda h: h // (n_heads // n_kv_heads))
    ntok = q.shape[0]
    out = np.zeros((ntok, n_heads * head_dim))
    for t in range(ntok):
        n = pos0 + t + 1
        for h in range(n_heads):
            kv = slice(kv_head(h) * head_dim, (kv_head(h) + 1) * head_dim)
            qh = q[t, h * head_dim:(h + 1) * head_dim].astype(np.float64)
            scores = k_cache[:n, kv].astype(np.float64) @ qh / math.sqrt(head_dim)
            p = np.exp(scores - scores.max())
            out[t, h * head_dim:(h + 1) * head_dim] = (p / p.sum()) @ v_cache[:n, kv].astype(np.float64)
    return out


# -- rmsnorm, silu_mul, add_into ---------------------------------------------------------------


def test_rmsnorm():
    x = randn((5, 96), seed=1) * 3
    x[2] = 0.0  # an all-zero row stays finite (eps) and maps to zero
    weight = randn(96, seed=2)
    out = np.full_like(x, np.nan)
    rmsnorm(x, weight, 1e-5, out)
    assert_close(out, rmsnorm_ref(x, weight, 1e-5))
    assert (out[2] == 0).all()


def test_silu_mul():
    gate = np.random.default_rng(3).uniform(-20, 20, (3, 70)).astype(np.float32)
    gate[0, :4] = [-100.0, 100.0, 0.0, -0.0]  # exp overflows to inf for -100: the result must be -0, not NaN
    up = randn((3, 70), seed=4)
    ref = gate.astype(np.float64) / (1 + np.exp(-gate.astype(np.float64))) * up
    silu_mul(gate, up)
    assert_close(gate, ref)


def test_add_into():
    x, y = randn((4, 33), seed=5), randn((4, 33), seed=6)
    ref = x.astype(np.float64) + y
    add_into(x, y)
    assert_close(x, ref, rtol=1e-7)


# -- RoPE --------------------------------------------------------------------------------------


def test_rope_tables():
    cos, sin = rope_tables(12, 8, 500.0)
    theta = 500.0 ** (-np.arange(4) * 2 / 8)
    ang = np.arange(12)[:, None] * theta
    assert cos.shape == sin.shape == (12, 4) and cos.dtype == np.float32
    assert_close(cos, np.cos(ang), rtol=1e-6)
    assert_close(sin, np.sin(ang), rtol=1e-6)
    factors = np.array([1.0, 2.0, 4.0, 8.0])
    cos_f, sin_f = rope_tables(12, 8, 500.0, factors)
    assert_close(cos_f, np.cos(ang / factors), rtol=1e-6)
    assert_close(sin_f, np.sin(ang / factors), rtol=1e-6)


@pytest.mark.parametrize("rot_dims", [16, 8])
def test_rope_rotates_adjacent_pairs(rot_dims):
    n_heads, head_dim, pos0, ntok = 3, 16, 5, 4
    cos, sin = rope_tables(32, rot_dims, 100.0)
    x = randn((ntok, n_heads * head_dim), seed=7)
    before = x.copy()
    rope(x, n_heads, head_dim, rot_dims, pos0, cos, sin)
    assert_close(x, rope_ref(before, n_heads, head_dim, rot_dims, pos0, cos, sin))
    # the wrong pair layout (NeoX halves) does not pass
    assert not is_close(x, rope_ref(before, n_heads, head_dim, rot_dims, pos0, cos, sin, pairs="split"))
    heads, heads_before = x.reshape(ntok, n_heads, head_dim), before.reshape(ntok, n_heads, head_dim)
    # dimensions past rot_dims are untouched, and every rotated pair keeps its length
    np.testing.assert_array_equal(heads[..., rot_dims:], heads_before[..., rot_dims:])
    pair_norm = np.hypot(heads[..., 0:rot_dims:2], heads[..., 1:rot_dims:2])
    pair_norm_before = np.hypot(heads_before[..., 0:rot_dims:2], heads_before[..., 1:rot_dims:2])
    np.testing.assert_allclose(pair_norm, pair_norm_before, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(heads, axis=-1), np.linalg.norm(heads_before, axis=-1), rtol=1e-5)


def test_rope_position_zero_is_identity():
    cos, sin = rope_tables(4, 16, 10000.0)
    x = randn((1, 32), seed=8)
    before = x.copy()
    rope(x, 2, 16, 16, 0, cos, sin)
    np.testing.assert_array_equal(x, before)


# -- attention ---------------------------------------------------------------------------------

N_HEADS, N_KV_HEADS, HEAD_DIM, CONTEXT = 6, 2, 16, 16


def attention_inputs(pos0: int, ntok: int, seed: int):
    """Queries for positions ``pos0 .. pos0+ntok-1`` and a cache filled up to there (NaN beyond)."""
    q = randn((ntok, N_HEADS * HEAD_DIM), seed=seed)
    k_cache = np.full((CONTEXT, N_KV_HEADS * HEAD_DIM), np.nan, np.float32)
    v_cache = np.full_like(k_cache, np.nan)
    k_cache[:pos0 + ntok] = randn((pos0 + ntok, N_KV_HEADS * HEAD_DIM), seed=seed + 1)
    v_cache[:pos0 + ntok] = randn((pos0 + ntok, N_KV_HEADS * HEAD_DIM), seed=seed + 2)
    return q, k_cache, v_cache


def run_attention(q, k_cache, v_cache, pos0):
    out = np.full_like(q, np.nan)
    attention(q, k_cache, v_cache, pos0, N_HEADS, N_KV_HEADS, HEAD_DIM, out)
    return out


@pytest.mark.parametrize(("pos0", "ntok"), [(5, 4), (0, 3), (9, 1)])
def test_attention_matches_reference(pos0, ntok):
    q, k_cache, v_cache = attention_inputs(pos0, ntok, seed=10)
    out = run_attention(q, k_cache, v_cache, pos0)  # positions past pos0+ntok-1 are NaN: never read
    assert_close(out, attention_ref(q, k_cache, v_cache, pos0, N_HEADS, N_KV_HEADS, HEAD_DIM))
    # the wrong head grouping (query head h reading KV head h % n_kv_heads) does not pass
    wrong = attention_ref(q, k_cache, v_cache, pos0, N_HEADS, N_KV_HEADS, HEAD_DIM, kv_head=lambda h: h % N_KV_HEADS)
    assert not is_close(out, wrong)


def test_attention_is_causal():
    """Changing the newest cache position changes only the last token's output."""
    pos0, ntok = 5, 4
    q, k_cache, v_cache = attention_inputs(pos0, ntok, seed=20)
    out = run_attention(q, k_cache, v_cache, pos0)
    last = pos0 + ntok - 1
    k_cache[last] += 3.0
    v_cache[last] -= 2.0
    changed = run_attention(q, k_cache, v_cache, pos0)
    np.testing.assert_array_equal(changed[:-1], out[:-1])
    assert not is_close(changed[-1], out[-1])


def test_attention_single_position_returns_value_row():
    q, k_cache, v_cache = attention_inputs(0, 1, seed=30)
    out = run_attention(q, k_cache, v_cache, 0)
    group = N_HEADS // N_KV_HEADS
    for h in range(N_HEADS):
        kv = h // group
        assert_close(out[0, h * HEAD_DIM:(h + 1) * HEAD_DIM], v_cache[0, kv * HEAD_DIM:(kv + 1) * HEAD_DIM])


# -- embed -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("qtype", "cols"), [("F32", 64), ("F16", 64), ("Q8_0", 96), ("Q4_K", 256), ("Q6_K", 256)])
def test_embed(qtype, cols):
    table = random_matrix(qtype, 40, cols, seed=40)
    table.setflags(write=False)
    ref = DEQUANT[qtype](table)
    tokens = np.array([3, 0, 39, 3, 17], np.int64)
    out = np.full((tokens.shape[0], cols), np.nan, np.float32)
    embed(int(QType[qtype]), table, tokens, out)
    assert_close(out, ref[tokens], rtol=1e-6)
