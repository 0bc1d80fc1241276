"""Write small llama-architecture GGUF files for tests, and a float64 NumPy reference forward.

The weights are random; each matrix can be stored in any supported type (Q4_K and
Q6_K bytes are random with sane scales, as ``gguf`` cannot quantize to them), so
the loader and the whole forward pass are checked on files the default model does
not cover (untied head, F16/BF16/K-quant matrices).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import dequantize, quantize

TINY = dict(d_model=256, n_heads=4, n_kv_heads=2, d_ff=512, n_layers=2, vocab=300, ctx=64, rope_base=10000.0,
            eps=1e-5)

DEFAULT_TYPES = {
    "attn_q": T.Q4_K, "attn_k": T.Q8_0, "attn_v": T.Q4_1, "attn_output": T.Q4_0,
    "ffn_gate": T.F16, "ffn_up": T.BF16, "ffn_down": T.Q6_K, "token_embd": T.Q8_0, "output": T.F32,
}


def _random_k_blocks(rng, rows, cols, qtype):
    """Random Q4_K / Q6_K rows whose f16 scale fields hold small finite values."""
    nb = cols // 256
    if qtype == T.Q4_K:
        raw = rng.integers(0, 256, size=(rows, nb, 144), dtype=np.uint8)
        raw[:, :, 0:2] = rng.uniform(0.001, 0.02, (rows, nb, 1)).astype(np.float16).view(np.uint8)
        raw[:, :, 2:4] = rng.uniform(0.0, 0.01, (rows, nb, 1)).astype(np.float16).view(np.uint8)
    else:
        raw = rng.integers(0, 256, size=(rows, nb, 210), dtype=np.uint8)
        raw[:, :, 208:210] = rng.uniform(0.0005, 0.002, (rows, nb, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, nb * raw.shape[2])


def _stored(rng, rows, cols, qtype, scale=0.08):
    """(array to write, raw_dtype or None)."""
    if qtype in (T.Q4_K, T.Q6_K):
        return _random_k_blocks(rng, rows, cols, qtype), qtype
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    if qtype == T.F32:
        return w, None
    if qtype == T.F16:
        return w.astype(np.float16), None
    return quantize(w, qtype), qtype


def write_tiny_llama(path, types=None, tied=False, arch="llama", seed=0, vocab_tokens=None, extra=None):
    """Write a 2-layer random llama GGUF to ``path``; return the dense float weights it holds."""
    c = TINY
    types = {**DEFAULT_TYPES, **(types or {})}
    rng = np.random.default_rng(seed)
    d, ff, hd = c["d_model"], c["d_ff"], c["d_model"] // c["n_heads"]
    kv = c["n_kv_heads"] * hd
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny-test-llama")
    w.add_block_count(c["n_layers"])
    w.add_context_length(c["ctx"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_rope_dimension_count(hd)
    tokens = vocab_tokens or ([f"<t{i}>" for i in range(c["vocab"])])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges([])
    for key, value in (extra or {}).items():
        w.add_string(key, value)
    dense = {}

    def put(name, rows, cols, qtype):
        arr, raw = _stored(rng, rows, cols, qtype)
        if raw is None:
            w.add_tensor(name, arr)
            dense[name] = np.asarray(arr, dtype=np.float64)
        else:
            w.add_tensor(name, arr, raw_dtype=raw)
            dense[name] = dequantize(arr, raw).reshape(rows, cols).astype(np.float64)

    def norm(name):
        v = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        w.add_tensor(name, v)
        dense[name] = v.astype(np.float64)

    put("token_embd.weight", c["vocab"], d, types["token_embd"])
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        put(p + "attn_q.weight", d, d, types["attn_q"])
        put(p + "attn_k.weight", kv, d, types["attn_k"])
        put(p + "attn_v.weight", kv, d, types["attn_v"])
        put(p + "attn_output.weight", d, d, types["attn_output"])
        norm(p + "ffn_norm.weight")
        put(p + "ffn_gate.weight", ff, d, types["ffn_gate"])
        put(p + "ffn_up.weight", ff, d, types["ffn_up"])
        put(p + "ffn_down.weight", d, ff, types["ffn_down"])
    norm("output_norm.weight")
    if not tied:
        put("output.weight", c["vocab"], d, types["output"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dense


def reference_forward(dense, tokens, tied=False, half_kv=True):
    """Logits of the last token, in float64, straight from the llama definition; with ``half_kv``
    the keys and values are rounded to halves first, as the model's KV cache holds them."""
    c = TINY
    d, nh, nkv = c["d_model"], c["n_heads"], c["n_kv_heads"]
    hd = d // nh
    n = len(tokens)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["eps"]) * g

    inv = c["rope_base"] ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x, heads):
        x = x.reshape(n, heads, hd // 2, 2)
        a, b = x[..., 0], x[..., 1]
        out = np.stack([a * cos[:, None] - b * sin[:, None], a * sin[:, None] + b * cos[:, None]], -1)
        return out.reshape(n, heads * hd)

    x = dense["token_embd.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        h = rms(x, dense[p + "attn_norm.weight"])
        q = rope(h @ dense[p + "attn_q.weight"].T, nh).reshape(n, nh, hd)
        k = rope(h @ dense[p + "attn_k.weight"].T, nkv).reshape(n, nkv, hd)
        v = (h @ dense[p + "attn_v.weight"].T).reshape(n, nkv, hd)
        if half_kv:
            k, v = (a.astype(np.float32).astype(np.float16).astype(np.float64) for a in (k, v))
        out = np.zeros((n, nh, hd))
        for head in range(nh):
            g = head // (nh // nkv)
            s = q[:, head] @ k[:, g].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
        x = x + out.reshape(n, d) @ dense[p + "attn_output.weight"].T
        h = rms(x, dense[p + "ffn_norm.weight"])
        gate = h @ dense[p + "ffn_gate.weight"].T
        up = h @ dense[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ dense[p + "ffn_down.weight"].T
    h = rms(x[-1], dense["output_norm.weight"])
    head = dense["token_embd.weight"] if tied else dense["output.weight"]
    return head @ h
