"""The whole model against llama.cpp (the oracle), on SmolLM2-135M-Instruct Q4_1.

The fixture is made by bench/llamacpp_oracle.py.  Bounds are those a correct float
implementation meets against llama.cpp (which quantizes activations to 8 bits);
a wrong RoPE layout or nibble order breaks them several times over.
"""

from __future__ import annotations

import numpy as np
import pytest

NEAR_TIE = 1.0


def _records(oracle):
    return oracle["records"]


def test_fixture_covers_the_required_prompts(oracle):
    recs = _records(oracle)
    assert len(recs) >= 8
    assert all(len(r["greedy_ids"]) == 48 and len(r["steps"]) == 48 for r in recs)
    assert any("<|im_start|>" in r["prompt"] for r in recs)
    assert max(len(r["prompt_ids"]) for r in recs) >= 280


def test_tokenizer_matches_llamacpp(oracle, tokenizer):
    for rec in _records(oracle):
        assert tokenizer.encode(rec["prompt"]) == rec["prompt_ids"], rec["name"]


def _first_logits(model, ids):
    state = model.new_state()
    return model.forward(state, ids, 0).copy(), state


def test_first_position_logits(oracle, model):
    for rec in _records(oracle):
        logits, _ = _first_logits(model, rec["prompt_ids"])
        top = rec["steps"][0]["top"]
        assert int(np.argmax(logits)) == top[0][0], rec["name"]
        diff = np.array([logits[i] - v for i, v in top])
        assert np.abs(diff).max() <= 1.5, (rec["name"], diff)
        assert np.sqrt(np.mean(diff ** 2)) <= 0.6, (rec["name"], diff)


def test_teacher_forced_steps(oracle, model):
    """Feed llama.cpp's own tokens; our logits must track its top-10 at every step."""
    for rec in _records(oracle):
        logits, state = _first_logits(model, rec["prompt_ids"])
        pos = len(rec["prompt_ids"])
        for step, tok in enumerate(rec["greedy_ids"]):
            top = rec["steps"][step]["top"]
            ref = dict((i, v) for i, v in top)
            diff = max(abs(logits[i] - v) for i, v in top)
            assert diff <= 2.0, (rec["name"], step, diff)
            ours = int(np.argmax(logits))
            # our argmax must be a token llama.cpp rates within 1.0 of its best
            assert ours in ref and top[0][1] - ref[ours] <= 1.0, (rec["name"], step, ours)
            logits = model.forward(state, [tok], pos)
            pos += 1


def test_free_running_greedy(oracle, generator):
    """Our own greedy tokens equal llama.cpp's up to its first near-tie."""
    leading = []
    for rec in _records(oracle):
        generator.reset()
        stats = generator.generate(rec["prompt_ids"], max_tokens=48, stop_ids=())  # llama.cpp ran past EOS too
        ours = list(stats.token_ids)
        ref = rec["greedy_ids"]
        margins = [s["margin"] for s in rec["steps"]]
        first_tie = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(ref))
        n_same = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        assert len(ours) == 48
        assert n_same >= first_tie, (rec["name"], n_same, first_tie)
        leading.append(n_same)
    assert sum(n >= 4 for n in leading) >= 6, leading


@pytest.mark.parametrize("bug", ["nibbles", "rope"])
def test_agreement_bounds_catch_real_bugs(oracle, model, bug, monkeypatch):
    """The same first-position bound fails when a known bug is planted: the test can fail."""
    import decode.model as dm

    rec = next(r for r in _records(oracle) if r["name"] == "chat")
    if bug == "rope":
        # rotate halves (NeoX layout) instead of GGUF llama's adjacent pairs
        def neox_rope(x, n_heads, head_dim, rot_dims, pos0, cos, sin):
            half = rot_dims // 2
            for t in range(x.shape[0]):
                for h in range(n_heads):
                    b = h * head_dim
                    a, c = x[t, b:b + half].copy(), x[t, b + half:b + rot_dims].copy()
                    x[t, b:b + half] = a * cos[pos0 + t] - c * sin[pos0 + t]
                    x[t, b + half:b + rot_dims] = a * sin[pos0 + t] + c * cos[pos0 + t]

        monkeypatch.setattr(dm, "rope", neox_rope)
        # the float prefill's RoPE is where the bug goes (the integer steps rotate inside
        # cache_attend, whose rotation tests/decode/test_step_ops.py checks against ops.rope)
        model = dm.Model(model.file.path, int_prefill=False)
        logits, _ = _first_logits(model, rec["prompt_ids"])
    else:
        # the embedding read with swapped nibble halves stands for a wrong nibble order
        w = model.weights
        state = model.new_state()
        ids = np.asarray(rec["prompt_ids"])
        x = state.x[: len(ids)]
        model.embed(ids, x)
        d = model.config.d_model
        x[:] = x.reshape(len(ids), d // 32, 2, 16)[:, :, ::-1, :].reshape(len(ids), d)
        for i in range(model.config.n_layers):
            model.layer(state, i, x, 0)
        logits = model.head(state, x[-1:]).copy()
        assert w is model.weights
    top = rec["steps"][0]["top"]
    diff = np.array([logits[i] - v for i, v in top])
    assert np.abs(diff).max() > 1.5 or np.sqrt(np.mean(diff ** 2)) > 0.6
