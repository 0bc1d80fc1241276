"""``voice.guard``: no number, time, price, name or password the persona and the conversation lack is handed out, and
a reply that starts saying again what it said stops; what is handed out is whole words, checked before the phrase
chunker sees them."""

from __future__ import annotations

import pytest

from voice.guard import ReplyGuard, knowledge, number_words, unsupported
from voice.phrases import PhraseChunker

HOTEL = ("You are Ava, the front desk agent for the Harborview Inn. Check-in begins at 3 PM and check-out is by 11 AM. "
         "Guests can park in our garage for $18 a night. The Wi-Fi password is seagull42. Breakfast is served from 6:30 "
         "to 10. Dogs under forty pounds are welcome for a $25 fee. The general manager is Daniel Okafor.")
KNOWN = knowledge(HOTEL, "What time is check-in on Tuesday?")
FALLBACK = "Sorry, I don't have that information."


@pytest.mark.parametrize("reply, bad", [
    ("Check-in begins at 3 PM.", []),
    ("Check-in begins at 3:00 PM.", []),  # the same time
    ("Check-in is at 10:30 PM.", ["10:30"]),  # the invented check-in time
    ("Breakfast is served from 6:30 to 10.", []),
    ("Breakfast is at 7:30.", ["7:30"]),
    ("Parking is $18 a night.", []),
    ("Parking is $1.25 per person.", ["1.25"]),
    ("Parking is eighteen dollars.", []),  # a number word says the number
    ("Parking is forty-five dollars.", ["45"]),
    ("Dogs under 40 pounds are welcome.", []),  # "forty" in the text, 40 in the reply
    ("The password is seagull42.", []),
    ("The password is seagull24.", ["seagull24", "24"]),
    ("The password is gull42.", ["gull42"]),  # its 42 is known, the word is not: a code is said whole or not at all
    ("Breakfast is at 7am, the bar opens at 10pm on the 5th.", ["5", "7"]),  # times and ordinals: their numbers
    ("The password is SHEBELLA.", ["SHEBELLA"]),  # the invented password
    ("The password is sunshine.", ["sunshine"]),  # a lower-case word said as a password
    ("The manager is Daniel Okafor.", []),
    ("The manager is John Smith.", ["John", "Smith"]),
    ("The Lakers won 2-1 last night.", ["Lakers", "1", "2"]),  # the invented football score
    ("We are open on Tuesday.", []),  # a day the question named
    ("We are open on Sunday.", ["Sunday"]),
    ("Sure! I can help with one of our rooms.", []),  # "one" and a capital opening a sentence are no claims
])
def test_unsupported_claims(reply, bad):
    assert sorted(unsupported(reply, KNOWN)) == sorted(bad)


def test_number_words_read_as_numbers():
    said = [v for *_, v in number_words("forty-five, one hundred forty, seven thirty, twelve")]
    assert said == [45, 140, 7, 30, 12]


def feed(guard: ReplyGuard, pieces: list[str]) -> str:
    out = []
    for p in pieces:
        out.append(guard.feed(p))
        if guard.stopped:
            break
    out.append(guard.finish())
    return "".join(out)


def tokens(text: str) -> list[str]:
    """Pieces as a tokenizer streams them: a word with its leading space, digits and marks apart."""
    import re

    return re.findall(r" ?[A-Za-z'-]+| ?\d|[^\w\s]| ", text)


def test_a_supported_reply_goes_through_whole():
    text = "Check-in begins at 3 PM, and breakfast is from 6:30 to 10."
    g = ReplyGuard(KNOWN, FALLBACK)
    assert feed(g, tokens(text)) == text and g.stopped is None


def test_an_invented_time_is_never_handed_out():
    g = ReplyGuard(KNOWN, FALLBACK)
    out = feed(g, tokens("The check-in time is 10:30 PM, and you can park for free."))
    assert "10" not in out and "30" not in out and "park" not in out
    assert out == "The check-in time is — sorry, I don't have that information." and g.stopped == "claim: 10:30"


def test_the_fallback_offers_what_is_known_after_a_whole_sentence():
    g = ReplyGuard(KNOWN, "Sorry, I'm not sure of that. What I can tell you: Check-in begins at 3 PM.")
    out = feed(g, tokens("Welcome to the inn. Check-in is at 2 PM."))
    assert out == "Welcome to the inn. Check-in is at — sorry, I'm not sure of that. What I can tell you: Check-in begins at 3 PM."


