"""The llama transformer: weights as file views, one preallocated run state, the forward pass.

Layout after llama2.c / gpt-fast: a frozen ``Config`` (from ``gguf_file``), read-only
``Weights`` that are views into the memory-mapped GGUF, and a ``RunState`` holding
every scratch buffer and the KV cache, allocated once.  ``Model.layer`` runs one
transformer block on a batch of hidden states; ``embed`` and ``head`` are the two
ends.  Prefill runs a whole prompt chunk through each layer at once (matrix-matrix,
float kernels on the file's blocks; or, with ``int_prefill``, the decode step's kernels a
group of tokens at a time).  A decode step (one token) takes the integer kernels of
``qint`` by default: 8-bit activations against ``PackedWeights``, the Q4_0 / Q4_1 / Q8_0
matrices repacked at load (q|k|v and gate|up stacked, one call each); other types, and
``Model(..., int_kernels=False)``, keep the float matrix-vector kernels.
``forward_batch`` steps several sequences, each with its own ``RunState``, by one token
in one pass over the weights, with the same numbers as one ``forward`` each.

One forward path for the integer kernels, with the number of rows as its parameter:
``step_layers`` runs B rows through a run of blocks, row ``r`` a token at its own position
with its own KV cache (``forward_batch``: one token of each of B sequences) or all rows one
sequence's tokens (``forward``: a decode step, B = 1, or a prompt's group of
``PREFILL_GROUP`` tokens).  The float prefill (``int_prefill=False``, or blocks that are not
all packed) is the only other way through a block.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from . import cpu, qint
from .errors import ContextLengthError, ModelFileError
from .gguf_file import Config, GGUFFile, Tensor, open_gguf
from .ops import add_into, attention, embed, rmsnorm, rope, rope_tables, silu_mul
from .qint import PackedMatrix
from .quant import QType, matmat, matvec, matvec3
from .step_ops import LAYERS, cache_attend, cache_tuples, head_width

#: Largest number of prompt tokens pushed through a layer in one pass.
PREFILL_CHUNK = 256
#: Context window when the caller names none (the KV cache is allocated for it up front).
DEFAULT_CONTEXT = 2048
#: What the KV cache holds: IEEE halves as uint16 bit patterns (as llama.cpp's default f16
#: cache), half the memory of float32 and half the bytes attention reads per position.
KV_DTYPE = np.uint16
#: Prompt tokens per integer-kernel pass in prefill (measured: 4 -> 840, 8 -> 980, 16 -> 910 tok/s).
PREFILL_GROUP = 8


@dataclass(frozen=True, slots=True)
class LayerWeights:
    attn_norm: np.ndarray  # (d_model,) f32
    wq: Tensor  # (n_heads*head_dim, d_model), rows permuted for adjacent-pair RoPE
    wk: Tensor  # (kv_dim, d_model)
    wv: Tensor  # (kv_dim, d_model)
    wo: Tensor  # (d_model, n_heads*head_dim)
    ffn_norm: np.ndarray  # (d_model,) f32
    w_gate: Tensor  # (d_ff, d_model)
    w_up: Tensor  # (d_ff, d_model)
    w_down: Tensor  # (d_model, d_ff)

    @property
    def nbytes(self) -> int:
        mats = (self.wq, self.wk, self.wv, self.wo, self.w_gate, self.w_up, self.w_down)
        return sum(m.nbytes for m in mats) + self.attn_norm.nbytes + self.ffn_norm.nbytes


@dataclass(frozen=True, slots=True)
class Weights:
    token_embd: Tensor  # (vocab, d_model)
    layers: tuple[LayerWeights, ...]
    output_norm: np.ndarray  # (d_model,) f32
    output: Tensor  # (vocab, d_model); token_embd itself when tied
    rope_freqs: np.ndarray | None  # (rope_dims/2,) f32 frequency divisors, llama3-style

    @property
    def nbytes(self) -> int:
        head = 0 if self.output is self.token_embd else self.output.nbytes
        return self.token_embd.nbytes + sum(layer.nbytes for layer in self.layers) + self.output_norm.nbytes + head


def load_weights(f: GGUFFile) -> Weights:
    t = f.tensors
    cfg = f.config

    def mat(name, rows, cols) -> Tensor:
        if name not in t:
            raise ModelFileError(f"{f.path.name} lacks tensor {name}")
        ten = t[name]
        if ten.shape != (rows, cols):
            raise ModelFileError(f"tensor {name} has shape {ten.shape}, expected {(rows, cols)}")
        if ten.data.ndim != 2:
            raise ModelFileError(f"tensor {name} is not a matrix")
        return ten

    def vec(name, n) -> np.ndarray:
        if name not in t:
            raise ModelFileError(f"{f.path.name} lacks tensor {name}")
        ten = t[name]
        if ten.qtype != QType.F32 or ten.shape != (n,):
            raise ModelFileError(f"tensor {name} must be F32 of shape ({n},), got {ten.qtype.name} {ten.shape}")
        return ten.data

    for name in t:
        if name.endswith(".bias"):
            raise ModelFileError(f"unsupported tensor {name}: biases are not part of the llama architecture")
    d, hd, kv, ff = cfg.d_model, cfg.head_dim, cfg.kv_dim, cfg.d_ff
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        layers.append(LayerWeights(
            attn_norm=vec(p + "attn_norm.weight", d),
            wq=mat(p + "attn_q.weight", cfg.n_heads * hd, d),
            wk=mat(p + "attn_k.weight", kv, d),
            wv=mat(p + "attn_v.weight", kv, d),
            wo=mat(p + "attn_output.weight", d, cfg.n_heads * hd),
            ffn_norm=vec(p + "ffn_norm.weight", d),
            w_gate=mat(p + "ffn_gate.weight", ff, d),
            w_up=mat(p + "ffn_up.weight", ff, d),
            w_down=mat(p + "ffn_down.weight", d, ff),
        ))
    embd = mat("token_embd.weight", cfg.vocab_size, d)
    freqs = t["rope_freqs.weight"].data if "rope_freqs.weight" in t else None
    return Weights(
        token_embd=embd,
        layers=tuple(layers),
        output_norm=vec("output_norm.weight", d),
        output=embd if cfg.tied_embeddings else mat("output.weight", cfg.vocab_size, d),
        rope_freqs=freqs,
    )


@dataclass(frozen=True, slots=True)
class PackedLayer:
    """One block's matrices for the integer decode kernels (``None``: that product stays float)."""

    qkv: PackedMatrix | None  # (n_heads*head_dim + 2*kv_dim, d_model): wq | wk | wv
    wo: PackedMatrix | None  # (d_model, n_heads*head_dim)
    gate_up: PackedMatrix | None  # (2*d_ff, d_model): w_gate | w_up
    down: PackedMatrix | None  # (d_model, d_ff)


