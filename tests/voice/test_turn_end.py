"""``voice.turn_end``: the chat model's own end-of-message probability after the user's text.

On the real default model, zero-shot: complete questions score far above fragments cut off
mid-sentence (measured 0.51-0.83 against below 0.001), and scoring leaves the prefix cache at
the end of the user's text, so the answer's prompt after it computes only the assistant's opening.
"""

from __future__ import annotations

import pytest

from decode import Generator
from voice.turn_end import TurnEndScorer

CONTEXT = [{"role": "system", "content": "You are the voice assistant of Bright Bakery."}]
COMPLETE = ["What time do you open tomorrow morning?", "How much does a croissant cost?",
            "Do you have gluten free bread?", "Where are you located?"]
FRAGMENTS = ["I'd like to order", "my number is five five five", "so, um,", "What time do you", "Can I get a",
             "I was wondering if"]


@pytest.fixture(scope="module")
def scorer(generator):
    return TurnEndScorer(generator.fork())


def test_the_end_token_is_the_templates_end_of_message(scorer):
    assert scorer.generator.tokenizer.encode("<|im_end|>") == [scorer.end_id]


def test_complete_questions_score_above_fragments(scorer):
    complete = {t: scorer.score(CONTEXT, t) for t in COMPLETE}
    fragments = {t: scorer.score(CONTEXT, t) for t in FRAGMENTS}
    assert all(0.0 <= v <= 1.0 for v in (*complete.values(), *fragments.values()))
    assert min(complete.values()) > 0.2, complete
    assert max(fragments.values()) < 0.02, fragments
    assert min(complete.values()) > 20 * max(fragments.values())


def test_scoring_leaves_the_answers_prefix_in_the_cache(scorer):
    g: Generator = scorer.generator
    text = "What time do you open tomorrow morning?"
    scorer.score(CONTEXT, text)
    prompt = g.encode_chat(CONTEXT + [{"role": "user", "content": text}])
    prefix = scorer.prefix_ids(CONTEXT, text)
    assert prompt[:len(prefix)] == prefix and len(prompt) - len(prefix) <= 6  # <|im_end|>, newline, assistant opening
    stats = g.generate(prompt, max_tokens=2)
    assert stats.cached_tokens == len(prefix)


def test_a_score_is_the_same_from_a_cold_cache(scorer, generator):
    """The prefix cache changes what is computed, not the score."""
    warm = scorer.score(CONTEXT, "How much does a croissant cost?")
    cold = TurnEndScorer(generator.fork())
    cold.generator.reset()
    assert cold.score(CONTEXT, "How much does a croissant cost?") == pytest.approx(warm, rel=1e-5)
