"""``voice.turn_end``: P(the user's turn is over) from the decode core, and the silence it buys.

On the real default model: zero-shot, the end-of-message probability puts complete questions far
above fragments (measured 0.51-0.99 against below 0.001); the committed head
(``voice.turn_end_train``) also closes short statements and replies early and keeps fragments
waiting, with ASR-style punctuation or without; scoring leaves the prefix cache at the end of the
user's text, so the answer's prompt after it computes only the assistant's opening.
"""

from __future__ import annotations

import numpy as np
import pytest

from decode import Generator
from voice.llm import Persona
from voice.turn_end import (
    EAGERNESS,
    HEAD_PATH,
    Decision,
    TurnEndHead,
    TurnEndPolicy,
    TurnEndScore,
    TurnEndScorer,
    dictating,
    model_key,
    normalize,
)
from voice.turn_end_train import labelled_set

CONTEXT = [{"role": "system", "content": "You are the voice assistant of Bright Bakery."}]
COMPLETE = ["What time do you open tomorrow morning?", "How much does a croissant cost?",
            "Do you have gluten free bread?", "Where are you located?"]
FRAGMENTS = ["I'd like to order", "my number is five five five", "so, um,", "What time do you", "Can I get a",
             "I was wondering if"]
#: Not in the training set: what the head must get right (as Whisper writes them at a pause).
HELD_COMPLETE = ["Thank you very much.", "Yes, that works.", "I need three baguettes for tomorrow.", "Goodbye, thanks.",
                 "When do you open on Saturday?", "Can you deliver to Pine Street?"]
HELD_UNFINISHED = ["I'd like to order.", "So, um.", "Can I get a.", "My number is 555,", "I was wondering if.",
                   "And the", "Um, let me see, I want"]


@pytest.fixture(scope="module")
def scorer(generator):
    return TurnEndScorer(generator.fork())


@pytest.fixture(scope="module")
def headed(generator):
    s = TurnEndScorer.for_model(generator.fork())
    assert s.head is not None, "the committed head does not fit the default model: rerun python -m voice.turn_end_train"
    return s


def test_the_end_token_is_the_templates_end_of_message(scorer):
    assert scorer.generator.tokenizer.encode("<|im_end|>") == [scorer.end_id]


def test_zero_shot_complete_questions_score_above_fragments(scorer):
    complete = {t: scorer.p_end(CONTEXT, t) for t in COMPLETE}
    fragments = {t: scorer.p_end(CONTEXT, t) for t in FRAGMENTS}
    assert all(0.0 <= v <= 1.0 for v in (*complete.values(), *fragments.values()))
    assert min(complete.values()) > 0.2, complete
    assert max(fragments.values()) < 0.02, fragments
    assert all(scorer.score(CONTEXT, t).source == "zero-shot" for t in COMPLETE[:1])


def test_the_head_closes_complete_turns_and_waits_for_unfinished_ones(headed):
    policy = TurnEndPolicy()
    ctx = Persona().opening()
    rules = {t: policy.decide(headed.score(ctx, t), t).rule for t in HELD_COMPLETE + HELD_UNFINISHED}
    assert all(headed.score(ctx, t).source == "head" for t in HELD_COMPLETE[:1])
    assert sum(rules[t] == "confident" for t in HELD_COMPLETE) >= len(HELD_COMPLETE) - 1, rules
    assert sum(rules[t] == "unfinished" for t in HELD_UNFINISHED) >= len(HELD_UNFINISHED) - 1, rules
    assert not any(rules[t] == "confident" for t in HELD_UNFINISHED), rules


def test_held_out_figures_are_recorded_in_the_head():
    head = TurnEndHead.load(HEAD_PATH)
    assert head.info["held_out"]["complete_confident"] >= 0.8
    assert head.info["held_out"]["unfinished_confident"] <= 0.15
    assert head.info["rows"] == 2 * len(labelled_set(head.info["seed"], with_corpus=head.info.get("corpus", False)))


