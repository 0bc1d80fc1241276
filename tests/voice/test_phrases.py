"""The phrase chunker: early first phrase, safe cuts, chunking invariance, flush, markdown."""

from __future__ import annotations

import random
import re

import pytest

from voice.phrases import Phrase, PhraseChunker, PhraseConfig, Reason

#: The cuts below other than the first phrase's length are shown with a first phrase of up to three words.
THREE = PhraseConfig(max_first_words=3)


def chunk(pieces: list[str], config: PhraseConfig | None = None) -> list[Phrase]:
    """Every phrase of a reply fed as ``pieces``, drained after each piece, then flushed (``THREE`` by default)."""
    chunker = PhraseChunker(config or THREE)
    out: list[Phrase] = []
    for piece in pieces:
        chunker.feed(piece)
        out += chunker.drain()
    return out + chunker.flush()


def texts(text: str, config: PhraseConfig | None = None) -> list[str]:
    return [p.text for p in chunk([text], config)]


def test_first_phrase_is_released_at_the_first_clause():
    chunker = PhraseChunker()
    chunker.feed("Sure,")
    assert chunker.drain() == []  # "," then a digit would be "1,000": wait for the next character
    chunker.feed(" we")
    assert chunker.drain() == [Phrase(text="Sure,", index=0, reason=Reason.CLAUSE)]
    chunker.feed(" open at 7 am, see you. Bye")
    assert chunker.drain() == [Phrase(text="we open at 7 am, see you.", index=1, reason=Reason.SENTENCE)]
    assert chunker.flush() == [Phrase(text="Bye", index=2, reason=Reason.FLUSH)]


def test_sure_we_open_at_7_am():
    assert texts("Sure, we open at 7 am.") == ["Sure,", "we open at 7 am."]


@pytest.mark.parametrize(
    "text, first",
    [
        ("Well; that depends on the day.", "Well;"),
        ("Note: we close early today.", "Note:"),
        ("I think—actually, no.", "I think—"),
        ("Yes! We open at nine.", "Yes!"),
        ("Is it open? Yes.", "Is it open?"),
    ],
)
def test_first_phrase_clause_marks(text, first):
    assert texts(text)[0] == first


def test_min_first_words():
    config = PhraseConfig(min_first_words=3, max_first_words=6)
    assert texts("Sure, we open at 7, see you there.", config) == ["Sure, we open at 7,", "see you there."]
    assert texts("Hi. We open at nine.", config) == ["Hi.", "We open at nine."]  # a sentence end always cuts


def test_first_phrase_forced_after_max_first_words():
    chunker = PhraseChunker(PhraseConfig(max_first_words=8))
    chunker.feed("one two three four five six seven eight")
    assert chunker.drain() == []  # "eight" may go on ("eighteen"): never cut inside a word
    chunker.feed(" nine ten eleven")
    assert chunker.drain() == [Phrase(text="one two three four five six seven eight", index=0, reason=Reason.LENGTH)]
    assert [p.text for p in chunker.flush()] == ["nine ten eleven"]


def test_default_first_phrase_is_at_most_two_words():
    chunker = PhraseChunker()
    chunker.feed("We are open from 7 am to 6 pm.")
    assert [p.text for p in chunker.drain()] == ["We are"]
    assert [p.text for p in chunker.flush()] == ["open from 7 am to 6 pm."]
    chunker.feed("Yes, we are open.")  # a clause mark before that still cuts first
    assert [p.text for p in chunker.flush()] == ["Yes,", "we are open."]


def test_later_phrases_end_at_sentences_not_clauses():
    assert texts("Hi. We open at 9, and close at 5; see you. Bye!") == ["Hi.", "We open at 9, and close at 5; see you.", "Bye!"]


def test_later_phrases_forced_after_max_words():
    words = [f"word{i}" for i in range(60)]
    phrases = chunk([" ".join(words) + "."], PhraseConfig(max_first_words=4, max_words=25))
    assert [len(p.text.split()) for p in phrases] == [4, 25, 25, 6]
    assert [p.reason for p in phrases] == [Reason.LENGTH, Reason.LENGTH, Reason.LENGTH, Reason.SENTENCE]
    assert " ".join(p.text for p in phrases) == " ".join(words) + "."


