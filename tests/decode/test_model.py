"""The forward pass: against a float64 reference on tiny files of every type, and its
invariants on the real model (one-pass prefill = token by token, prefix cache = recompute).

Three kernel choices: ``float`` (``int_kernels=False``: matrix-matrix prefill, matrix-vector
decode), ``int`` (``int_prefill=False``: float prefill, integer decode steps with 8-bit
activations) and ``int_prefill`` (the default: the prompt on the decode step's integer kernels too).  The invariants that set a
one-token step beside a prefill hold to float rounding on ``float``, exactly on ``int_prefill``
(a prompt token gets the very numbers a decode step gives it), and on ``int`` to the
activations' rounding (``INT_BOUNDS``, measured at about half of each bound).
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_gguf import reference_forward, write_tiny_llama

from decode import ContextLengthError, Generator, Model

TOKENS = [5, 17, 3, 250, 99, 42, 7, 7, 120]
KERNELS = ["float", "int", "int_prefill"]
#: Decode (integer kernels) against prefill (float) on the real model: the same argmax, every
#: logit within MAX and their RMS within RMS (measured: 0.50 and 0.13 over 18 tokens).
INT_BOUNDS = {"max": 1.0, "rms": 0.3}
#: Float prefill (matrix-matrix) against float decode steps (matrix-vector): the sums' order
#: differs, and a key or value on the edge between two halves of the cache may round either way
#: (measured: 2.2e-3 to 3.4e-3 of logits up to ~20 over three prompts).
FLOAT_ATOL = 1e-2
#: The tiny random model's decode steps (integer wo and tied head) against the float64 reference,
#: relative to the largest logit (measured: 1.1%).
TINY_INT_RTOL = 2.5e-2


def assert_near_int(a: np.ndarray, b: np.ndarray) -> None:
    d = a.astype(np.float64) - b
    assert int(np.argmax(a)) == int(np.argmax(b))
    assert np.abs(d).max() <= INT_BOUNDS["max"], np.abs(d).max()
    assert np.sqrt(np.mean(d ** 2)) <= INT_BOUNDS["rms"], np.sqrt(np.mean(d ** 2))


@pytest.fixture(scope="module")
def models(model):
    """The default model (``int_prefill``) and the same file on the other two kernel choices."""
    return {"int": Model(model.file.path, int_prefill=False), "float": Model(model.file.path, int_kernels=False),
            "int_prefill": model}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    dense = write_tiny_llama(path)
    return path, dense


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_model_matches_float_reference(tmp_path, tied):
    """Q4_K, Q8_0, Q4_1, Q4_0, F16, BF16, Q6_K and F32 matrices in one model, tied or separate head
    (float kernels: the tied Q8_0 head would otherwise take 8-bit activations)."""
    path = tmp_path / "m.gguf"
    dense = write_tiny_llama(path, tied=tied)
    m = Model(path, int_kernels=False)
    assert m.config.tied_embeddings is tied
    ours = m.forward(m.new_state(), TOKENS, 0)
    ref = reference_forward(dense, TOKENS, tied=tied)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_model_int_decode_matches_float_reference(tmp_path, tied):
    """Token by token on the default kernels: Q4_0 ``wo`` (and the tied Q8_0 head) take the integer
    path, the other types the float one; a wrong token's reference is several bounds away."""
    path = tmp_path / "m.gguf"
    dense = write_tiny_llama(path, tied=tied)
    m = Model(path)
    assert m.packed.layers[0].wo is not None and m.packed.layers[0].qkv is None
    assert (m.packed.head is not None) is tied
    s = m.new_state()
    for pos, tok in enumerate(TOKENS):
        ours = m.forward(s, [tok], pos)
    ref = reference_forward(dense, TOKENS, tied=tied)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=TINY_INT_RTOL * np.abs(ref).max())
    other = reference_forward(dense, TOKENS[:-1] + [8], tied=tied)
    assert np.abs(ours - other).max() > 2 * TINY_INT_RTOL * np.abs(other).max()


def test_tiny_model_catches_wrong_reference(tiny):
    """The comparison above is sharp: a reference for other tokens does not pass it."""
    path, dense = tiny
    m = Model(path, int_kernels=False)
    ours = m.forward(m.new_state(), TOKENS, 0)
    other = reference_forward(dense, TOKENS[:-1] + [8])
    assert np.abs(ours - other).max() > 1e-2 * np.abs(other).max()


def test_weights_are_views_of_the_file(model):
    w = model.weights.layers[0].wq.data
    assert not w.flags.owndata and not w.flags.writeable
    base = w
    while base.base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap)


