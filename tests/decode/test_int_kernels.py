"""The integer kernels of ``decode/qint.py`` against the NumPy references of ``quant_reference.py``.

The repack against the layout written out in NumPy, the activation quantizer bit for bit, the
int32 block sums exactly, the products bit for bit (the float operations and their order per block
are fixed, with no fast-math), the reference itself against ``gguf.quants.dequantize`` within the error the 8-bit
activations allow, and the VNNI implementation against the plain one (identical numbers), on odd
shapes: rows that are no multiple of the 16-row tile, rows of 32 to 1536 elements, 1 to 8
activation rows.  A reference with the nibble halves swapped fails, which shows the tests can fail.
"""

from __future__ import annotations

import zlib
from functools import cache

import gguf
import numpy as np
import pytest
import quant_reference as ref
from quant_reference import DEQUANT, random_matrix

from decode import qint, simd
from decode.quant import QType

TYPES = ("Q4_0", "Q4_1", "Q8_0")
COLS = (32, 96, 576, 1536)
ROWS = (7, 16, 130)  # under one tile, exactly one, eight tiles and a 2-row tail
BATCH = (1, 3, 8)
#: Every path this CPU runs (plain everywhere, AVX2 on any x86-64 of the last decade, VNNI where the CPU has it): none
#: is skipped, and each test's id names the path it ran.
KINDS = list(qint.available())


def _seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