@dataclass(frozen=True, slots=True)
class PackedWeights:
    """The decode copies of the weights, repacked from the file's blocks (which stay the source)."""

    layers: tuple[PackedLayer, ...]
    head: PackedMatrix | None  # (vocab, d_model); the tied embedding's blocks when tied
    seconds: float  # what the repack took at load
    #: Per kind of ``KINDS``, ``(qs, d, m)`` with a leading layer axis, when all layers are alike.
    stack: dict | None = None

    @property
    def nbytes(self) -> int:
        mats = [m for layer in self.layers for m in (layer.qkv, layer.wo, layer.gate_up, layer.down)] + [self.head]
        return sum(m.nbytes for m in mats if m is not None)


#: PackedLayer's matrices, in the order the layer kernels (``step_ops.LAYERS``) take them.
KINDS = ("qkv", "wo", "gate_up", "down")


def _layer_mats(lw: LayerWeights) -> tuple[tuple[Tensor, ...], ...]:
    return (lw.wq, lw.wk, lw.wv), (lw.wo,), (lw.w_gate, lw.w_up), (lw.w_down,)


def pack_weights(w: Weights) -> PackedWeights:
    """Repack every Q4_0 / Q4_1 / Q8_0 decode matrix of ``w`` for ``qint``'s kernels.  When every
    layer's four products are packed with the same types and shapes (as in any file quantized
    to one type), the layers are packed into one stack per matrix kind (``PackedWeights.stack``),
    each layer's ``PackedMatrix`` a view of it, so a whole range of layers runs in one call."""
    t0 = time.perf_counter()

    def pk(mats, into=None) -> PackedMatrix | None:
        return qint.pack([(m.qtype, m.data) for m in mats], into)

    def signature(lw: LayerWeights):
        return tuple(tuple((int(m.qtype), m.data.shape) for m in mats) for mats in _layer_mats(lw))

    first = PackedLayer(*(pk(mats) for mats in _layer_mats(w.layers[0]))) if w.layers else None
    stack = None
    if first is not None and None not in (first.qkv, first.wo, first.gate_up, first.down) \
            and len({signature(lw) for lw in w.layers}) == 1:
        # layer 0 gave the shapes and is copied into slot 0; the others are packed into their slots
        firsts = [getattr(first, kind) for kind in KINDS]
        stack = {kind: tuple(np.zeros((len(w.layers),) + a.shape, a.dtype) for a in (f.qs, f.d, f.m))
                 for kind, f in zip(KINDS, firsts, strict=True)}
        for kind, f in zip(KINDS, firsts, strict=True):
            for a, b in zip(stack[kind], (f.qs, f.d, f.m), strict=True):
                a[0] = b
        rest = [PackedLayer(*(pk(mats, tuple(a[i] for a in stack[kind])) for kind, mats in zip(KINDS, _layer_mats(lw), strict=True)))
                for i, lw in enumerate(w.layers) if i]
        for arrays in stack.values():
            for a in arrays:
                a.setflags(write=False)
        # layer 0's views made after the stacks are read-only, so they are too
        layers = [PackedLayer(*(replace(f, qs=stack[kind][0][0], d=stack[kind][1][0], m=stack[kind][2][0])
                                for kind, f in zip(KINDS, firsts, strict=True)))] + rest
    else:
        layers = [first] + [PackedLayer(*(pk(mats) for mats in _layer_mats(lw))) for lw in w.layers[1:]] if first else []
    head = pk((w.output,))
    return PackedWeights(layers=tuple(layers), head=head, seconds=time.perf_counter() - t0, stack=stack)


