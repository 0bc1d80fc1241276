"""Whisper's text decoder on the decode core's integer kernels: greedy decoding with Whisper's rules.

CTranslate2 decodes tiny.en at about 5 ms a token on this project's 2-core VM whatever its compute type,
most of it per-step overhead (BENCHMARKS.md); the decoder is small (4 layers of width 384, a 51,864-word
projection tied to the embeddings), so the same step on ``decode.qint``'s kernels costs about a
millisecond. The encoder stays on CTranslate2.

Weights come from the CTranslate2 ``model.bin`` the transcriber already loads (its format: a version,
the spec's name and revision, then named variables with their shape, dtype and bytes, then aliases). Each
weight matrix is quantized once at load to Q8_0 blocks (32 values, one f16 scale: finer than
CTranslate2's int8 with one scale a row) and repacked for the kernels; the matrices of a step are
products of 8-bit activations with them (``qint``), the rest (layer norms, attention, GELU) float32.

One step (``Decoder.step``) runs the architecture of OpenAI's Whisper decoder: token + learned position
embedding; per layer, pre-norm self-attention (q|k|v fused, causal over the tokens so far), pre-norm
cross-attention over the encoder's output (its keys and values computed once per utterance in
``Decoder.start``), pre-norm GELU MLP, each added to the residual; a final norm, then logits against the
embeddings. A prompt's tokens go through the same kernel in one pass (``Decoder.prefill``: each matrix read once
for all of them, the result the steps' to the bit). ``greedy`` applies the rules CTranslate2's ``generate``
applies for Whisper (suppressed tokens, a blank suppressed at the first step, timestamps in pairs,
non-decreasing, the first at most at ``max_initial_timestamp``, a timestamp forced when timestamps together
outweigh the best text token) and returns the tokens, their log-probability and the no-speech probability at
the start token.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit, prange

from decode import cpu, qint, simd
from decode.qint import NO_NORM, exp_f32, path_jit, qmatvec
from decode.quant import QType
from decode.step_ops import dot64, load64, madd64, store64
from voice.errors import EngineError

_JIT = dict(cache=True, nogil=True)
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path: str | Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 ``model.bin`` (binary version 6), aliases resolved; views of one read."""
    data = Path(path).read_bytes()
    off = 0

    def take(fmt: str):
        nonlocal off
        (v,) = struct.unpack_from(fmt, data, off)
        off += struct.calcsize(fmt)
        return v

    def text() -> str:
        nonlocal off
        n = take("<H")
        s = data[off : off + n - 1].decode()
        off += n
        return s

    try:
        version = take("<I")
        if version != 6:
            raise EngineError(f"{path}: CTranslate2 model format {version}, this reader knows version 6")
        text()  # the spec's name
        take("<I")  # its revision
        out: dict[str, np.ndarray] = {}
        for _ in range(take("<I")):
            name = text()
            dims = [take("<I") for _ in range(take("<B"))]
            dtype = _DTYPES.get(take("<B"))
            nbytes = take("<I")
            if dtype is not None:
                out[name] = np.frombuffer(data, dtype, nbytes // np.dtype(dtype).itemsize, off).reshape(dims)
            off += nbytes
        for _ in range(take("<I")):
            alias, name = text(), text()
            if name in out:
                out[alias] = out[name]
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise EngineError(f"{path}: not a readable CTranslate2 model ({exc})") from exc
    return out


def q8_0_blocks(w: np.ndarray) -> np.ndarray:
    """``w (rows, cols)`` as GGUF Q8_0 rows ``uint8 (rows, cols / 32 * 34)``: per 32 values ``d = max|x| / 127``
    as f16, then ``rint(x / d)`` as int8."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32)
    d = (np.abs(blocks).max(axis=2) / 127.0).astype(np.float16)
    inv = np.where(d > 0, 1.0 / np.maximum(d.astype(np.float32), 1e-30), 0.0)
    q = np.clip(np.rint(blocks * inv[:, :, None]), -127, 127).astype(np.int8)
    out = np.empty((rows, cols // 32, 34), np.uint8)
    out[:, :, :2] = d.view(np.uint8).reshape(rows, cols // 32, 2)
    out[:, :, 2:] = q.view(np.uint8)
    return out.reshape(rows, -1)


# -- float32 parts of a step --------------------------------------------------------------------


@njit(**_JIT)
def layer_norm(x, gamma, beta, out):
    """``out[0] = (x - mean) / sqrt(var + 1e-5) * gamma + beta`` over the one row ``x``."""
    n = x.shape[0]
    mean = np.float32(0.0)
    for i in range(n):
        mean += x[i]
    mean /= n
    var = np.float32(0.0)
    for i in range(n):
        var += (x[i] - mean) * (x[i] - mean)
    inv = np.float32(1.0) / np.float32(math.sqrt(var / n + 1e-5))
    for i in range(n):
        out[0, i] = (x[i] - mean) * inv * gamma[i] + beta[i]


@njit(**_JIT)
def gelu_bias(h, bias):
    """``h = gelu(h + bias)`` (the erf form) over row 0."""
    for i in range(h.shape[1]):
        v = h[0, i] + bias[i]
        h[0, i] = np.float32(0.5) * v * (np.float32(1.0) + np.float32(math.erf(v * 0.7071067811865476)))


@njit(inline="always", error_model="numpy", **_JIT)
def _attend(q, keys, values, head_stride, stride, n, heads, out, scores):
    """Softmax attention of q's ``heads`` 64-wide heads over ``n`` rows of ``keys`` / ``values`` (flat: head
    ``h`` row ``p`` at ``h * head_stride + p * stride``), into ``out``; 16 float32 lanes at a time."""
    scale = np.float32(0.125)  # 1 / sqrt(64)
    zero = simd.fsplat(np.float32(0.0))
    for h in range(heads):
        qo = h * 64
        qv = load64(q, qo)
        best = np.float32(-np.inf)
        for p in range(n):
            sc = simd.fhsum(dot64(qv, load64(keys, h * head_stride + p * stride))) * scale
            scores[p] = sc
            best = sc if sc > best else best
        total = np.float32(0.0)
        for p in range(n):
            scores[p] = exp_f32(scores[p] - best)
        for p in range(n):
            total += scores[p]
        a = (zero, zero, zero, zero)
        for p in range(n):
            a = madd64(a, simd.fsplat(scores[p]), load64(values, h * head_stride + p * stride))
        store64(out, qo, a, np.float32(1.0) / total)


@njit(**_JIT)
def self_attend(qkv, bias, k_cache, v_cache, pos, heads, out, scores):
    """Adds the fused q|k|v bias to ``qkv (3d,)``, stores k and v at ``pos`` of the caches ``(n_ctx, d)``
    and attends over positions ``0 .. pos`` into ``out (d,)``."""
    d = k_cache.shape[1]
    for i in range(3 * d):
        qkv[i] += bias[i]
    for i in range(d):
        k_cache[pos, i] = qkv[d + i]
        v_cache[pos, i] = qkv[2 * d + i]
    _attend(qkv, k_cache.reshape(-1), v_cache.reshape(-1), 64, d, pos + 1, heads, out, scores)


@njit(**_JIT)
def cross_attend(q, bias, kv, heads, out, scores):
    """Adds q's bias to ``q (d,)`` and attends over the encoder's keys ``kv[0]`` and values ``kv[1]``, each
    ``(heads, frames, 64)`` (a head's rows contiguous: one stream per head), into ``out (d,)``."""
    for i in range(q.shape[0]):
        q[i] += bias[i]
    frames = kv.shape[2]
    _attend(q, kv[0].reshape(-1), kv[1].reshape(-1), frames * 64, 64, frames, heads, out, scores)


def _step(kind: str):
    def step(pos, x, h, qkv, att, q, ffn, aq, ad, as_, am, W, norms, biases, k_cache, v_cache, cross, heads, scores,
             logits, d, want_logits):
        """Decoder steps on the rows of ``x (B, d)`` (their tokens and positions ``pos``, ``pos + 1``, ... embedded
        already) through every layer, then (``want_logits``) the final norm and the logits of the last row, on the
        products of the path's ``qint`` kernel: one step is one row; a prompt's tokens go through together, each
        matrix read once for all of them (row ``b`` attends over positions ``0 .. pos + b``: what stepping them one at
        a time computes).  Rows whose logits nobody reads write only their keys and values (the vocabulary's
        projection, ~2/3 of a step on Whisper tiny, is skipped).  ``W`` is the tuple of the stacked packed matrices
        (q|k|v, self out, cross q, cross out, fc1, fc2, projection), each ``(qtype, qs, d, m)``; ``norms (layers + 1,
        3, 2, d)`` gamma and beta; ``biases`` their tuple of ``(layers, n)``; ``h``, ``qkv``, ``att``, ``q``, ``ffn``
        have ``B`` rows, and ``aq, ad, as_, am`` room for ``B`` rows of the widest product's input."""
        empty = np.zeros((0, 0), np.float32)
        t0, qs0, d0, m0 = W[0]
        t1, qs1, d1, m1 = W[1]
        t2, qs2, d2, m2 = W[2]
        t3, qs3, d3, m3 = W[3]
        t4, qs4, d4, m4 = W[4]
        t5, qs5, d5, m5 = W[5]
        t6, qs6, d6, m6 = W[6]
        b0, b1, b2, b3, b4, b5 = biases
        rows = x.shape[0]
        for i in range(qs0.shape[0]):
            for b in range(rows):
                layer_norm(x[b], norms[i, 0, 0], norms[i, 0, 1], h[b:b + 1])
            qmatvec(kind, t0, qs0[i], d0[i], m0[i], h, 0, NO_NORM, 0.0, empty, aq, ad, as_, am, qkv, False)
            for b in range(rows):
                self_attend(qkv[b], b0[i], k_cache[i], v_cache[i], pos + b, heads, att[b], scores)
            qmatvec(kind, t1, qs1[i], d1[i], m1[i], att, 0, NO_NORM, 0.0, empty, aq, ad, as_, am, x, True)
            for b in range(rows):
                for j in range(d):
                    x[b, j] += b1[i, j]
                layer_norm(x[b], norms[i, 1, 0], norms[i, 1, 1], h[b:b + 1])
            qmatvec(kind, t2, qs2[i], d2[i], m2[i], h, 0, NO_NORM, 0.0, empty, aq, ad, as_, am, q, False)
            for b in range(rows):
                cross_attend(q[b], b2[i], cross[i], heads, att[b], scores)
            qmatvec(kind, t3, qs3[i], d3[i], m3[i], att, 0, NO_NORM, 0.0, empty, aq, ad, as_, am, x, True)
            for b in range(rows):
                for j in range(d):
                    x[b, j] += b3[i, j]
                layer_norm(x[b], norms[i, 2, 0], norms[i, 2, 1], h[b:b + 1])
            qmatvec(kind, t4, qs4[i], d4[i], m4[i], h, 0, NO_NORM, 0.0, empty, aq, ad, as_, am, ffn, False)
            for b in range(rows):
                gelu_bias(ffn[b:b + 1], b4[i])
            qmatvec(kind, t5, qs5[i], d5[i], m5[i], ffn, 0, NO_NORM, 0.0, empty, aq, ad, as_, am, x, True)
            for b in range(rows):
                for j in range(d):
                    x[b, j] += b5[i, j]
        if want_logits:
            last = qs0.shape[0]
            layer_norm(x[rows - 1], norms[last, 0, 0], norms[last, 0, 1], h[0:1])
            qmatvec(kind, t6, qs6[0], d6[0], m6[0], h[0:1], 0, NO_NORM, 0.0, empty, aq, ad, as_, am, logits, False)

    return path_jit(step, kind)


#: The decoder step of each integer-kernel path (none compiled before its first call).
STEPS = {kind: _step(kind) for kind in qint.KINDS}


@njit(parallel=True, error_model="numpy", **_JIT)
def cross_kv(enc, w, b, out):
    """``out[kv, h, r] = (enc[r] . w + b)[kv * d + 64 h : .. + 64]``: the encoder output ``enc (frames, d)``
    to the cross-attention keys (``kv`` 0) and values (1) of each head, ``w (d, 2d)`` float32, ``out (2,
    heads, frames, 64)``. Register tiles of 4 rows x 64 columns (16 vectors of 16 float32): each weight
    vector loaded serves 4 rows."""
    frames, d = enc.shape
    blocks = w.shape[1] // 64
    wf = w.reshape(-1)
    ef = enc.reshape(-1)
    of = out.reshape(-1)
    width = w.shape[1]
    groups = (frames + 3) // 4
    for task in prange(groups * blocks):
        _kv_tile(ef, wf, b, of, (task // blocks) * 4, task % blocks, frames, d, width)


# Not inlined: numba's array analysis of the parallel loop would take its tuples of vectors for shapes.
@njit(error_model="numpy", **_JIT)
def _kv_tile(ef, wf, b, of, r0, c, frames, d, width):
    """``cross_kv``'s rows ``r0 .. r0 + 3`` (the last row again past the end) times columns ``64 c ..`` of the
    weights, plus the bias, into block ``c`` (= kv * heads + h) of ``of``: 16 accumulators in registers."""
    col = c * 64
    e0 = min(r0 + 0, frames - 1) * d
    e1 = min(r0 + 1, frames - 1) * d
    e2 = min(r0 + 2, frames - 1) * d
    e3 = min(r0 + 3, frames - 1) * d
    bias = load64(b, col)
    a0, a1, a2, a3 = bias, bias, bias, bias
    for k in range(d):
        wk = load64(wf, k * width + col)
        a0 = fma64(simd.fsplat(ef[e0 + k]), wk, a0)
        a1 = fma64(simd.fsplat(ef[e1 + k]), wk, a1)
        a2 = fma64(simd.fsplat(ef[e2 + k]), wk, a2)
        a3 = fma64(simd.fsplat(ef[e3 + k]), wk, a3)
    o = (c * frames + r0) * 64
    for i, a in enumerate((a0, a1, a2, a3)):
        if r0 + i < frames:
            put64(of, o + i * 64, a)


@njit(inline="always", **_JIT)
def fma64(x, w, a):
    """``x * w + a`` rounded once, for each of the four vectors of ``w`` and ``a``."""
    return simd.ffma(x, w[0], a[0]), simd.ffma(x, w[1], a[1]), simd.ffma(x, w[2], a[2]), simd.ffma(x, w[3], a[3])


@njit(inline="always", **_JIT)
def put64(out, o, a):
    """The four vectors of ``a`` into ``out[o : o + 64]``."""
    simd.fstore(out, o, a[0])
    simd.fstore(out, o + 16, a[1])
    simd.fstore(out, o + 32, a[2])
    simd.fstore(out, o + 48, a[3])


# -- the decoder ---------------------------------------------------------------------------------


def _stack(mats: list[np.ndarray]) -> tuple:
    """``(qtype, qs, d, m)`` of same-shaped float32 matrices, quantized to Q8_0 and packed, with a leading
    layer axis."""
    packed = [qint.pack([(QType.Q8_0, q8_0_blocks(m))]) for m in mats]
    stacks = tuple(np.stack([getattr(p, a) for p in packed]) for a in ("qs", "d", "m"))
    for a in stacks:  # read-only as the decode core's stacks are: the kernel's one compiled signature serves both
        a.setflags(write=False)
    return (int(QType.Q8_0), *stacks)


@dataclass(frozen=True, slots=True)
class Greedy:
    tokens: list[int]  # without the prompt or the end token
    sum_logprob: float  # of every chosen token, the end token included
    no_speech_prob: float
    ended: bool  # the end token came before the length limit
    #: the text started over after a sentence's end (``greedy``'s ``starts_over``): ``tokens`` end before the copy
    restarted: bool = False


#: Per layer: the packed products of a step, in the step's order, by their CTranslate2 names.
_PRODUCTS = ("self_attention/linear_0", "self_attention/linear_1", "attention/linear_0", "attention/linear_2",
             "ffn/linear_0", "ffn/linear_1")
_NORMS = ("self_attention/layer_norm", "attention/layer_norm", "ffn/layer_norm")


@dataclass(frozen=True, slots=True)
class _Weights:
    """What decoders of one model share (read-only)."""

    heads: int
    embeddings: np.ndarray  # (vocab, d) half, as stored
    positions: np.ndarray  # (n_ctx, d) float32
    products: tuple  # _stack()s of _PRODUCTS, then the projection's
    norms: np.ndarray  # (layers + 1, 3, 2, d): gamma, beta; the last row the final norm (thrice)
    biases: tuple  # (layers, n) float32 of _PRODUCTS
    cross_w: np.ndarray  # (layers, d, 2d) float32: the encoder output to cross keys | values
    cross_b: np.ndarray  # (layers, 2d)


def load_weights(model_bin: str | Path) -> _Weights:
    v = read_ct2(model_bin)

    def f32(name: str) -> np.ndarray:
        if name not in v:
            raise EngineError(f"{model_bin}: no variable {name!r} (not a Whisper decoder)")
        return np.ascontiguousarray(v[name], np.float32)

    layers = 0
    while f"decoder/layer_{layers}/ffn/linear_0/weight" in v:
        layers += 1
    if not layers:
        raise EngineError(f"{model_bin}: no decoder layers (not a Whisper model?)")
    heads = int(np.asarray(v.get("decoder/num_heads", np.int16(6))).reshape(-1)[0])
    emb = f32("decoder/embeddings/weight")
    if emb.shape[1] != heads * 64:
        raise EngineError(f"{model_bin}: heads of {emb.shape[1] // heads}, the attention kernel takes 64")
    names = [[f"decoder/layer_{i}/{n}" for i in range(layers)] for n in _PRODUCTS]
    norm = [[(f32(f"decoder/layer_{i}/{n}/gamma"), f32(f"decoder/layer_{i}/{n}/beta")) for n in _NORMS]
            for i in range(layers)]
    final = (f32("decoder/layer_norm/gamma"), f32("decoder/layer_norm/beta"))
    return _Weights(
        heads=heads,
        embeddings=emb.astype(np.float16),
        positions=f32("decoder/position_encodings/encodings"),
        products=tuple(_stack([f32(n + "/weight") for n in group]) for group in names) + (_stack([emb]),),
        norms=np.array(norm + [[final] * 3], np.float32),
        biases=tuple(np.stack([f32(n + "/bias") for n in group]) for group in names),
        cross_w=np.ascontiguousarray(np.stack([f32(f"decoder/layer_{i}/attention/linear_1/weight").T for i in range(layers)])),
        cross_b=np.stack([f32(f"decoder/layer_{i}/attention/linear_1/bias") for i in range(layers)]),
    )


class Decoder:
    """Whisper's decoder from a CTranslate2 ``model.bin`` (or another decoder's weights), on
    ``decode.qint``'s kernels; its caches and scratch are its own."""

    def __init__(self, model_bin: str | Path | None = None, *, kernels: str = "auto", weights: _Weights | None = None):
        if weights is None:
            if model_bin is None:
                raise ValueError("Decoder needs a model.bin or weights")
            weights = load_weights(model_bin)
        self.weights = w = weights
        self.kernels = qint.select(kernels)
        self._step = STEPS[self.kernels.name]
        self.heads = w.heads
        self.vocab, self.d = w.embeddings.shape
        self.n_ctx, d = w.positions.shape[0], self.d
        layers = w.cross_w.shape[0]
        self.k_cache = np.zeros((layers, self.n_ctx, d), np.float32)
        self.v_cache = np.zeros_like(self.k_cache)
        self.x = np.zeros((1, d), np.float32)
        self.h = np.zeros((1, d), np.float32)
        self.qkv = np.zeros((1, 3 * d), np.float32)
        self.att = np.zeros((1, d), np.float32)
        self.q = np.zeros((1, d), np.float32)
        self.scores = np.zeros(1500, np.float32)  # Whisper's longest encoder output
        self.ffn = np.zeros((1, w.biases[4].shape[1]), np.float32)
        self.logits = np.zeros((1, self.vocab), np.float32)
        self.act = qint.Activations(max(3 * d, self.ffn.shape[1]))
        self._cross = np.zeros((layers, 2, self.heads, 0, 64), np.float32)
        self._rows: dict[int, tuple] = {}  # ``prefill``'s buffers, by its number of tokens

    def fork(self) -> Decoder:
        """Another decoder on the same weights (its own caches), for another thread."""
        return Decoder(weights=self.weights, kernels=self.kernels.name)

    def start(self, encoded: np.ndarray) -> None:
        """The cross-attention keys and values of ``encoded ((1,) frames, d)``, one window's encoder output."""
        enc = np.ascontiguousarray(encoded, np.float32)
        if enc.ndim == 3:
            enc = enc[0]
        frames = enc.shape[0]
        if not 0 < frames <= self.scores.shape[0] or enc.shape[1] != self.d:
            raise ValueError(f"encoder output of shape {enc.shape}, expected (1..1500, {self.d})")
        w = self.weights
        cpu.fit()  # the calling thread's team: the cores other programs leave free (each step runs on it too)
        cross = np.empty((w.cross_w.shape[0], 2, self.heads, frames, 64), np.float32)
        for i in range(w.cross_w.shape[0]):
            cross_kv(enc, w.cross_w[i], w.cross_b[i], cross[i])
        self._cross = cross

    def step(self, token: int, pos: int, logits: bool = True) -> np.ndarray | None:
        """The logits ``(vocab,)`` after ``token`` at position ``pos`` (positions 0 .. pos-1 already stepped);
        ``logits`` False: only the token's keys and values are cached (a prompt's token nobody reads), None comes
        back."""
        self._check(pos, 1, "step")
        return self._run((self.x, self.h, self.qkv, self.att, self.q, self.ffn, self.act), [token], pos, logits)

    def _check(self, pos: int, n: int, what: str) -> None:
        if n < 1 or not 0 <= pos or pos + n > self.n_ctx:
            raise ValueError(f"positions {pos}..{pos + n - 1} outside Whisper's {self.n_ctx}-token context")
        if self._cross.shape[3] == 0:
            raise RuntimeError(f"Decoder.{what} before Decoder.start")

    def _run(self, buf: tuple, tokens: list[int], pos: int, logits: bool) -> np.ndarray | None:
        """``tokens`` embedded at ``pos``.. into ``buf``'s rows (x, h, qkv, att, q, ffn, activations) and stepped."""
        x, h, qkv, att, q, ffn, a = buf
        w = self.weights
        np.add(w.embeddings[np.asarray(tokens)], w.positions[pos:pos + len(tokens)], out=x, dtype=np.float32)
        self._step(pos, x, h, qkv, att, q, ffn, a.q, a.d, a.s, a.m, w.products, w.norms, w.biases, self.k_cache,
                   self.v_cache, self._cross, self.heads, self.scores, self.logits, self.d, logits)
        return self.logits[0] if logits else None

    def prefill(self, tokens: list[int], pos: int, logits: bool = True) -> np.ndarray | None:
        """``step`` for each of ``tokens`` at ``pos``, ``pos + 1``, ... in one pass (each matrix read once for all of
        them: a prompt's tokens); the logits ``(vocab,)`` after the last one, or None (``logits`` False).  The keys and
        values cached, and the logits, are what stepping them one at a time gives."""
        n = len(tokens)
        if n == 1:
            return self.step(tokens[0], pos, logits)
        self._check(pos, n, "prefill")
        buf = self._rows.get(n)
        if buf is None:
            d, f = self.d, self.ffn.shape[1]
            buf = self._rows[n] = (np.zeros((n, d), np.float32), np.zeros((n, d), np.float32), np.zeros((n, 3 * d), np.float32),
                                   np.zeros((n, d), np.float32), np.zeros((n, d), np.float32), np.zeros((n, f), np.float32),
                                   qint.Activations(max(3 * d, f), n))
        return self._run(buf, tokens, pos, logits)


def compile_parts(model_bin) -> None:
    """The step's float32 parts (the cross keys and values, the layer norm, both attentions, the GELU) and greedy's
    rules, each run once on a scratch decoder with the argument types a transcription gives them: their kernels are
    compiled (or loaded from numba's cache).  A first run calls this while another process compiles the matrix kernel
    that the step needs (``voice.precompile``); that process's step then finds these in the cache."""
    dec = Decoder(model_bin)
    w = dec.weights
    dec.start(np.zeros((1, 1, dec.d), np.float32))
    layer_norm(dec.x[0], w.norms[0, 0, 0], w.norms[0, 0, 1], dec.h)
    self_attend(dec.qkv[0], w.biases[0][0], dec.k_cache[0], dec.v_cache[0], 0, dec.heads, dec.att[0], dec.scores)
    cross_attend(dec.q[0], w.biases[2][0], dec._cross[0], dec.heads, dec.att[0], dec.scores)
    gelu_bias(dec.ffn, w.biases[4][0])
    logits, none = dec.logits[0], np.zeros(1, np.int64)
    _rules(logits, np.zeros(2, np.int64), 0, True, 1, 0, 0, none, 50, none)
    _logsumexp(logits)
    _softmax_at(logits, 0)


@njit(**_JIT)
def _rules(logits, sampled, n, first_step, ts_begin, eot, no_ts, blank, max_initial, suppress):
    """Whisper's logit rules, in place, for the ``n`` tokens ``sampled`` so far."""
    neg = np.float32(-np.inf)
    vocab = logits.shape[0]
    for t in suppress:
        logits[t] = neg
    logits[no_ts] = neg
    if first_step:
        logits[blank] = neg
        logits[eot] = neg
    last_ts = n >= 1 and sampled[n - 1] >= ts_begin
    penult_ts = n < 2 or sampled[n - 2] >= ts_begin
    if last_ts:
        if penult_ts:  # a pair closed: text (or the end) comes next
            for t in range(ts_begin, vocab):
                logits[t] = neg
        else:  # an open segment: its closing timestamp or the end
            for t in range(eot):
                logits[t] = neg
    lowest = -1
    for i in range(n - 1, -1, -1):
        if sampled[i] >= ts_begin:
            lowest = sampled[i] if (last_ts and not penult_ts) else sampled[i] + 1
            break
    if lowest >= 0:
        for t in range(ts_begin, min(lowest, vocab)):
            logits[t] = neg
    if first_step:
        for t in range(ts_begin):
            logits[t] = neg
        for t in range(ts_begin + max_initial + 1, vocab):
            logits[t] = neg
    # the timestamps together more likely than the best text token (log-softmax's normalizer cancels)
    text_best = neg
    for t in range(ts_begin):
        if logits[t] > text_best:
            text_best = logits[t]
    ts_best = neg
    for t in range(ts_begin, vocab):
        if logits[t] > ts_best:
            ts_best = logits[t]
    if ts_best > neg:
        ts_total = np.float64(0.0)
        for t in range(ts_begin, vocab):
            if logits[t] > neg:
                ts_total += math.exp(logits[t] - ts_best)
        if ts_best + math.log(ts_total) > text_best:
            for t in range(ts_begin):
                logits[t] = neg


@njit(**_JIT)
def _logsumexp(logits):
    best = logits.max()
    total = np.float64(0.0)
    for t in range(logits.shape[0]):
        if logits[t] > -np.inf:
            total += math.exp(logits[t] - best)
    return best + math.log(total)


@njit(**_JIT)
def _softmax_at(logits, index):
    best = logits.max()
    total = np.float64(0.0)
    for t in range(logits.shape[0]):
        total += math.exp(logits[t] - best)
    return math.exp(logits[index] - best) / total


def greedy(dec: Decoder, prompt: list[int], max_new: int, *, eot: int, ts_begin: int, no_timestamps: int,
           no_speech: int, blank: list[int], suppress: list[int], max_initial_timestamp: int = 50,
           logprob_below: float = 1.0, no_speech_at: int = -1, starts_over: int = 0,
           sentence_ends: frozenset[int] = frozenset()) -> Greedy:
    """Greedy decoding from ``prompt`` (the encoder output already in ``dec.start``) with Whisper's timestamp
    rules, at most ``max_new`` tokens. The no-speech probability is read after the prompt's token at
    ``no_speech_at`` (``<|startoftranscript|>``: the last one unless a multilingual model's language and task, or
    nothing but an initial prompt before it, follow). The tokens' log-probability (a softmax over the vocabulary each
    step) is summed only when the no-speech probability is at least ``logprob_below`` (it decides silence only
    together with it); ``Greedy.sum_logprob`` is NaN otherwise.

    ``starts_over`` (> 0): stop where the text starts over, its first ``starts_over`` text tokens (timestamps aside)
    coming again right after a token of ``sentence_ends`` ("Go forward 10 meters. Go forward 10 ..."): under an initial
    prompt a short window often loops on the one sentence it heard until the length limit.  The copy is dropped and
    the decode counts as ended (``Greedy.restarted``).  A speaker's own restart rarely follows a sentence's end ("I'd
    like, I'd like a coffee"), and a sentence said twice is one turn's words either way."""
    sup = np.asarray(suppress, np.int64)
    blank_ids = np.asarray(blank, np.int64)
    sampled = np.zeros(max_new + 1, np.int64)
    at = no_speech_at % len(prompt)
    logits = dec.prefill(prompt[:at + 1], 0)  # the prompt in one pass up to the no-speech token, then the rest
    no_speech_prob = float(_softmax_at(logits, no_speech))
    if at + 1 < len(prompt):
        logits = dec.prefill(prompt[at + 1:], at + 1)
    assert logits is not None
    pos = len(prompt)
    total = 0.0 if no_speech_prob >= logprob_below else math.nan
    n = 0
    ended = restarted = False
    text_at: list[int] = []  # where each text token (no timestamp) is in ``sampled``
    while n < max_new:
        _rules(logits, sampled, n, n == 0, ts_begin, eot, no_timestamps, blank_ids, max_initial_timestamp, sup)
        tok = int(np.argmax(logits))
        if not math.isnan(total):
            total += float(logits[tok]) - _logsumexp(logits)
        if tok == eot:
            ended = True
            break
        sampled[n] = tok
        n += 1
        if starts_over and tok < ts_begin:
            text_at.append(n - 1)
            k = len(text_at) - starts_over  # where the copy would begin
            if k >= starts_over and int(sampled[text_at[k - 1]]) in sentence_ends and all(
                    sampled[text_at[k + i]] == sampled[text_at[i]] for i in range(starts_over)):
                n = text_at[k]
                ended = restarted = True
                break
        if pos >= dec.n_ctx:
            break
        logits = dec.step(tok, pos)
        pos += 1
    return Greedy([int(t) for t in sampled[:n]], total, no_speech_prob, ended, restarted)
