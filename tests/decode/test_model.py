"""The forward pass: against a float64 reference on tiny files of every type, and its
invariants on the real model (one-pass prefill = token by token, prefix cache = recompute)."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_gguf import reference_forward, write_tiny_llama

from decode import ContextLengthError, Generator, Model

TOKENS = [5, 17, 3, 250, 99, 42, 7, 7, 120]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    dense = write_tiny_llama(path)
    return path, dense


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_model_matches_float_reference(tmp_path, tied):
    """Q4_K, Q8_0, Q4_1, Q4_0, F16, BF16, Q6_K and F32 matrices in one model, tied or separate head."""
    path = tmp_path / "m.gguf"
    dense = write_tiny_llama(path, tied=tied)
    m = Model(path)
    assert m.config.tied_embeddings is tied
    ours = m.forward(m.new_state(), TOKENS, 0)
    ref = reference_forward(dense, TOKENS, tied=tied)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def test_tiny_model_catches_wrong_reference(tiny):
    """The comparison above is sharp: a reference for other tokens does not pass it."""
    path, dense = tiny
    m = Model(path)
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


def test_one_pass_prefill_equals_token_by_token(model, tokenizer):
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog because it was late for dinner.")
    a = model.forward(model.new_state(), ids, 0).copy()
    s = model.new_state()
    for pos, tok in enumerate(ids):
        b = model.forward(s, [tok], pos)
    np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)
    assert int(np.argmax(a)) == int(np.argmax(b))


def test_prefill_in_chunks_equals_one_chunk(model, tokenizer):
    ids = tokenizer.encode(" ".join(f"item {i}," for i in range(120)))
    assert len(ids) > model.new_state().chunk
    a = model.forward(model.new_state(), ids, 0).copy()
    s = model.new_state()
    model.forward(s, ids[:100], 0)
    b = model.forward(s, ids[100:], 100)
    np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)


def test_prefix_cache_gives_same_logits_as_recompute(model):
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
    assert st2.token_ids == st3.token_ids
    # and logits at the end of the prompt agree
    cached_logits = model.forward(gen.state, ids2[-1:], len(ids2) - 1).copy()
    full = model.forward(model.new_state(), ids2, 0)
    np.testing.assert_allclose(cached_logits, full, atol=2e-3, rtol=0)


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