class StepBuffers:
    """Scratch of one pass of up to ``rows`` rows (tokens of one sequence, or one token each of
    several) through ``Model.step_layer``: the stacked outputs of the products, with q/k/v and
    gate/up as views, the quantized activations and the rows' positions.  ``first(n)`` is the same
    scratch for the first ``n`` rows."""

    def __init__(self, cfg: Config, rows: int, logits: np.ndarray | None = None):
        d, kv, ff = cfg.d_model, cfg.kv_dim, cfg.d_ff
        qd = cfg.n_heads * cfg.head_dim
        self.rows = rows
        self.x = np.zeros((rows, d), np.float32)  # residual stream (forward_batch)
        self.xb = np.zeros((rows, d), np.float32)
        self.qkv = np.zeros((rows, qd + 2 * kv), np.float32)
        self.att = np.zeros((rows, qd), np.float32)
        self.proj = np.zeros((rows, d), np.float32)
        self.gu = np.zeros((rows, 2 * ff), np.float32)
        self.final = np.zeros((rows, d), np.float32)
        self.logits = np.zeros((rows, cfg.vocab_size), np.float32) if logits is None else logits
        self.act = qint.Activations(max(d, qd, ff), rows)
        self.pos = np.zeros(rows, np.int64)  # each row's position
        self._views(cfg)
        #: views of the first n rows (``first``), made once per n; never this object itself: a StepBuffers that held
        #: itself would live on after its sequence until the garbage collector ran (a connect/abort storm left ~90 of
        #: them, with their sequences' logits, ~80 MB)
        self._heads: dict[int, StepBuffers] = {}

    def _views(self, cfg: Config) -> None:
        qd, kv, ff = cfg.n_heads * cfg.head_dim, cfg.kv_dim, cfg.d_ff
        self.q, self.k, self.v = self.qkv[:, :qd], self.qkv[:, qd:qd + kv], self.qkv[:, qd + kv:]
        self.gate, self.up = self.gu[:, :ff], self.gu[:, ff:]
        self.cfg = cfg

    def first(self, n: int) -> StepBuffers:
        """These buffers' first ``n`` rows (views, made once per ``n``)."""
        if n == self.rows:
            return self
        got = self._heads.get(n)
        if got is None:
            got = object.__new__(StepBuffers)
            got.rows = n
            for name in ("x", "xb", "qkv", "att", "proj", "gu", "final", "logits", "pos"):
                setattr(got, name, getattr(self, name)[:n])
            got.act = self.act  # flat: the kernels index only the first rows
            got._views(self.cfg)
            got._heads = {}
            self._heads[n] = got
        return got