@pytest.mark.parametrize("kernels", KERNELS)
def test_one_pass_prefill_equals_token_by_token(models, tokenizer, kernels):
    m = models[kernels]
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog because it was late for dinner.")
    a = m.forward(m.new_state(), ids, 0).copy()
    s = m.new_state()
    for pos, tok in enumerate(ids):
        b = m.forward(s, [tok], pos)
    if kernels == "float":
        np.testing.assert_allclose(a, b, atol=FLOAT_ATOL, rtol=0)
        assert int(np.argmax(a)) == int(np.argmax(b))
    elif kernels == "int":
        assert_near_int(b, a)
    else:
        np.testing.assert_array_equal(a, b)


def test_prefill_in_chunks_equals_one_chunk(model, tokenizer):
    ids = tokenizer.encode(" ".join(f"item {i}," for i in range(120)))
    assert len(ids) > model.new_state().chunk
    a = model.forward(model.new_state(), ids, 0).copy()
    s = model.new_state()
    model.forward(s, ids[:100], 0)
    b = model.forward(s, ids[100:], 100)
    np.testing.assert_array_equal(a, b)  # the default prefill: each token's numbers are a decode step's


@pytest.mark.parametrize("kernels", KERNELS)
def test_prefix_cache_gives_same_logits_as_recompute(models, kernels):
    model = models[kernels]
    gen = Generator(model=model)
    turn1 = [{"role": "user", "content": "Name a fruit."}]
    ids1 = gen.encode_chat(turn1)
    st1 = gen.generate(ids1, max_tokens=12)
    assert st1.cached_tokens == 0
    reply = gen.tokenizer.decode(st1.token_ids)
    turn2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And a colour?"}]
    ids2 = gen.encode_chat(turn2)
    st2 = gen.generate(ids2, max_tokens=12)
    assert st2.cached_tokens >= len(ids1)  # the first turn was not recomputed
    fresh = Generator(model=model)
    st3 = fresh.generate(ids2, max_tokens=12)
    assert st3.cached_tokens == 0
    if kernels != "int":  # on "int" the cached first turn's keys and values come from decode steps,
        assert st2.token_ids == st3.token_ids  # the recompute's from a float prefill: near-ties may part
    # and logits at the end of the prompt agree
    cached_logits = model.forward(gen.state, ids2[-1:], len(ids2) - 1).copy()  # a decode step
    full = model.forward(model.new_state(), ids2, 0)  # a prefill
    if kernels == "float":
        np.testing.assert_allclose(cached_logits, full, atol=FLOAT_ATOL, rtol=0)
    elif kernels == "int":
        assert_near_int(cached_logits, full)
    else:
        np.testing.assert_array_equal(cached_logits, full)


def test_same_prompt_twice_reuses_all_but_one_token(generator):
    generator.reset()
    ids = generator.tokenizer.encode("Hello there")
    a = generator.generate(ids, max_tokens=5)
    b = generator.generate(ids, max_tokens=5)
    assert b.cached_tokens == len(ids) - 1
    assert a.token_ids == b.token_ids


def test_context_cap_is_a_clear_error(tiny):
    path, _ = tiny
    gen = Generator(model=Model(path, n_ctx=16))
    with pytest.raises(ContextLengthError, match="context holds 16"):
        list(gen.stream(list(range(20))))
    st = gen.generate(list(range(10)), max_tokens=50, stop_ids=())
    assert st.finish_reason == "context_full"
    assert len(st.prompt_ids) + st.decode_tokens == 16


def test_stream_yields_text_pieces_that_add_up(generator):
    generator.reset()
    ids = generator.encode_chat([{"role": "user", "content": "Say hello in French."}])
    pieces = list(generator.stream(ids, max_tokens=20))
    st = generator.last
    assert "".join(p.text for p in pieces) == st.text
    assert [p.token_id for p in pieces if p.token_id >= 0] == list(st.token_ids)
    assert st.text.strip()
    assert st.prefill_ms > 0 and st.first_token_ms >= st.prefill_ms


def test_logits_after_reuses_the_prefix_and_equals_a_fresh_pass(model, tokenizer):
    gen = Generator(model=model)
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    fresh = model.forward(model.new_state(), ids, 0).copy()
    np.testing.assert_array_equal(gen.logits_after(ids), fresh)
    assert gen.cached == ids
    np.testing.assert_array_equal(gen.logits_after(ids), fresh)  # all cached: the last token runs again
    longer = ids + tokenizer.encode(" Then")
    np.testing.assert_array_equal(gen.logits_after(longer), model.forward(model.new_state(), longer, 0))
    with pytest.raises(ValueError):
        gen.logits_after([])
