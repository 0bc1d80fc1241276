"""A grounded persona's social turns (thanks, hello, goodbye, a bare yes or okay) get a set reply, not the decline of
an off-topic question; anything with a question or a word of content still goes to the facts."""

from __future__ import annotations

import pytest

from voice.llm import SOCIAL_REPLIES, Persona, social_reply

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, reply", [
    ("Thank you.", "You're welcome!"), ("Thanks so much!", "You're welcome!"), ("That's all, thank you.", "You're welcome!"),
    ("Hi there", "Hello! How can I help?"), ("Good morning!", "Hello! How can I help?"),
    ("Thanks, bye!", "Goodbye, have a nice day!"), ("See you later", "Goodbye, have a nice day!"),
    ("Okay.", "Okay. Anything else I can help with?"), ("Yes, please.", "Okay. Anything else I can help with?"),
    ("No thanks.", "Okay. Anything else I can help with?"), ("No.", "Okay. Anything else I can help with?"),
])
def test_social_turns_get_their_set_reply(text, reply):
    assert social_reply(text) == reply


@pytest.mark.parametrize("text", ["Thank you, what time do you open?", "Do you deliver?", "Yes, I want two loaves.",
                                  "Hello, where are you located?", "Okay?", "", "Good bread"])
def test_anything_else_is_no_social_turn(text):
    assert social_reply(text) is None


def test_a_grounded_persona_says_the_set_reply_and_shows_no_fact():
    msgs, start = Persona().turn("Thank you.")
    assert start == "You're welcome!" and start in SOCIAL_REPLIES
    assert msgs[-1] == {"role": "system", "content": "Fact: none."}
    assert Persona(system="You are terse.").turn("Thank you.") == ([{"role": "user", "content": "Thank you."}], "")
