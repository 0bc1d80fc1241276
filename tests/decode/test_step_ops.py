"""``decode/step_ops.cache_attend`` against a float64 NumPy reference: each row's q and k rotated
(RoPE) at its position, its k and v written there in its cache (and nowhere else), causal
grouped-query attention up to that position; one sequence's rows at consecutive positions share a
cache; a batch of rows gives each row what it gets alone.  Most cases use identity rotation tables
(cos 1, sin 0), so the attention is checked on the rows as given; one case checks the rotation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decode.ops import rope, rope_tables
from decode.step_ops import CACHE_SLOTS, cache_attend

N_HEADS, N_KV, HEAD_DIM, LAYERS, CTX = 9, 3, 64, 2, 64
QD, KV = N_HEADS * HEAD_DIM, N_KV * HEAD_DIM


def half(a: np.ndarray) -> np.ndarray:
    """float32 values as the cache holds them: the nearest halves (ties to even), as uint16 bits."""
    return np.asarray(a, np.float32).astype(np.float16).view(np.uint16)


def attention_ref(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, n: int, n_heads=N_HEADS, n_kv=N_KV, head_dim=HEAD_DIM) -> np.ndarray:
    kc, vc = (c.view(np.float16).astype(np.float64) for c in (kc, vc))
    out = np.zeros(n_heads * head_dim)
    for h in range(n_heads):
        kvo = (h // (n_heads // n_kv)) * head_dim
        scores = kc[:n, kvo:kvo + head_dim] @ q[h * head_dim:(h + 1) * head_dim] / np.sqrt(head_dim)
        w = np.exp(scores - scores.max())
        out[h * head_dim:(h + 1) * head_dim] = (w / w.sum()) @ vc[:n, kvo:kvo + head_dim]
    return out


def case(batch: int, seed: int):
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((batch, QD + 2 * KV), dtype=np.float32)
    kcs = tuple(half(rng.standard_normal((LAYERS, CTX, KV), dtype=np.float32)) for _ in range(batch))
    vcs = tuple(half(rng.standard_normal((LAYERS, CTX, KV), dtype=np.float32)) for _ in range(batch))
    positions = np.array([0, 5, 63, 17][:batch], np.int64)
    return qkv, kcs, vcs, positions


IDENTITY = (np.ones((CTX, HEAD_DIM // 2), np.float32), np.zeros((CTX, HEAD_DIM // 2), np.float32))


def run(qkv, kcs, vcs, positions, layer=1, tables=IDENTITY):
    """``cache_attend`` with one cache per row, or one shared by all rows (a 1-tuple)."""
    att = np.full((qkv.shape[0], QD), np.nan, np.float32)
    pad = CACHE_SLOTS - len(kcs)
    cos, sin = tables
    cache_attend(qkv, kcs + kcs[:1] * pad, vcs + vcs[:1] * pad, len(kcs), layer, positions, N_HEADS, N_KV, HEAD_DIM,
                 HEAD_DIM, cos, sin, att)
    return att


@pytest.mark.parametrize("batch", [1, 2, 4])
def test_cache_attend_matches_reference(batch):
    qkv, kcs, vcs, positions = case(batch, batch)
    before = [(k.copy(), v.copy()) for k, v in zip(kcs, vcs, strict=True)]
    att = run(qkv, kcs, vcs, positions)
    for r, pos in enumerate(positions):
        kc, vc = kcs[r][1], vcs[r][1]
        np.testing.assert_array_equal(kc[pos], half(qkv[r, QD:QD + KV]))  # the cache holds halves
        np.testing.assert_array_equal(vc[pos], half(qkv[r, QD + KV:]))
        k_was, v_was = before[r]
        others = np.arange(CTX) != pos
        np.testing.assert_array_equal(kc[others], k_was[1][others])  # nothing else written
        np.testing.assert_array_equal(vc[others], v_was[1][others])
        np.testing.assert_array_equal(kcs[r][0], k_was[0])  # nor another layer
        np.testing.assert_allclose(att[r], attention_ref(qkv[r, :QD], kc, vc, pos + 1), rtol=1e-4, atol=1e-5)


def test_one_sequences_rows_share_its_cache_causally():
    """Five prompt tokens at positions 10..14 of one cache: all five written, each attends to its own prefix."""
    qkv, kcs, vcs, _ = case(1, 3)
    rng = np.random.default_rng(4)
    qkv = rng.standard_normal((5, QD + 2 * KV), dtype=np.float32)
    positions = np.arange(10, 15, dtype=np.int64)
    att = run(qkv, kcs, vcs, positions)
    kc, vc = kcs[0][1], vcs[0][1]
    np.testing.assert_array_equal(kc[10:15], half(qkv[:, QD:QD + KV]))
    for r, pos in enumerate(positions):
        np.testing.assert_allclose(att[r], attention_ref(qkv[r, :QD], kc, vc, pos + 1), rtol=1e-4, atol=1e-5)
    wrong = attention_ref(qkv[0, :QD], kc, vc, 15)  # the first token seeing the later ones
    assert np.abs(att[0] - wrong).max() > 1e-3


def test_rows_do_not_depend_on_the_batch():
    qkv, kcs, vcs, positions = case(4, 9)
    copies = [(qkv[r:r + 1].copy(), (kcs[r].copy(),), (vcs[r].copy(),)) for r in range(4)]
    att = run(qkv, kcs, vcs, positions)
    for r, (q1, k1, v1) in enumerate(copies):
        np.testing.assert_array_equal(att[r], run(q1, k1, v1, positions[r:r + 1])[0])
        np.testing.assert_array_equal(kcs[r], k1[0])


def test_rows_are_rotated_at_their_own_positions():
    """With real tables each row's q and k are rotated as ``ops.rope`` rotates them at that row's
    position (in place), and the cache and attention use the rotated values."""
    qkv, kcs, vcs, positions = case(3, 21)
    tables = rope_tables(CTX, HEAD_DIM, 10000.0)
    want = qkv.copy()
    for r, pos in enumerate(positions):
        rope(want[r:r + 1, :QD], N_HEADS, HEAD_DIM, HEAD_DIM, int(pos), *tables)
        rope(want[r:r + 1, QD:QD + KV], N_KV, HEAD_DIM, HEAD_DIM, int(pos), *tables)
    assert np.abs(want - qkv).max() > 0.1  # the rotation is not the identity here
    att = run(qkv, kcs, vcs, positions, tables=tables)
    np.testing.assert_array_equal(qkv, want)
    for r, pos in enumerate(positions):
        kc, vc = kcs[r][1], vcs[r][1]
        np.testing.assert_array_equal(kc[pos], half(want[r, QD:QD + KV]))
        np.testing.assert_allclose(att[r], attention_ref(want[r, :QD], kc, vc, pos + 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head_dim", [32, 80])
def test_other_head_widths_take_the_general_path(head_dim):
    """Heads other than 64 wide (``_head``'s general loop, with a tail past the last 16 for 80)."""
    n_heads, n_kv = 4, 2
    qd, kv = n_heads * head_dim, n_kv * head_dim
    rng = np.random.default_rng(head_dim)
    qkv = rng.standard_normal((2, qd + 2 * kv), dtype=np.float32)
    kcs = tuple(half(rng.standard_normal((1, CTX, kv), dtype=np.float32)) for _ in range(2))
    vcs = tuple(half(rng.standard_normal((1, CTX, kv), dtype=np.float32)) for _ in range(2))
    positions = np.array([9, 40], np.int64)
    att = np.full((2, qd), np.nan, np.float32)
    cos, sin = np.ones((CTX, head_dim // 2), np.float32), np.zeros((CTX, head_dim // 2), np.float32)
    pad = CACHE_SLOTS - 2
    cache_attend(qkv, kcs + kcs[:1] * pad, vcs + vcs[:1] * pad, 2, 0, positions, n_heads, n_kv, head_dim, head_dim, cos, sin, att)
    for r, pos in enumerate(positions):
        np.testing.assert_array_equal(kcs[r][0, pos], half(qkv[r, qd:qd + kv]))
        want = attention_ref(qkv[r, :qd], kcs[r][0], vcs[r][0], pos + 1, n_heads, n_kv, head_dim)
        np.testing.assert_allclose(att[r], want, rtol=1e-4, atol=1e-5)


def test_grouped_attention_gives_head64s_numbers_bit_for_bit():
    """``_group64`` (a KV head's query heads together, 16 positions summed at once) against ``_head`` one head at a
    time: the same float32 bits, for groups of 1, 3 and 4 heads and for lengths around the 16-position blocks; and
    through ``cache_attend``, a sequence's rows (a task per row and KV head) give what each gets alone (a task per
    head)."""
    from numba import njit

    from decode.step_ops import GROUP_TASKS, _group64, _head

    @njit
    def per_head(q, kc, vc, n, scale, out, n_heads, group):
        for h in range(n_heads):
            _head(q, h * 64, kc, vc, (h // group) * 64, n, 64, scale, out)

    @njit
    def grouped(q, kc, vc, n, scale, out, n_heads, group):
        for g in range(n_heads // group):
            _group64(q, g * group * 64, group, kc, vc, g * 64, n, scale, out)

    rng = np.random.default_rng(7)
    for group, n_kv in ((1, 2), (3, 3), (4, 2)):
        n_heads = group * n_kv
        kc, vc = (half(rng.standard_normal((200, n_kv * 64)) * 3) for _ in range(2))
        for n in (1, 15, 16, 17, 33, 200):
            q = (rng.standard_normal(n_heads * 64) * 2).astype(np.float32)
            a, b = np.zeros(n_heads * 64, np.float32), np.ones(n_heads * 64, np.float32)
            per_head(q, kc, vc, n, np.float32(0.125), a, n_heads, group)
            grouped(q, kc, vc, n, np.float32(0.125), b, n_heads, group)
            assert np.array_equal(a.view(np.int32), b.view(np.int32)), (group, n)
    rows = GROUP_TASKS // N_KV + 1  # enough rows for a task per KV head
    qkv = rng.standard_normal((rows, QD + 2 * KV), dtype=np.float32)
    kcs, vcs = ((half(rng.standard_normal((LAYERS, CTX, KV), dtype=np.float32)),) for _ in range(2))
    together = run(qkv.copy(), kcs, vcs, np.arange(10, 10 + rows))
    for r in range(rows):
        alone = run(qkv[r:r + 1].copy(), kcs, vcs, np.array([10 + r]))
        assert np.array_equal(together[r].view(np.int32), alone[0].view(np.int32)), r


def test_a_64_wide_model_never_compiles_the_general_head():
    """The layer stack and ``cache_attend`` of 64-wide heads are their own kernels (``ATTEND["64"]``): numba drops
    ``_head``'s branch there, so a first run of SmolLM2 does not compile it (a second of compiling in the parallel
    loop).  In a fresh process: a 64-wide call runs ``ATTEND["64"]`` alone, and its numbers are the general kernel's."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import json
        import numpy as np
        from decode import step_ops
        rng = np.random.default_rng(3)
        qd, kv = 9 * 64, 3 * 64
        qkv = rng.standard_normal((2, qd + 2 * kv), dtype=np.float32)
        kc = tuple((rng.standard_normal((1, 64, kv)) * 3).astype(np.float16).view(np.uint16) for _ in range(8))
        vc = tuple((rng.standard_normal((1, 64, kv)) * 3).astype(np.float16).view(np.uint16) for _ in range(8))
        cos, sin = np.ones((64, 32), np.float32), np.zeros((64, 32), np.float32)
        pos = np.array([5, 30], np.int64)
        outs = []
        for kernel in (step_ops.cache_attend, step_ops.ATTEND["any"]):
            att = np.zeros((2, qd), np.float32)
            kernel(qkv.copy(), tuple(a.copy() for a in kc), tuple(a.copy() for a in vc), 2, 0, pos, 9, 3, 64, 64, cos,
                   sin, att)
            outs.append(att)
            if kernel is step_ops.cache_attend:
                ran = {"64": len(step_ops.ATTEND["64"].signatures), "any": len(step_ops.ATTEND["any"].signatures),
                       "head": len(step_ops._head.signatures)}
        print(json.dumps({"ran": ran, "same": bool(np.array_equal(outs[0].view(np.int32), outs[1].view(np.int32)))}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ran"] == {"64": 1, "any": 0, "head": 0}, got
    assert got["same"], got
