"""The llama transformer: weights as file views, one preallocated run state, the forward pass.

Layout after llama2.c / gpt-fast: a frozen ``Config`` (from ``gguf_file``), read-only
``Weights`` that are views into the memory-mapped GGUF, and a ``RunState`` holding
every scratch buffer and the KV cache, allocated once.  ``Model.layer`` runs one
transformer block on a batch of hidden states; ``embed`` and ``head`` are the two
ends.  Prefill runs a whole prompt chunk through each layer at once (matrix-matrix);
decode is the same path with one token, using the matrix-vector kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ContextLengthError, ModelFileError
from .gguf_file import Config, GGUFFile, Tensor, open_gguf
from .ops import add_into, attention, embed, rmsnorm, rope, rope_tables, silu_mul
from .quant import QType, matmat, matvec, matvec3

#: Largest number of prompt tokens pushed through a layer in one pass.
PREFILL_CHUNK = 256
#: Context window when the caller names none (the KV cache is allocated for it up front).
DEFAULT_CONTEXT = 2048


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


class RunState:
    """Every buffer the forward pass writes, allocated once: activations for a prefill
    chunk, the logits, and the KV cache ``(layers, context, kv_dim)`` in float32."""

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
        self.k_cache = np.zeros((cfg.n_layers, n_ctx, kv), np.float32)
        self.v_cache = np.zeros((cfg.n_layers, n_ctx, kv), np.float32)


class Model:
    """A loaded GGUF model: config, weights (shared, read-only) and RoPE tables.

    Each sequence has its own ``RunState`` (``new_state``), so several conversations
    can share one loaded model; one ``RunState`` must be used by one thread at a time.
    """

    def __init__(self, path=None, n_ctx: int | None = None):
        self.file = open_gguf(path)
        self.config = self.file.config
        self.weights = load_weights(self.file)
        cfg = self.config
        self.n_ctx = min(n_ctx or DEFAULT_CONTEXT, cfg.context_length)
        self.cos, self.sin = rope_tables(self.n_ctx, cfg.rope_dims, cfg.rope_base, self.weights.rope_freqs)

    def new_state(self) -> RunState:
        """Scratch buffers and an empty KV cache for one sequence."""
        return RunState(self.config, self.n_ctx)

    # -- the three parts of a forward pass ---------------------------------------------------

    def embed(self, tokens: np.ndarray, x: np.ndarray) -> None:
        """Embedding rows of ``tokens`` into ``x (n, d_model)``."""
        emb = self.weights.token_embd
        embed(int(emb.qtype), emb.data, tokens, x)

    def layer(self, s: RunState, i: int, x: np.ndarray, pos0: int) -> None:
        """Run block ``i`` on hidden states ``x (n, d_model)`` of positions ``pos0 .. pos0+n-1``,
        in place, writing their keys and values into ``s``'s KV cache."""
        cfg, w = self.config, self.weights.layers[i]
        n = x.shape[0]
        xb, q, k, v = s.xb[:n], s.q[:n], s.k[:n], s.v[:n]
        rmsnorm(x, w.attn_norm, cfg.norm_eps, xb)
        if n == 1:
            matvec3(int(w.wq.qtype), w.wq.data, int(w.wk.qtype), w.wk.data, int(w.wv.qtype), w.wv.data,
                    xb[0], q[0], k[0], v[0])
        else:
            matmat(int(w.wq.qtype), w.wq.data, xb, q)
            matmat(int(w.wk.qtype), w.wk.data, xb, k)
            matmat(int(w.wv.qtype), w.wv.data, xb, v)
        rope(q, cfg.n_heads, cfg.head_dim, cfg.rope_dims, pos0, self.cos, self.sin)
        rope(k, cfg.n_kv_heads, cfg.head_dim, cfg.rope_dims, pos0, self.cos, self.sin)
        kc, vc = s.k_cache[i], s.v_cache[i]
        kc[pos0:pos0 + n] = k
        vc[pos0:pos0 + n] = v
        att = s.att[:n]
        attention(q, kc, vc, pos0, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, att)
        proj = s.proj[:n]
        self._linear(w.wo, att, proj)
        add_into(x, proj)

        rmsnorm(x, w.ffn_norm, cfg.norm_eps, xb)
        gate, up = s.gate[:n], s.up[:n]
        if n == 1:
            g, u = w.w_gate, w.w_up
            matvec3(int(g.qtype), g.data, int(u.qtype), u.data, int(u.qtype), u.data[:0], xb[0], gate[0], up[0], up[0, :0])
        else:
            matmat(int(w.w_gate.qtype), w.w_gate.data, xb, gate)
            matmat(int(w.w_up.qtype), w.w_up.data, xb, up)
        silu_mul(gate, up)
        self._linear(w.w_down, gate, proj)
        add_into(x, proj)

    def head(self, s: RunState, x_last: np.ndarray) -> np.ndarray:
        """Final norm and output projection of one hidden state ``(1, d_model)``; returns the logits."""
        w = self.weights
        rmsnorm(x_last, w.output_norm, self.config.norm_eps, s.final)
        matvec(int(w.output.qtype), w.output.data, s.final[0], s.logits)
        return s.logits

    @staticmethod
    def _linear(wt: Tensor, x: np.ndarray, out: np.ndarray) -> None:
        if x.shape[0] == 1:
            matvec(int(wt.qtype), wt.data, x[0], out[0])
        else:
            matmat(int(wt.qtype), wt.data, x, out)

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
        n = tokens.shape[0]
        for c0 in range(0, n, s.chunk):
            chunk = tokens[c0:c0 + s.chunk]
            x = s.x[:chunk.shape[0]]
            self.embed(chunk, x)
            for i in range(self.config.n_layers):
                self.layer(s, i, x, pos0 + c0)
        return self.head(s, x[-1:])