def test_a_claim_at_the_start_is_replaced_by_the_fallback():
    g = ReplyGuard(KNOWN, FALLBACK)
    assert feed(g, tokens("Sunday brunch is great.")) == "Sunday brunch is great."  # a capital opening a sentence
    g = ReplyGuard(KNOWN, FALLBACK)
    assert feed(g, tokens("57 is the answer.")) == FALLBACK


def test_every_phrase_the_chunker_cuts_was_checked():
    """Through the phrase chunker as the voice loop feeds it: no phrase carries the invented figure, and the first
    phrase comes as early as without the guard (the held word is one the chunker needs whole too)."""
    text = "The parking costs 35 dollars a night, payable at the desk."
    plain, guarded = PhraseChunker(), PhraseChunker()
    g = ReplyGuard(KNOWN, FALLBACK)
    first_plain = first_guarded = None
    for i, piece in enumerate(tokens(text)):
        plain.feed(piece)
        if (ph := plain.drain()) and first_plain is None:
            first_plain = (i, ph[0].text)
        guarded.feed(g.feed(piece))
        if (ph := guarded.drain()) and first_guarded is None:
            first_guarded = (i, ph[0].text)
        if g.stopped:
            break
    guarded.feed(g.finish())
    phrases = [p.text for p in guarded.flush()]
    assert first_guarded == first_plain == (first_plain[0], "The parking")
    assert not any("35" in p for p in phrases) and phrases[-1].endswith("sorry, I don't have that information.")


def test_a_loop_stops_at_the_repeat():
    g = ReplyGuard(KNOWN, FALLBACK)
    out = feed(g, tokens("I'm so sorry to hear about your trip. I'm so sorry to hear about your trip. I'm so"))
    assert out == "I'm so sorry to hear about your trip. " and g.stopped == "repeat"


def test_a_sentence_that_starts_alike_but_goes_on_differently_is_kept():
    g = ReplyGuard(KNOWN, FALLBACK)
    text = "Check-in begins at 3 PM. Check-in is at the front desk."
    assert feed(g, tokens(text)) == text and g.stopped is None


def test_a_long_run_said_twice_stops():
    g = ReplyGuard(KNOWN, FALLBACK)
    out = feed(g, tokens("we have rooms and we have views and rooms and we have rooms and we have views and more"))
    assert g.stopped == "repeat" and out.count("we have rooms and we have views") == 1


def test_nothing_is_handed_out_after_a_stop():
    g = ReplyGuard(KNOWN, FALLBACK)
    feed(g, tokens("It costs 99 dollars."))
    assert g.stopped and g.feed(" more") == "" and g.finish() == ""


@pytest.mark.parametrize("text, unit, most, after", [
    ("Sorry, I'm sorry, I'm sorry, I'm sorry, I'm sorry, I'm sorry, I'm sorry.", "sorry", 3, None),
    ("The dog is welcome welcome welcome welcome here.", "welcome", 2, "here"),
    ("Yes, it is a a a a good one.", " a ", 2, "good"),
])
def test_a_short_run_said_three_times_in_a_row_stops(text, unit, most, after):
    g = ReplyGuard(KNOWN, FALLBACK)
    out = feed(g, tokens(text))
    assert g.stopped == "repeat" and out.lower().count(unit) <= most and (after is None or after not in out)


def test_digits_read_out_and_a_word_said_twice_are_no_loop():
    g = ReplyGuard(knowledge("For emergencies call nine nine nine, or five five five, zero one one one.", ""), FALLBACK)
    text = "Call nine nine nine, or five five five, zero one one one. Bye bye."
    assert feed(g, tokens(text)) == text and g.stopped is None


def test_a_reply_cut_at_the_token_limit_drops_its_half_word():
    g = ReplyGuard(KNOWN, FALLBACK)
    said = g.feed("Check-in begins at 3 PM. From Tuesday, ch")
    assert said + g.finish(cut=True) == "Check-in begins at 3 PM. From Tuesday, " and g.stopped is None
    whole = ReplyGuard(KNOWN, FALLBACK)
    assert whole.feed("Check-in begins at 3 PM") + whole.finish() == "Check-in begins at 3 PM"  # a reply that ended