class RunState:
    """Every buffer the forward pass writes, allocated once: activations for a prefill
    chunk, the logits, and the KV cache ``(layers, context, kv_dim)`` of halves (uint16 bits)."""

    def __init__(self, cfg: Config, n_ctx: int, chunk: int = PREFILL_CHUNK):
        d, kv, ff = cfg.d_model, cfg.kv_dim, cfg.d_ff
        qd = cfg.n_heads * cfg.head_dim
        self.n_ctx = n_ctx
        self.chunk = chunk
        self.x = np.zeros((chunk, d), np.float32)  # residual stream
        self.xb = np.zeros((chunk, d), np.float32)  # normed input of a sub-block
        self.q = np.zeros((chunk, qd), np.float32)
        self.k = np.zeros((chunk, kv), np.float32)
        self.v = np.zeros((chunk, kv), np.float32)
        self.att = np.zeros((chunk, qd), np.float32)
        self.proj = np.zeros((chunk, d), np.float32)  # output of wo / w_down
        self.gate = np.zeros((chunk, ff), np.float32)
        self.up = np.zeros((chunk, ff), np.float32)
        self.final = np.zeros((1, d), np.float32)
        self.logits = np.zeros(cfg.vocab_size, np.float32)
        self.k_cache = np.zeros((cfg.n_layers, n_ctx, kv), KV_DTYPE)
        self.v_cache = np.zeros((cfg.n_layers, n_ctx, kv), KV_DTYPE)
        self.step = StepBuffers(cfg, PREFILL_GROUP, logits=self.logits[None])  # decode steps, integer prefill
        self._caches = None

    @property
    def caches(self) -> tuple:
        """``cache_attend``'s cache arguments for this sequence alone (made again when the cache
        arrays were swapped, as ``wafer.pipeline``'s stages do with their scratch)."""
        c = self._caches
        if c is None or c[0][0] is not self.k_cache or c[1][0] is not self.v_cache:
            c = self._caches = cache_tuples([self])
        return c