@cache
def matrix(qtype: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    w = random_matrix(qtype, rows, cols, _seed(qtype, rows, cols, seed))
    w.setflags(write=False)  # as the memory-mapped weights are
    return w


@cache
def packed(qtype: str, rows: int, cols: int) -> qint.PackedMatrix:
    return qint.pack([(QType[qtype], matrix(qtype, rows, cols))])


def activations(shape, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    x[..., :32] *= 40.0  # blocks of very different scales
    if x.shape[-1] >= 64:
        x[..., 32:64] = 0.0  # an all-zero block: scale 0
    return x


def run(kind: str, p: qint.PackedMatrix, x: np.ndarray, **kw) -> np.ndarray:
    out = kw.pop("out", None)
    out = np.full((x.shape[0], p.rows), np.nan, np.float32) if out is None else out
    qint.select(kind)(p, x, qint.Activations(p.cols, x.shape[0]), out, **kw)
    return out


# -- the layout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("qtype", TYPES)
def test_pack_is_the_tile_layout(qtype, cols, rows):
    w = matrix(qtype, rows, cols)
    before = w.copy()
    p = packed(qtype, rows, cols)
    qs, d, m = ref.pack(qtype, w)
    assert (p.qtype, p.rows, p.cols) == (QType[qtype], rows, cols)
    np.testing.assert_array_equal(p.qs, qs)
    np.testing.assert_array_equal(p.d, d)
    np.testing.assert_array_equal(p.m, m)
    np.testing.assert_array_equal(w, before)
    assert not any(np.shares_memory(a, w) for a in (p.qs, p.d, p.m))
    assert not p.qs.flags.writeable


@pytest.mark.parametrize("qtype", TYPES)
def test_pack_stacks_matrices_by_rows(qtype):
    """q | k | v as the model packs them: 130 + 7 + 16 rows, the tile boundaries inside matrices."""
    parts = [matrix(qtype, r, 96, seed=i) for i, r in enumerate((130, 7, 16))]
    p = qint.pack([(QType[qtype], w) for w in parts])
    qs, d, m = ref.pack(qtype, np.concatenate(parts))
    np.testing.assert_array_equal(p.qs, qs)
    np.testing.assert_array_equal(p.d, d)
    np.testing.assert_array_equal(p.m, m)


def test_pack_declines_what_it_cannot_run():
    q4, q8 = matrix("Q4_0", 16, 96), matrix("Q8_0", 16, 96)
    assert qint.pack([(QType.Q4_0, q4), (QType.Q8_0, q8)]) is None  # mixed types
    assert qint.pack([(QType.Q4_K, np.zeros((16, 144), np.uint8))]) is None  # K-quants stay float
    assert qint.pack([(QType.Q4_0, q4), (QType.Q4_0, matrix("Q4_0", 16, 64))]) is None  # different widths


# -- the activations ----------------------------------------------------------------------------


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("batch", BATCH)
def test_quantize_matches_reference_bit_for_bit(cols, batch):
    x = activations((batch, cols), _seed("q8", batch, cols))
    act = qint.Activations(cols, batch)
    qint.quantize_q8(x, act.q, act.d, act.s, act.m)
    q, d, s, m = ref.quantize_q8(x)
    np.testing.assert_array_equal(act.q.reshape(batch, cols), q)
    np.testing.assert_array_equal(act.d.reshape(batch, -1), d)
    np.testing.assert_array_equal(act.s.reshape(batch, -1), s)
    np.testing.assert_array_equal(act.m.reshape(batch, -1), m)
    exact = ref.quantize_q8_exact(x)[1]
    assert (d != exact).any() and np.allclose(d, exact, rtol=2.0 ** -11, atol=0)  # the halves are rounded
    assert np.abs(q).max() == 127
    assert (d >= 0).all() and (d == 0).any() == (cols >= 64)


def test_quantize_rounds_ties_to_even():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 0.5, 1.5, -2.5]  # d = 1 exactly
    act = qint.Activations(32)
    qint.quantize_q8(x, act.q, act.d, act.s, act.m)
    assert act.q[:4].tolist() == [127, 0, 2, -2]
    assert act.d[0] == 1.0 and act.s[0] == 127 and act.m[0] == 127.0


# -- the reference against gguf -----------------------------------------------------------------


@pytest.mark.parametrize("cols", (96, 576))
@pytest.mark.parametrize("qtype", TYPES)
def test_reference_is_gguf_dequantize_within_activation_rounding(qtype, cols):
    w = matrix(qtype, 130, cols)
    x = activations((3, cols), _seed("gguf", cols))
    dense = gguf.quants.dequantize(w, gguf.GGMLQuantizationType[qtype]).reshape(130, cols)
    exact = x.astype(np.float64) @ dense.astype(np.float64).T
    ours = ref.int_matvec(qtype, w, x)
    mins = ref.int_codes(qtype, w)[2] if qtype == "Q4_1" else None
    bound = ref.int_error_bound(dense, x, mins)
    err = np.abs(ours - exact)
    float_slack = 1e-5 * np.abs(exact).max()
    assert (err <= bound + float_slack).all(), float((err - bound).max())
    assert err.max() > 1e-3 * bound.max()  # it is the quantized product, not the float one
    np.testing.assert_array_equal(DEQUANT[qtype](w), dense)  # the codes' reading is gguf's


def test_reference_with_swapped_nibbles_is_caught():
    """Reading Q4 codes high nibble first breaks the bound several times over."""
    w = matrix("Q4_1", 130, 576)
    x = activations((1, 576), 5)
    dense = gguf.quants.dequantize(w, gguf.GGMLQuantizationType.Q4_1).reshape(130, 576)
    exact = x.astype(np.float64) @ dense.astype(np.float64).T
    u, d, m = ref.int_codes("Q4_1", w)
    swapped = np.concatenate([u[..., 16:], u[..., :16]], axis=-1)
    q, dx, _, mx = ref.quantize_q8(x)
    S = ref.int_block_sums(swapped, q)
    wrong = ((d[None] * dx[:, None]) * S + m[None] * mx[:, None]).sum(axis=-1)
    assert (np.abs(wrong - exact) > ref.int_error_bound(dense, x, m)).mean() > 0.5


# -- the integer sums -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("qtype", TYPES)
def test_block_sums_are_exact(kind, qtype, cols):
    rows, batch = 130, 3
    p = packed(qtype, rows, cols)
    x = activations((batch, cols), _seed("S", cols))
    act = qint.Activations(cols, batch)
    qint.quantize_q8(x, act.q, act.d, act.s, act.m)
    out = np.zeros((batch, p.qs.shape[0] * qint.LANES, cols // 32), np.int32)
    qint.select(kind).block_isums(int(QType[qtype]), p.qs, act.q, cols, out)
    u, _, _ = ref.int_codes(qtype, matrix(qtype, rows, cols))
    q = ref.quantize_q8(x)[0]
    np.testing.assert_array_equal(out[:, :rows], ref.int_block_sums(u, q))
    assert (out[:, rows:] == 0).all()  # the padding lanes hold zero codes


# -- the products ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", BATCH)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("qtype", TYPES)
def test_matvec_matches_integer_reference(kind, qtype, cols, rows, batch):
    x = activations((batch, cols), _seed("x", batch, cols))
    out = run(kind, packed(qtype, rows, cols), x)
    want = ref.int_matvec(qtype, matrix(qtype, rows, cols), x)
    np.testing.assert_array_equal(out, want)  # the same float32 operations in the same order: no rounding apart


@pytest.mark.parametrize("kind", KINDS[1:])
@pytest.mark.parametrize("batch", (1, 2, 5, 8))
@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("qtype", TYPES)
def test_simd_kernels_equal_plain(kind, qtype, cols, batch):
    p = packed(qtype, 130, cols)
    x = activations((batch, cols), _seed("vp", batch, cols))
    np.testing.assert_array_equal(run(kind, p, x), run("plain", p, x))


@pytest.mark.skipif(not simd.has_avx2(), reason="no AVX2")
def test_avx2_q8_sums_hold_at_the_extremes():
    """Q8_0 codes of -128 and 127 against activations of -127 and 127: AVX2's 16-bit pair sums
    would saturate on the codes as stored (plus 128); the sign trick keeps them exact."""
    rows, cols = 16, 64
    w = matrix("Q8_0", rows, cols).copy()
    b = w.reshape(rows, cols // 32, 34)
    b[..., 2:34] = np.where(np.arange(32) % 2 == 0, np.uint8(0x80), np.uint8(0x7F))  # -128, 127, ...
    p = qint.pack([(QType.Q8_0, w)])
    x = np.where(np.arange(cols) % 4 < 2, np.float32(-1.0), np.float32(1.0))[None].astype(np.float32)
    np.testing.assert_array_equal(run("avx2", p, x), run("plain", p, x))
    act = qint.Activations(cols)
    qint.quantize_q8(x, act.q, act.d, act.s, act.m)
    out = np.zeros((1, rows, cols // 32), np.int32)
    qint.select("avx2").block_isums(int(QType.Q8_0), p.qs, act.q, cols, out)
    u, _, _ = ref.int_codes("Q8_0", w)
    np.testing.assert_array_equal(out[0], ref.int_block_sums(u, act.q.reshape(1, cols))[0])


@pytest.mark.parametrize("kind", KINDS)
def test_batch_rows_are_independent(kind):
    """Row ``s`` of a batched product is bit for bit the product of that row alone."""
    p = packed("Q4_1", 130, 576)
    x = activations((8, 576), 11)
    both = run(kind, p, x)
    for s in range(8):
        np.testing.assert_array_equal(both[s], run(kind, p, x[s:s + 1])[0])


@pytest.mark.parametrize("kind", KINDS)
def test_add_accumulates_into_out(kind):
    p = packed("Q8_0", 130, 576)
    x = activations((3, 576), 12)
    base = activations((3, 130), 13)
    got = run(kind, p, x, out=base.copy(), add=True)
    np.testing.assert_array_equal(got, base + run(kind, p, x))


@pytest.mark.parametrize("kind", KINDS)
def test_swiglu_input(kind):
    """``swiglu``: the product of ``silu(gate) * up`` (written over the gate half)."""
    p = packed("Q4_1", 130, 1536)
    gu = activations((3, 2 * 1536), 14) / 4
    g, u = gu[:, :1536].astype(np.float64), gu[:, 1536:].astype(np.float64)
    h = (g / (1 + np.exp(-g)) * u).astype(np.float32)
    hk = gu.copy()
    qint.swiglu_rows(hk)
    np.testing.assert_allclose(hk[:, :1536], h, rtol=1e-5, atol=1e-6)
    got = run(kind, p, gu.copy(), swiglu=True)
    np.testing.assert_array_equal(got, run(kind, p, np.ascontiguousarray(hk[:, :1536])))


def test_select(monkeypatch):
    monkeypatch.delenv(qint.KERNELS_ENV, raising=False)
    assert qint.select("plain").name == "plain"
    assert qint.select().name == ("vnni" if simd.has_vnni() else "avx2" if simd.has_avx2() else "plain")
    assert qint.available()[0] == "plain" and qint.select().name == qint.available()[-1]
    with pytest.raises(ValueError, match="unknown"):
        qint.select("avx9")


@pytest.mark.parametrize("kind", KINDS)
def test_the_environment_picks_the_path(monkeypatch, kind):
    """``WAFERVOX_KERNELS`` picks any path this CPU runs, for everything that asks for ``auto``."""
    monkeypatch.setenv(qint.KERNELS_ENV, kind.upper())
    assert qint.select().name == kind
    assert qint.select("plain").name == "plain"  # an explicit choice wins


def test_the_environment_refuses_what_the_cpu_cannot_run(monkeypatch):
    monkeypatch.setenv(qint.KERNELS_ENV, "sse9")
    with pytest.raises(ValueError, match="WAFERVOX_KERNELS='sse9' is not a kernel path"):
        qint.select()
    monkeypatch.setattr(simd, "has_vnni", lambda: False)  # as on an AVX2-only CPU, whatever this one is
    monkeypatch.setattr(simd, "has_avx2", lambda: True)
    monkeypatch.setenv(qint.KERNELS_ENV, "vnni")
    with pytest.raises(ValueError, match="the vnni kernels need a CPU with AVX-512 VNNI.*this one runs plain, avx2"):
        qint.select()
    monkeypatch.setenv(qint.KERNELS_ENV, "")
    assert qint.select().name == "avx2"


def test_exp_f32_within_two_ulp_and_saturates():
    from numba import njit

    @njit
    def apply(a, out):
        for i in range(a.shape[0]):
            out[i] = qint.exp_f32(a[i])

    a = np.concatenate([np.linspace(-87, 88, 100001), [-1e4, -100.0, 100.0, 1e4]]).astype(np.float32)
    out = np.empty_like(a)
    apply(a, out)
    want = np.exp(a[:-4].astype(np.float64))
    assert (np.abs(out[:-4] - want) / want).max() < 2 * 2.0 ** -24
    assert np.isfinite(out).all() and out[0] > 0 and out[-4] == out[-3] and out[-2] == out[-1]
    gu = np.array([[-1e4, 1e4, 2.0, 3.0]], np.float32)
    qint.swiglu_rows(gu)
    assert abs(gu[0, 0]) < 1e-30 and gu[0, 1] == 1e4 * 3.0


@pytest.mark.parametrize("kind", KINDS)
def test_shape_mismatches_are_errors(kind):
    p = packed("Q4_1", 130, 96)
    k = qint.select(kind)
    x = activations((2, 96), 1)
    with pytest.raises(ValueError, match="x must be"):
        k(p, x, qint.Activations(96, 2), np.zeros((3, 130), np.float32))  # 2 rows in, 3 out
    with pytest.raises(ValueError, match="x must be"):
        k(p, x[:, :64].copy(), qint.Activations(96, 2), np.zeros((2, 130), np.float32))
    with pytest.raises(ValueError, match="too small"):
        k(p, x, qint.Activations(96, 1), np.zeros((2, 130), np.float32))


def test_half_round_is_ieee_half_rounding():
    """``qint.half_round`` equals numpy's float32 -> float16 -> float32 (nearest, ties to even) on
    normal and subnormal values and on exact midpoints between halves."""
    rng = np.random.default_rng(11)
    mags = 10.0 ** rng.uniform(-9, 4.5, 4000)
    v = (rng.choice([-1.0, 1.0], 4000) * mags).astype(np.float32)
    h = rng.integers(1, 0x7BFF, 2000).astype(np.uint16).view(np.float16)
    mid = ((h.astype(np.float64) + np.nextafter(h, np.float16(np.inf)).astype(np.float64)) / 2).astype(np.float32)
    assert (mid.astype(np.float64) == (h.astype(np.float64) + np.nextafter(h, np.float16(np.inf)).astype(np.float64)) / 2).all()
    for x in np.concatenate([v, mid, -mid, np.float32([0.0, 6.1e-5, 6.103515625e-05, 5.96e-8])]):
        assert qint.half_round(np.float32(x)) == np.float32(np.float16(x)), x


def test_fhsum_adds_lanes_in_its_fixed_tree():
    """``simd.fhsum`` is the pairwise tree (j + 8, then j + 4, j + 2, j + 1) in float32, exactly:
    values of wildly different sizes make any other order give another sum."""
    from numba import njit

    from decode import simd

    @njit
    def hsum(a):
        return simd.fhsum(simd.fload(a, 0))

    rng = np.random.default_rng(5)
    other = 0
    for _ in range(200):
        v = (rng.standard_normal(16) * 10.0 ** rng.integers(-6, 7, 16)).astype(np.float32)
        t = v.copy()
        for w in (8, 4, 2, 1):
            t[:w] = t[:w] + t[w:2 * w]
        assert hsum(v) == t[0]
        other += np.float32(np.sum(v, dtype=np.float32)) != t[0]
    assert other > 0  # numpy's own order differs somewhere: the test can tell orders apart


AVX2_ONLY_CHECK = r"""
import numpy as np
from decode import qint, simd
from decode.quant import QType
import sys
sys.path.insert(0, "tests")
from quant_reference import random_matrix
assert not simd.has_vnni() and simd.has_avx2() and qint.select().name == "avx2"
rng = np.random.default_rng(1)
for name in ("Q4_0", "Q4_1", "Q8_0"):
    p = qint.pack([(QType[name], random_matrix(name, 48, 96, 3))])
    for batch in (1, 3):
        x = rng.standard_normal((batch, 96), dtype=np.float32)
        outs = []
        for kind in ("avx2", "plain"):
            out = np.zeros((batch, 48), np.float32)
            qint.select(kind)(p, x, qint.Activations(96, batch), out)
            outs.append(out)
        assert np.array_equal(*outs), name
print("ok")
"""


@pytest.mark.skipif(not simd.has_avx2(), reason="no AVX2")
@pytest.mark.engines  # compiles the decode core from an empty cache in a subprocess: not a unit test
def test_avx2_kernels_compile_for_a_cpu_without_avx512(tmp_path):
    """Compiled for this CPU with every AVX-512 feature off (as on an AVX2-only EPYC), the kernels
    select ``avx2`` and give the plain path's numbers (a fresh numba cache, in a subprocess)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from llvmlite import binding as ll

    off = ("avx512", "avxvnni", "amx", "evex512", "avx10", "avxifma", "avxneconvert")
    feats = ",".join(("+" if on and not k.startswith(off) else "-") + k for k, on in ll.get_host_cpu_features().items())
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=feats, NUMBA_CACHE_DIR=str(tmp_path))
    env.pop(qint.KERNELS_ENV, None)  # the path this CPU picks by itself
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", AVX2_ONLY_CHECK], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