def test_a_head_for_another_model_is_not_used(generator, tmp_path):
    head = TurnEndHead.load(HEAD_PATH)
    other = TurnEndHead(head.weights, head.bias, head.mean, head.scale, model_key="1x8/16/deadbeef", info={})
    other.save(tmp_path / "h.npz")
    assert TurnEndScorer.for_model(generator, tmp_path / "h.npz").head is None
    assert model_key(generator.model) == head.model_key


def test_a_corrupt_head_file_is_reported_with_its_name(tmp_path):
    bad = tmp_path / "head.npz"
    bad.write_bytes(b"not a numpy archive")
    with pytest.raises(ValueError, match="head.npz"):
        TurnEndHead.load(bad)


def test_normalize_drops_soft_endings_and_keeps_questions():
    assert normalize("I'd like to order.") == "I'd like to order"
    assert normalize("so, um...") == "so, um..." and normalize("Can I get a loaf,") == "Can I get a loaf,"
    assert normalize("Really?") == "Really?" and normalize(".") == "."


def test_policy_rules_and_eagerness():
    head = lambda p: TurnEndScore(p_end=p, p_token=0.0, source="head")  # noqa: E731
    text = "What time do you open?"
    for eagerness, (short, mid, long) in EAGERNESS.items():
        pol = TurnEndPolicy(eagerness=eagerness)
        assert pol.decide(head(0.9), text) == Decision(short, "confident")
        assert pol.decide(head(0.9), "Hi.") == Decision(mid, "short")  # an opener as often as a whole turn
        assert pol.decide(head(0.9), "Thank you.") == Decision(short, "confident")
        assert pol.decide(head(0.3), text) == Decision(mid, "unsure")
        assert pol.decide(head(0.05), text) == Decision(long, "unfinished")
        assert short < mid < long <= 1500
    assert TurnEndPolicy.named("auto") == TurnEndPolicy(eagerness="medium")
    assert EAGERNESS["high"][0] < EAGERNESS["low"][0]
    with pytest.raises(ValueError, match="eagerness"):
        TurnEndPolicy(eagerness="eager")
    zero = TurnEndScore(p_end=0.4, p_token=0.4, source="zero-shot")  # a likely question, zero-shot: closes early
    assert TurnEndPolicy().decide(zero, text).rule == "confident"


def test_dictation_is_never_closed_at_a_pause_of_800_ms_unless_the_head_is_sure():
    """Numbers, spelled letters, a list's comma: a confident score on such a text waits the middle silence, which at
    medium (the default) outlasts an 800 ms pause with webrtcvad's early last voiced sample (~150 ms) to spare; so does
    an unsure score.  A question mark is Whisper's hearing of a rise: it closes early."""
    for text in ("My number is 555 1234.", "The zip code is six zero,", "My account number 8 7 7 3 8 1 2",
                 "My last name is Sam K. O-W-A-L-S-K-I.", "Send it to 42.", "It's spelled G, A, R."):
        assert dictating(text), text
    for text in ("Is it 12 Harbor Street or 20?", "I need bread and milk.", "Who owns it?", "I want a", "So I", "",
                 "No, the other one.", "I'll take that one."):
        assert not dictating(text), text
    head = lambda p: TurnEndScore(p_end=p, p_token=0.0, source="head")  # noqa: E731
    pol = TurnEndPolicy()
    short, mid, long = EAGERNESS["medium"]
    assert mid >= 800 + 150 and long > mid
    assert pol.decide(head(0.95), "My number is 555 1234.") == Decision(mid, "dictation")
    assert pol.decide(head(0.95), "Is it 12 Harbor Street or 20?") == Decision(short, "confident")
    assert pol.decide(head(0.4), "My number is 555") == Decision(mid, "unsure")
    assert TurnEndPolicy(dictation=False).decide(head(0.95), "My number is 555 1234.") == Decision(short, "confident")
    old = TurnEndPolicy(waits=(200, 800, 1000))
    assert old.silences == (200, 800, 1000) and old.waiting_ms == 800 and old.max_stop_ms == 1000
    assert old.decide(head(0.3), "Hello there") == Decision(800, "unsure")