@pytest.mark.parametrize(
    "sentence",
    [
        "We open at 7.30 on weekdays.",
        "We open at 7 a.m. on weekdays.",
        "We close at 9 p.m.",
        "Mr. Smith and Dr. Jones will see you.",
        "Bring a snack, e.g. fruit, or i.e. anything.",
        "J. R. R. Tolkien wrote it.",
        "Visit example.com today.",
        "It was 1,000 dollars, 12:30 sharp.",
    ],
)
def test_a_later_sentence_with_numbers_and_abbreviations_stays_whole(sentence):
    assert texts(f"Hello. {sentence}") == ["Hello.", sentence]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello. It costs $2.50 today. Bye.", ["Hello.", "It costs $2.50 today.", "Bye."]),
        ("Hello. We open at 7 a.m. Come early.", ["Hello.", "We open at 7 a.m.", "Come early."]),
        ("Hello. The score was 3.5. Great!", ["Hello.", "The score was 3.5.", "Great!"]),
        ("At 12:30, we eat.", ["At 12:30,", "we eat."]),
        ("$2.50, please.", ["$2.50,", "please."]),
        ('He said "go." Then left.', ['He said "go."', "Then left."]),
        ("Wait... what? Really?!", ["Wait...", "what?", "Really?!"]),
    ],
)
def test_numbers_and_abbreviations_are_not_split(text, expected):
    assert texts(text) == expected


def test_line_breaks_and_list_markers():
    assert texts("Options:\n1. Pasta\n2. Pizza\n\n") == ["Options:", "1. Pasta", "2. Pizza"]


def test_markdown_symbols_and_whitespace_are_dropped():
    assert texts("**Sure!**  Here is `the   code`.\n# Heading\n*") == ["Sure!", "Here is the code.", "Heading"]


def test_empty_phrases_are_dropped_and_indices_stay_dense():
    phrases = chunk(["  ", "\n\n", "*** ", "... ", "Okay. ", "--- ", "\n", "Done."])
    assert [(p.text, p.index) for p in phrases] == [("Okay.", 0), ("Done.", 1)]
    assert chunk(["   ", "\n"]) == []


def test_flush_releases_the_rest_and_starts_afresh():
    chunker = PhraseChunker(THREE)
    chunker.feed("We open at")
    assert chunker.drain() == []
    assert chunker.flush() == [Phrase(text="We open at", index=0, reason=Reason.FLUSH)]
    assert chunker.flush() == []
    chunker.feed("Sure, bye")  # a new reply: a first phrase again, index 0
    assert chunker.flush() == [Phrase(text="Sure,", index=0, reason=Reason.CLAUSE), Phrase(text="bye", index=1, reason=Reason.FLUSH)]


def test_flush_returns_undrained_phrases_too():
    chunker = PhraseChunker()
    chunker.feed("Yes. We do. Mr.")
    assert [p.text for p in chunker.flush()] == ["Yes.", "We do.", "Mr."]


REPLY = (
    "**Sure!** We open at 7.30 a.m. on weekdays, and at 9 a.m. Saturdays—Sundays we're closed. "
    "A coffee is $2.50, e.g. an espresso; Mr. Smith (the owner) says hi... "
    "Options:\n1. Pasta\n2. Pizza\n"
    "This last sentence has no punctuation and goes on for more than twenty five words so that the chunker "
    "must cut it at a word boundary and then flush what is left over at the very end of the reply"
)


def token_pieces(text: str) -> list[str]:
    """Pieces shaped like an LLM's tokens: a leading space and up to four characters."""
    return re.findall(r"\s*\S{1,4}|\s+", text)


def test_chunking_never_changes_phrases():
    whole = chunk([REPLY])
    assert len(whole) >= 8 and whole[0].text == "Sure!"
    assert chunk(list(REPLY)) == whole
    assert chunk(token_pieces(REPLY)) == whole
    rng = random.Random(0)
    cuts = sorted(rng.sample(range(1, len(REPLY)), 40))
    assert chunk([REPLY[a:b] for a, b in zip([0, *cuts], [*cuts, len(REPLY)])]) == whole
    assert chunk(["", *token_pieces(REPLY), ""]) == whole


def test_nothing_is_lost_or_reordered():
    spoken = " ".join(p.text for p in chunk(token_pieces(REPLY)))
    assert spoken == " ".join(REPLY.translate(str.maketrans("", "", "*#`")).split())


@pytest.mark.parametrize("kwargs", [dict(min_first_words=0), dict(min_first_words=9, max_first_words=8), dict(max_words=0)])
def test_invalid_config_raises(kwargs):
    with pytest.raises(ValueError):
        PhraseConfig(**kwargs)