class Model:
    """A loaded GGUF model: config, weights (shared, read-only) and RoPE tables.

    Each sequence has its own ``RunState`` (``new_state``), so several conversations
    can share one loaded model; one ``RunState`` must be used by one thread at a time.
    ``int_kernels``: ``True`` (the integer decode kernels for this CPU), ``"vnni"`` or
    ``"plain"`` (one implementation by name), or ``False`` (float kernels only).
    ``int_prefill`` (default): run prompts on the decode step's integer kernels too,
    ``PREFILL_GROUP`` tokens per pass (layers whose matrices are all packed): about twice the
    float prefill's speed, and every prompt token gets exactly what a decode step would give it.
    ``False``: prompts on the float kernels (``matmat``).  Either way the KV cache holds values
    rounded to halves, as llama.cpp's default f16 cache does.
    ``warm`` (default): run one scratch decode step at load (``warm_up``).
    """

    def __init__(self, path=None, n_ctx: int | None = None, int_kernels: bool | str = True, int_prefill: bool = True,
                 warm: bool = True):
        self.file = open_gguf(path)
        self.config = self.file.config
        self.weights = load_weights(self.file)
        cfg = self.config
        self.n_ctx = min(n_ctx or DEFAULT_CONTEXT, cfg.context_length)
        self.cos, self.sin = rope_tables(self.n_ctx, cfg.rope_dims, cfg.rope_base, self.weights.rope_freqs)
        self.kernels = qint.select("auto" if int_kernels is True else int_kernels) if int_kernels else None
        self.packed = pack_weights(self.weights) if self.kernels else None
        self.int_prefill = bool(int_prefill and self.kernels)
        self._stack = self._stack_args()
        self._batch = threading.local()  # forward_batch's scratch, per calling thread
        if warm:
            self.warm_up()

    def warm_up(self) -> float:
        """One decode step on a scratch sequence, so that the kernels are loaded from numba's cache
        (or compiled) and the thread team is up before the first real token: the first call of the
        layer stack costs 30-110 ms in a fresh process, now paid at load.  Returns its seconds."""
        t0 = time.perf_counter()
        self.forward(self.new_state(), [0], 0)
        return time.perf_counter() - t0

    def compile_parts(self) -> None:
        """The embedding lookup and ``cache_attend`` alone, once each, on a scratch sequence: their kernels compiled
        (or loaded from numba's cache) with the argument types a forward pass gives them.  A first run calls this
        while another process compiles the matrix kernel (``voice.precompile``); ``warm_up`` then finds them all in
        the cache."""
        cfg = self.config
        s = self.new_state()
        self.embed(np.zeros(1, np.int64), s.x[:1])
        b = s.step.first(1)
        ks, vs, n_caches = s.caches
        cache_attend(b.qkv, ks, vs, n_caches, 0, b.pos, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dims,
                     self.cos, self.sin, b.att)

    def new_state(self) -> RunState:
        """Scratch buffers and an empty KV cache for one sequence."""
        return RunState(self.config, self.n_ctx)

    # -- the three parts of a forward pass ---------------------------------------------------

    def embed(self, tokens: np.ndarray, x: np.ndarray) -> None:
        """Embedding rows of ``tokens`` into ``x (n, d_model)``."""
        emb = self.weights.token_embd
        embed(int(emb.qtype), emb.data, tokens, x)

    def layers(self, s: RunState, lo: int, hi: int, x: np.ndarray, pos0: int) -> None:
        """Blocks ``lo .. hi - 1`` on hidden states ``x (n, d_model)`` of positions ``pos0 ..``, in
        place, writing their keys and values into ``s``'s KV cache.  Every block the integer kernels
        take (a decode step; a prompt with ``int_prefill`` where the block's matrices are all packed)
        runs as ``step_layers`` on rows, ``PREFILL_GROUP`` tokens at a time: the same numbers for each
        token as one decode step would give it, and one numba call for a group's pass through a run of
        stacked blocks.  The others take the float prefill (``_float_layer``)."""
        n = x.shape[0]
        ints = [n == 1 or (self.int_prefill and self._all_packed(i)) for i in range(lo, hi)]
        if all(ints):  # each group through all the blocks (the earlier groups' keys and values are in the cache)
            self._rows(s, lo, hi, x, pos0)
            return
        for i, integer in zip(range(lo, hi), ints, strict=True):
            if integer:
                self._rows(s, i, i + 1, x, pos0)
            else:
                self._float_layer(s, i, x, pos0)

    def layer(self, s: RunState, i: int, x: np.ndarray, pos0: int) -> None:
        """Run block ``i`` on hidden states ``x (n, d_model)`` of positions ``pos0 .. pos0+n-1``,
        in place, writing their keys and values into ``s``'s KV cache (``layers`` of one block)."""
        self.layers(s, i, i + 1, x, pos0)

    def _rows(self, s: RunState, lo: int, hi: int, x: np.ndarray, pos0: int) -> None:
        """Blocks ``lo .. hi - 1`` as ``step_layers`` on the rows of ``x`` (one sequence's tokens at positions
        ``pos0 ..``), ``PREFILL_GROUP`` rows at a time."""
        n = x.shape[0]
        for g0 in range(0, n, PREFILL_GROUP):
            b = s.step.first(min(PREFILL_GROUP, n - g0))
            b.pos[:] = np.arange(pos0 + g0, pos0 + g0 + b.rows)
            self.step_layers(lo, hi, s.caches, x[g0:g0 + b.rows], b)

    def _float_layer(self, s: RunState, i: int, x: np.ndarray, pos0: int) -> None:
        """Block ``i`` on a prompt chunk ``x (n, d_model)`` with the float kernels on the file's blocks (``matmat``)."""
        n = x.shape[0]
        cfg, w = self.config, self.weights.layers[i]
        xb, q, k, v = s.xb[:n], s.q[:n], s.k[:n], s.v[:n]
        rmsnorm(x, w.attn_norm, cfg.norm_eps, xb)
        matmat(int(w.wq.qtype), w.wq.data, xb, q)
        matmat(int(w.wk.qtype), w.wk.data, xb, k)
        matmat(int(w.wv.qtype), w.wv.data, xb, v)
        rope(q, cfg.n_heads, cfg.head_dim, cfg.rope_dims, pos0, self.cos, self.sin)
        rope(k, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dims, pos0, self.cos, self.sin)
        kc, vc = s.k_cache[i], s.v_cache[i]
        kc[pos0:pos0 + n] = k.astype(np.float16).view(np.uint16)  # halves, as step_ops.cache_attend writes them
        vc[pos0:pos0 + n] = v.astype(np.float16).view(np.uint16)
        att = s.att[:n]
        upto = pos0 + n  # the float prefill reads the cache as float32 (not the default path)
        attention(q, kc[:upto].view(np.float16).astype(np.float32), vc[:upto].view(np.float16).astype(np.float32), pos0,
                  cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, att)
        proj = s.proj[:n]
        matmat(int(w.wo.qtype), w.wo.data, att, proj)
        add_into(x, proj)

        rmsnorm(x, w.ffn_norm, cfg.norm_eps, xb)
        gate, up = s.gate[:n], s.up[:n]
        matmat(int(w.w_gate.qtype), w.w_gate.data, xb, gate)
        matmat(int(w.w_up.qtype), w.w_up.data, xb, up)
        silu_mul(gate, up)
        matmat(int(w.w_down.qtype), w.w_down.data, gate, proj)
        add_into(x, proj)

    def _all_packed(self, i: int) -> bool:
        p = self.packed.layers[i] if self.packed else None
        return p is not None and None not in (p.qkv, p.wo, p.gate_up, p.down)

    def _stack_args(self) -> tuple | None:
        """The stacked layers' arguments of ``step_ops.LAYERS`` (see ``pack_weights``), or None."""
        stack = self.packed.stack if self.packed else None
        if stack is None:
            return None
        p0 = self.packed.layers[0]
        args = tuple(a for kind in KINDS for a in (int(getattr(p0, kind).qtype), *stack[kind]))
        norms = tuple(np.stack([getattr(lw, n) for lw in self.weights.layers]) for n in ("attn_norm", "ffn_norm"))
        for a in norms:
            a.setflags(write=False)
        return args + norms

    def step_layers(self, lo: int, hi: int, caches: tuple, x: np.ndarray, b: StepBuffers) -> None:
        """``step_layer`` for blocks ``lo .. hi - 1``: one numba call (``step_ops.LAYERS``) when the
        layers are stacked, so a decode step enters numba once for all its blocks."""
        if self._stack is None:
            for i in range(lo, hi):
                self.step_layer(i, caches, x, b)
            return
        cfg, a = self.config, b.act
        ks, vs, n_caches = caches
        layers = LAYERS[self.kernels.name, head_width(cfg.head_dim)]
        layers(lo, hi, x, b.xb, b.qkv, b.att, b.gu, a.q, a.d, a.s, a.m, *self._stack, cfg.norm_eps, ks, vs, n_caches,
               b.pos, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dims, self.cos, self.sin)

    def step_layer(self, i: int, caches: tuple, x: np.ndarray, b: StepBuffers) -> None:
        """Block ``i`` on rows ``x (B, d_model)``, row ``r`` a token at position ``b.pos[r]``, of
        sequence ``r`` (a decode step of B sequences: ``caches = cache_tuples(states)``), or of one
        sequence for every row (B tokens at consecutive positions: its ``RunState.caches``).  The
        matrix products run once for all rows (integer kernels where packed, with the norms, SwiGLU
        and residual adds inside; else a float matrix-vector product per row), then RoPE, the caches
        and attention in one call (``cache_attend``).  Row ``r``'s numbers do not depend on the
        other rows."""
        cfg = self.config
        ks, vs, n_caches = caches
        w = self.weights.layers[i]
        p = self.packed.layers[i] if self.packed else None
        ker = self.kernels
        nrows = x.shape[0]
        if p and p.qkv:
            ker(p.qkv, x, b.act, b.qkv, norm=w.attn_norm, eps=cfg.norm_eps, normed=b.xb)
        else:
            rmsnorm(x, w.attn_norm, cfg.norm_eps, b.xb)
            for r in range(nrows):
                matvec3(int(w.wq.qtype), w.wq.data, int(w.wk.qtype), w.wk.data, int(w.wv.qtype), w.wv.data,
                        b.xb[r], b.q[r], b.k[r], b.v[r])
        cache_attend(b.qkv, ks, vs, n_caches, i, b.pos, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dims,
                     self.cos, self.sin, b.att)
        if p and p.wo:
            ker(p.wo, b.att, b.act, x, add=True)
        else:
            for r in range(nrows):
                matvec(int(w.wo.qtype), w.wo.data, b.att[r], b.proj[r])
            add_into(x, b.proj)

        if p and p.gate_up:
            ker(p.gate_up, x, b.act, b.gu, norm=w.ffn_norm, eps=cfg.norm_eps, normed=b.xb)
        else:
            rmsnorm(x, w.ffn_norm, cfg.norm_eps, b.xb)
            g, u = w.w_gate, w.w_up
            for r in range(nrows):
                matvec3(int(g.qtype), g.data, int(u.qtype), u.data, int(u.qtype), u.data[:0], b.xb[r], b.gate[r], b.up[r], b.up[r, :0])
        if p and p.down:
            ker(p.down, b.gu, b.act, x, add=True, swiglu=True)
        else:
            for r in range(nrows):
                silu_mul(b.gate[r:r + 1], b.up[r:r + 1])
                matvec(int(w.w_down.qtype), w.w_down.data, b.gate[r], b.proj[r])
            add_into(x, b.proj)

    def head(self, s: RunState, x_last: np.ndarray) -> np.ndarray:
        """Final norm and output projection of one hidden state ``(1, d_model)``; returns the logits."""
        return self._head(x_last, s.step)[0]

    def _head(self, x: np.ndarray, b: StepBuffers) -> np.ndarray:
        """The logits ``(B, vocab)`` of hidden states ``x (B, d_model)``, into ``b.logits``."""
        w, nrows = self.weights, x.shape[0]
        final, logits = b.final[:nrows], b.logits[:nrows]
        rmsnorm(x, w.output_norm, self.config.norm_eps, final)
        if self.packed and self.packed.head:
            self.kernels(self.packed.head, final, b.act, logits)
        else:
            for r in range(nrows):
                matvec(int(w.output.qtype), w.output.data, final[r], logits[r])
        return logits

    # -- whole passes ------------------------------------------------------------------------

    def check_tokens(self, tokens, pos0: int) -> np.ndarray:
        """``tokens`` as int64 ids, checked against the vocabulary and the context from ``pos0``."""
        tokens = np.asarray(tokens, dtype=np.int64)
        n = tokens.shape[0]
        if n == 0:
            raise ValueError("forward() needs at least one token")
        if pos0 + n > self.n_ctx:
            raise ContextLengthError(
                f"context full: {pos0 + n} tokens needed, the context holds {self.n_ctx} "
                f"(model maximum {self.config.context_length})"
            )
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            raise ValueError(f"token id out of range 0..{self.config.vocab_size - 1}")
        return tokens

    def forward(self, s: RunState, tokens, pos0: int) -> np.ndarray:
        """Feed ``tokens`` at positions ``pos0 ...`` (prefill in chunks of ``PREFILL_CHUNK``,
        or one decode step); return the logits after the last one (a view, overwritten
        by the next call)."""
        tokens = self.check_tokens(tokens, pos0)
        cpu.fit()  # the calling thread's team: the cores other programs leave free
        n = tokens.shape[0]
        for c0 in range(0, n, s.chunk):
            chunk = tokens[c0:c0 + s.chunk]
            x = s.x[:chunk.shape[0]]
            self.embed(chunk, x)
            self.layers(s, 0, self.config.n_layers, x, pos0 + c0)
        return self.head(s, x[-1:])

    def forward_batch(self, states: list[RunState], tokens, positions) -> list[np.ndarray]:
        """One decode step of each sequence: ``tokens[r]`` at ``positions[r]`` of ``states[r]``, up
        to ``qint.MAX_BATCH`` sequences per pass over the weights.  Returns each state's logits (its
        own ``logits`` buffer), equal to what ``forward(states[r], [tokens[r]], positions[r])`` gives."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        positions = [int(p) for p in positions]
        if not len(states) == len(tokens) == len(positions):
            raise ValueError(f"forward_batch: {len(states)} states, {len(tokens)} tokens, {len(positions)} positions")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("forward_batch: a sequence appears twice in one batch")
        for r, pos in enumerate(positions):
            self.check_tokens(tokens[r:r + 1], pos)
        cpu.fit()
        for c0 in range(0, len(states), qint.MAX_BATCH):
            self._step_batch(states[c0:c0 + qint.MAX_BATCH], tokens[c0:c0 + qint.MAX_BATCH], positions[c0:c0 + qint.MAX_BATCH])
        return [s.logits for s in states]

    def _step_batch(self, states: list[RunState], tokens: np.ndarray, positions: list[int]) -> None:
        b = self._batch_buffers().first(len(states))
        x = b.x
        self.embed(tokens, x)
        b.pos[:] = positions
        self.step_layers(0, self.config.n_layers, cache_tuples(states), x, b)
        logits = self._head(x, b)
        for r, s in enumerate(states):
            s.logits[:] = logits[r]
            s.step.final[0] = b.final[r]  # as a lone step leaves it (``Generator.last_hidden``)

    def _batch_buffers(self) -> StepBuffers:
        bufs = getattr(self._batch, "bufs", None)
        if bufs is None:
            bufs = self._batch.bufs = StepBuffers(self.config, qint.MAX_BATCH)
        return bufs