def test_words_that_hold_the_floor_are_dictation():
    """"Let me think" (the issue names it beside dictation), "hold on", "give me a second": what follows is the turn."""
    for text in ("Let me think about it.", "Hmm, let me see.", "Hold on.", "Give me a second.", "Okay, one moment.",
                 "Just a sec", "Bear with me."):
        assert dictating(text), text
    for text in ("Let me know.", "Let me think about the price?", "I want to hold on to it.", "Wait for me outside."):
        assert not dictating(text), text
    head = lambda p: TurnEndScore(p_end=p, p_token=0.0, source="head")  # noqa: E731
    assert TurnEndPolicy().decide(head(0.9), "Let me think about it.") == Decision(EAGERNESS["medium"][1], "dictation")


def test_scoring_leaves_the_answers_prefix_in_the_cache(scorer):
    g: Generator = scorer.generator
    text = "What time do you open tomorrow morning?"
    scorer.score(CONTEXT, text)
    prompt = g.encode_chat(CONTEXT + [{"role": "user", "content": text}])
    prefix = scorer.prefix_ids(CONTEXT, text)
    assert prompt[:len(prefix)] == prefix and len(prompt) - len(prefix) <= 6  # <|im_end|>, newline, assistant opening
    stats = g.generate(prompt, max_tokens=2)
    assert stats.cached_tokens == len(prefix)


def test_a_score_is_the_same_from_a_cold_cache(headed, generator):
    """The prefix cache changes what is computed, not the score."""
    warm = headed.score(CONTEXT, "How much does a croissant cost?")
    cold = TurnEndScorer(generator.fork(), headed.head)
    cold.generator.reset()
    again = cold.score(CONTEXT, "How much does a croissant cost?")
    assert again.p_end == pytest.approx(warm.p_end, rel=1e-4) and again.p_token == pytest.approx(warm.p_token, rel=1e-4)


def test_a_score_computed_aside_on_the_compute_thread_is_the_same_and_the_sequence_waits_for_it(headed, model):
    """``submit`` on a generator whose model runs on a compute thread (the server's): the caller goes on while it is
    computed there; the same score as computed in place; the sequence's next use (the answer's prompt) waits for it
    and finds the user's text in the cache."""
    import threading

    from decode.batching import BatchingModel, ComputeThread

    text = "How much does a croissant cost?"
    here = headed.score(CONTEXT, text)
    compute = ComputeThread("test-aside")
    try:
        gen = headed.generator.fork()
        gen.model = BatchingModel(model, compute)
        aside = TurnEndScorer(gen, headed.head)
        hold, started = threading.Event(), threading.Event()
        compute.submit(lambda: (started.set(), hold.wait(10)))  # the compute thread busy: the score waits behind it
        assert started.wait(10)
        work = aside.submit(CONTEXT, text)
        assert not work.done()  # handed over, not computed here
        prompt = gen.encode_chat(CONTEXT + [{"role": "user", "content": text}])
        hold.set()
        stats = gen.generate(prompt, max_tokens=2)  # waits for the score, then reuses its prefix
        assert work.done()
        got = work.result()
        assert got.p_end == pytest.approx(here.p_end, rel=1e-4) and got.p_token == pytest.approx(here.p_token, rel=1e-4)
        assert stats.cached_tokens == len(aside.prefix_ids(CONTEXT, text))
    finally:
        compute.close()


def test_a_sequence_closed_while_its_score_waits_aside_does_not_wait_and_the_score_finds_it_closed(headed, model):
    import threading

    from decode.batching import BatchingModel, ComputeThread
    from decode.errors import ClosedError

    compute = ComputeThread("test-aside-close")
    try:
        gen = headed.generator.fork()
        gen.model = BatchingModel(model, compute)
        hold = threading.Event()
        compute.submit(hold.wait, 10)  # the compute thread busy: the score waits behind it
        work = TurnEndScorer(gen, headed.head).submit(CONTEXT, "Who owns the bakery?")
        gen.close()  # the session ended: at once, not after the score
        hold.set()
        with pytest.raises(ClosedError):
            work.result(10)
    finally:
        compute.close()


def test_the_logistic_fit_separates_a_separable_set():
    from voice.turn_end_train import fit_logistic

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.float64)
    w, b = fit_logistic(x, y, l2=0.1)
    assert np.mean(((x @ w + b) > 0) == (y == 1)) > 0.97
