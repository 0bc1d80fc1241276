"""Property-based fuzzing of the sans-I/O codec (``server.realtime``): arbitrary JSON values, strings with lone
surrogates, near-valid events and random sequences of them.  For every message: no exception escapes
``receive``, it yields exactly one event or one ``ProtocolError``, a bad message yields an error, and whatever
the server would send back (the error event, the session object) is valid UTF-8 JSON."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.realtime import ProtocolError, ProtocolSession
from server.realtime.codec import invalid_unicode

EVENT_TYPES = ["session.update", "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear",
               "conversation.item.create", "response.create", "response.cancel", "conversation.item.truncate",
               "conversation.item.retrieve", "conversation.item.delete", "output_audio.played", "session.latency"]

#: text that includes lone surrogates (which JSON can escape) and everything else Unicode has
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
surrogate = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)


def near_valid_event():
    """An event of a real type with fields from the right names and arbitrary values."""
    fields = st.dictionaries(st.sampled_from(["event_id", "audio", "item", "session", "response", "response_id", "item_id",
                                              "content_index", "audio_end_ms", "sample", "instructions", "text"]),
                             json_values, max_size=4)
    return st.builds(lambda t, f: {**f, "type": t}, st.sampled_from(EVENT_TYPES), fields)


def valid_text_item(text):
    return {"type": "conversation.item.create", "event_id": "e1",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def check_reply(session: ProtocolSession, raw: str) -> list:
    out = session.receive(raw)
    assert len(out) == 1  # one event, or one error in its place
    for ev in out:
        if isinstance(ev, ProtocolError):
            frame = session.error(ev).to_json()
            frame.encode("utf-8")  # what goes on the wire is UTF-8 (a lone surrogate echoed back would raise here)
            assert json.loads(frame)["error"]["code"] == ev.code
    session.session_updated().to_json().encode("utf-8")  # the config in force is always sendable
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_value_gives_one_event_or_one_error(value):
    check_reply(ProtocolSession(), json.dumps(value))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_valid_event())
def test_near_valid_events_never_raise(msg):
    out = check_reply(ProtocolSession(), json.dumps(msg))
    if invalid_unicode(msg) is not None:
        assert isinstance(out[0], ProtocolError) and out[0].code == "invalid_unicode"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=6), surrogate, st.text(max_size=6), st.sampled_from(["event_id", "type", "instructions", "text"]))
def test_a_lone_surrogate_anywhere_is_one_invalid_unicode_error(before, bad, after, where):
    s = before + bad + after
    msg = {"type": "session.update", "session": {"type": "realtime", "instructions": "Hi."}}
    if where == "event_id":
        msg["event_id"] = s
    elif where == "type":
        msg["type"] = s
    elif where == "instructions":
        msg["session"]["instructions"] = s
    else:
        msg = valid_text_item(s)
    raw = json.dumps(msg)  # ensure_ascii: the surrogate travels as a \ud8xx escape, as a client would send it
    session = ProtocolSession()
    before_config = session.config
    (err,) = check_reply(session, raw)
    assert isinstance(err, ProtocolError) and err.code == "invalid_unicode" and err.type == "invalid_request_error"
    assert session.config == before_config  # nothing of the message was applied
    if where == "event_id":
        assert err.event_id is None  # not echoed
    elif where != "type":
        assert err.event_id is None or "\\" not in json.dumps(err.event_id)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(near_valid_event(), json_values, st.builds(valid_text_item, any_text)), min_size=1, max_size=15))
def test_random_event_sequences_keep_the_session_usable(messages):
    session = ProtocolSession()
    for m in messages:
        check_reply(session, json.dumps(m))
    # after any sequence, a good event still parses
    (ev,) = session.receive(json.dumps(valid_text_item("What are your hours?")))
    assert not isinstance(ev, ProtocolError) and ev.text == "What are your hours?"


def test_raw_text_that_is_not_json_or_too_large():
    session = ProtocolSession(max_message_bytes=64)
    assert check_reply(session, "{\"type\": ")[0].code == "invalid_json"
    assert check_reply(session, "x" * 65)[0].code == "message_too_large"
    deep = "[" * 100_000 + "]" * 100_000  # nesting past Python's recursion limit
    assert check_reply(ProtocolSession(), deep)[0].code == "invalid_json"
