"""The Realtime conversation machine (server/realtime/machine.py) alone: typed client events and loop events in, server
events out, with a stand-in for the voice loop; no engines, threads or sockets.  Every server event it sends validates
with the openai SDK's own models."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pydantic
import pytest
from openai.types import realtime as rt

from server import realtime as P
from server.realtime import events as E
from server.realtime.events import EXTENSION_EVENTS
from server.realtime.machine import (
    HANDLERS,
    INPUTS,
    LIVE,
    MAX_ITEMS,
    TRANSITIONS,
    AudioOut,
    RealtimeConversation,
    ResponseState,
    handler_table,
)
from voice import loop_events as L
from voice.latency import TurnTrace
from voice.protocols import FunctionCallPiece
from voice.turns import IllegalTransition

SERVER_EVENT = pydantic.TypeAdapter(rt.RealtimeServerEvent)


class StandInVoice:
    """The machine's ``Voice``: records what it was asked; ``on_cancel`` plays the loop ending the turn at once."""

    def __init__(self):
        self.answering = False
        self.turn_detection = True
        self.create_response = True
        self.calls_tools = False
        self.refuse_update: E.ProtocolError | None = None
        self.busy = False
        self.need, self.n_ctx = 100, 2048
        self.committable = False
        self.on_cancel = None
        self.tail = np.zeros(0, np.int16)
        self.asked: list[tuple] = []
        self.spoken: list[bool] = []  # each respond()'s audio (False: text only)

    def update(self, ev):
        self.asked.append(("update", ev.changed))
        return self.refuse_update

    def feed(self, ev):
        self.asked.append(("feed", len(ev.samples)))
        return []

    def commit_input(self):
        return self.committable

    def clear_input(self):
        self.asked.append(("clear",))

    def add_function_output(self, call_id, output):
        self.asked.append(("function_output", call_id, output))

    def prompt_tokens(self, text, instructions):
        return self.need, self.n_ctx

    def respond(self, text, instructions, tool_choice, audio):
        self.asked.append(("respond", text, instructions, tool_choice))
        self.spoken.append(audio)
        return not self.busy

    def cancel(self, reason):
        self.asked.append(("cancel", reason))
        if self.on_cancel is None:
            return False
        self.on_cancel(reason)
        return True

    def amend_reply(self, heard):
        self.asked.append(("amend", heard))

    def flush_output(self):
        return self.tail

    def usage(self):
        return None

    def since_voiced_ms(self, sample):
        return 700.0

    def reports(self):
        return []


class Scene:
    """A machine, its stand-in voice, and the wire: what it sent, in order."""

    def __init__(self, validate: bool = True, **kw):
        self.validate = validate
        self.voice = StandInVoice()
        self.m = RealtimeConversation(P.ProtocolSession(ids=P.IdSource()), self.voice, **kw)
        self.wire: list = []

    def client(self, **msg) -> list:
        out = []
        for ev in self.m.proto.receive(json.dumps(msg)):
            out += self.m.handle(ev)
        return self._sent(out)

    def loop(self, ev) -> list:
        return self._sent(self.m.on_loop_event(ev))

    def play(self, n: int) -> list:
        return self._sent(self.m.audio(np.ones(n, np.int16)))

    def _sent(self, out: list) -> list:
        self.wire += out
        for ev in out:
            if self.validate and not isinstance(ev, AudioOut) and ev.type not in EXTENSION_EVENTS:
                SERVER_EVENT.validate_python(json.loads(ev.to_json()))
        return out

    def answer(self, text: str, samples: int = 4800) -> str:
        """A response in progress with one phrase of ``samples``; returns its item id."""
        self.loop(L.ResponseStarted())
        self.loop(L.PhraseStarted(index=0, text=text, start_s=0.0))
        self.play(samples)
        return self.m.current.item_id


def types(out: list) -> list[str]:
    return ["audio" if isinstance(ev, AudioOut) else ev.type for ev in out]


def ended(spoken: str = "", reason: str | None = None, report=None, error: str | None = None) -> L.TurnEnded:
    return L.TurnEnded(transcript="", spoken=spoken, reason=reason, report=report, error=error)


def error(out: list) -> dict:
    [err] = [ev.error for ev in out if not isinstance(ev, AudioOut) and ev.type == "error"]
    return err


# -- dispatch ----------------------------------------------------------------------------------------------------------


def test_every_input_type_has_exactly_one_handler_with_its_signature():
    client_types = {c for c in vars(E).values() if isinstance(c, type) and hasattr(c, "TYPE") and not c.__name__.startswith("_")}
    assert client_types == set(INPUTS) - {E.ProtocolError} - set(L.LoopEvent.__args__)
    assert set(HANDLERS) == set(INPUTS) and len(INPUTS) == len(set(INPUTS))
    parsed = {cls.TYPE for cls in client_types}
    assert parsed == set(P.ProtocolSession._PARSERS)  # every event the codec yields has its class (and so its handler)

    class Missing:
        def _on_commit(self, ev: E.InputAudioCommit) -> None: ...

    class Twice(Missing):
        def _on_commit(self, ev: E.InputAudioCommit) -> None: ...

        def _on_commit_again(self, ev: E.InputAudioCommit) -> None: ...

    class Wrong:
        def _on_commit(self, ev: E.InputAudioCommit, extra: int) -> None: ...

    class Other:
        def _on_commit(self, ev: str) -> None: ...

    with pytest.raises(TypeError, match="no handler for"):
        handler_table(Missing, (E.InputAudioCommit, E.InputAudioClear))
    with pytest.raises(TypeError, match="two handlers"):
        handler_table(Twice, (E.InputAudioCommit,))
    with pytest.raises(TypeError, match="must be"):
        handler_table(Wrong, (E.InputAudioCommit,))
    with pytest.raises(TypeError, match="not an input"):
        handler_table(Other, (E.InputAudioCommit,))


def test_response_states_move_only_along_the_table():
    assert {to for (_, _), to in TRANSITIONS.items()} == set(ResponseState)
    assert LIVE == {ResponseState.REQUESTED, ResponseState.IN_PROGRESS}
    s = Scene()
    with pytest.raises(IllegalTransition):
        s.m._move("completed")  # no response to complete
    s.loop(L.ResponseStarted())
    with pytest.raises(IllegalTransition):
        s.loop(L.ResponseStarted())  # a second response while one is in progress: a bug in the caller


# -- a typed turn, a spoken turn ---------------------------------------------------------------------------------------


def test_a_typed_turn_from_item_to_response_done():
    s = Scene()
    assert types(s.client(type="conversation.item.create", item={"type": "message", "role": "user",
                                                                 "content": [{"type": "input_text", "text": "Hours?"}]})) \
        == ["conversation.item.added", "conversation.item.done"]
    assert s.client(type="response.create", response={"metadata": {"topic": "hours"}, "instructions": "Be brief."}) == []
    assert s.voice.asked[-1] == ("respond", "Hours?", "Be brief.", None)
    assert s.m.current.state is ResponseState.REQUESTED
    [created] = s.loop(L.ResponseStarted())
    assert created.response["metadata"] == {"topic": "hours"} and s.m.current.state is ResponseState.IN_PROGRESS
    assert types(s.loop(L.PhraseStarted(index=0, text="Nine to five.", start_s=0.0))) == [
        "response.output_item.added", "conversation.item.added", "response.content_part.added", "response.output_audio_transcript.delta"]
    [audio] = s.play(4800)
    assert (audio.response_id, audio.item_id, audio.output_index, len(audio.pcm)) == (created.response_id, "item_2", 0, 4800)
    s.voice.tail = np.ones(7, np.int16)
    out = s.loop(ended("Nine to five."))
    assert types(out) == ["audio", "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
                          "response.output_item.done", "conversation.item.done", "response.done"]
    assert len(out[0].pcm) == 7 and s.m.current is None
    done = out[-1].response
    assert (done["status"], done["metadata"], done["output"][0]["content"][0]["transcript"]) == ("completed", {"topic": "hours"},
                                                                                                 "Nine to five.")
    assert [e.item["id"] for e in s.wire if not isinstance(e, AudioOut) and e.type == "conversation.item.added"] == ["item_1", "item_2"]
    assert s.m.audio(np.ones(10, np.int16)) == []  # no response: audio is not the client's


def test_a_spoken_turn_and_its_latency_on_both_clocks():
    s = Scene(extensions=True)
    [started] = s.loop(L.UserSpeechStarted(first_voiced_sample=16000, barge_in=False))
    assert started.audio_start_ms == 1000
    out = s.loop(L.UserSpeechStopped(first_voiced_sample=16000, last_voiced_sample=32000, endpoint_sample=36000))
    assert types(out) == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.added"]
    assert out[0].item_id == started.item_id and out[0].audio_end_ms == 2000
    out = s.loop(L.TranscriptFinal(text="what time is it"))
    assert out[0].usage == {"type": "duration", "seconds": 1.0} and out[1].item["content"][0]["transcript"] == "what time is it"
    item = s.answer("It is noon.", samples=24000)
    tr = TurnTrace(turn=1, budget_ms=500.0, transcript="what time is it", reply="It is noon.")
    for name, t in [("speech_start", 1.0), ("last_voiced", 2.0), ("endpoint", 2.2), ("transcript", 2.25), ("first_token", 2.3),
                    ("first_phrase", 2.35), ("tts_first_audio", 2.4), ("answer_audio", 2.45), ("first_audio", 2.45)]:
        tr.mark(name, t)
    out = s.loop(ended("It is noon.", report=tr.report()))
    assert types(out)[-2:] == ["response.done", "turn.latency"] and "client" not in out[-1].report
    # the client heard the first answer sample 0.1 s into it; it had sent 2.5 s of input (24 kHz) by then
    [again] = s.client(type="output_audio.played", sample=2400, item_id=item, input_sample=60000)
    assert again.report["client"] == {"voice_to_voice_ms": 400.0, "clock": "client_audio", "overhead_ms": -50.0}
    assert s.client(type="output_audio.played", sample=2400, item_id=item) == []  # once per response
    [summary] = s.client(type="session.latency")
    assert summary.summary["client_voice_to_voice_ms"] == {"p50": 400.0, "p95": 400.0, "turns": 1}


def test_a_request_that_ends_unanswered_leaves_nothing_behind():
    s = Scene()
    s.client(type="conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "…"}]})
    s.client(type="response.create", response={"metadata": {"a": "b"}})
    assert s.loop(ended()) == [] and s.m.current is None  # (text without words: the loop answers nothing)
    [created] = s.loop(L.ResponseStarted())  # the next response is not the request's
    assert "metadata" not in created.response


# -- cancel, truncate, barge-in: the loop ends the turn inside the call ------------------------------------------------


def test_cancel_and_truncate_end_the_response_inside_the_call_in_wire_order():
    s = Scene()  # every event validated with openai's types: a truncate ends the response as "client_cancelled"
    s.voice.on_cancel = lambda reason: s.loop(ended("It is", reason=reason))
    item = s.answer("It is noon now.", samples=4800)
    rid = s.m.current.id
    assert error(s.client(type="response.cancel", response_id="resp_9"))["code"] == "response_not_found"
    s.wire.clear()
    # half the audio heard: the client truncates the answer in progress
    out = s.client(type="conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=100)
    assert s.voice.asked[-2:] == [("cancel", "client_cancelled"), ("amend", "It is")]
    assert types(s.wire) == ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
                             "response.output_item.done", "conversation.item.done", "response.done", "conversation.item.truncated"]
    assert out == s.wire[-1:]  # the rest was sent from inside the call, first
    done = s.wire[-2].response
    assert (done["id"], done["status"], done["status_details"]["reason"]) == (rid, "cancelled", "client_cancelled")
    [retrieved] = s.client(type="conversation.item.retrieve", item_id=item)
    assert (retrieved.item["status"], retrieved.item["content"][0]["transcript"]) == ("incomplete", "It is")
    err = error(s.client(type="conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=1000))
    assert (err["code"], err["param"]) == ("invalid_value", "audio_end_ms")  # past its 200 ms of audio
    s.voice.on_cancel = None
    assert error(s.client(type="response.cancel"))["code"] == "response_cancel_not_active"


def test_a_failed_backend_fails_the_response():
    s = Scene()
    s.answer("We")
    out = s.loop(ended("We", reason="failed", error="the backend stopped"))
    assert error(out)["code"] == "llm_backend_failed"
    assert out[-1].response["status"] == "failed" and out[-1].response["output"][0]["status"] == "incomplete"


# -- tools -------------------------------------------------------------------------------------------------------------


def test_tool_calls_become_function_call_items_and_their_output_goes_on():
    s = Scene()
    s.voice.calls_tools = True
    s.loop(L.ResponseStarted())
    for piece in (FunctionCallPiece("call_1", "get_weather", '{"city": ', '{"city": ', False),
                  FunctionCallPiece("call_1", "get_weather", '"Paris"}', '{"city": "Paris"}', True)):
        s.loop(L.FunctionCallDelta(piece))
    assert types(s.wire[1:]) == ["response.output_item.added", "conversation.item.added", "response.function_call_arguments.delta",
                                 "response.function_call_arguments.delta", "response.function_call_arguments.done",
                                 "response.output_item.done", "conversation.item.done"]
    out = s.loop(ended(reason=None))
    assert types(out) == ["response.done"]  # a response that only called a tool has no message
    [call] = out[0].response["output"]
    assert (call["type"], call["status"], call["arguments"]) == ("function_call", "completed", '{"city": "Paris"}')
    out = s.client(type="conversation.item.create", item={"type": "function_call_output", "call_id": "call_1", "output": "sunny"})
    assert types(out) == ["conversation.item.added", "conversation.item.done"] and out[0].previous_item_id == call["id"]
    assert s.client(type="response.create", response={"tool_choice": "none"}) == []
    assert s.voice.asked[-2:] == [("function_output", "call_1", "sunny"), ("respond", None, None, "none")]


def test_tools_the_model_cannot_call_are_said_so():
    s = Scene()
    out = s.client(type="session.update", session={"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]})
    assert types(out) == ["error", "session.updated"] and error(out)["code"] == "tools_not_supported"
    out = s.client(type="conversation.item.create", item={"type": "function_call_output", "call_id": "c", "output": "x"})
    assert error(out)["code"] == "unsupported_item"


# -- refusals ----------------------------------------------------------------------------------------------------------


def test_refusals_name_the_problem_and_change_nothing():
    s = Scene()
    before = s.m.proto.config
    s.voice.refuse_update = E.ProtocolError("context_length_exceeded", "too long", "u1", "session.instructions")
    out = s.client(type="session.update", event_id="u1", session={"instructions": "x" * 50})
    assert types(out) == ["error"] and s.m.proto.config == before  # the codec's config goes back to the one in force
    assert error(s.client(type="response.create"))["code"] == "no_user_input"
    assert error(s.client(type="input_audio_buffer.commit"))["message"] == "nothing to commit: the input buffer is empty"
    text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
    s.client(type="conversation.item.create", item=text)
    s.voice.need = 5000
    err = error(s.client(type="response.create", event_id="r1"))
    assert (err["code"], err["event_id"]) == ("context_length_exceeded", "r1")
    assert error(s.client(type="response.create"))["code"] == "no_user_input"  # the text was dropped with it
    s.voice.need, s.voice.busy = 100, True
    s.client(type="conversation.item.create", item=text)
    assert error(s.client(type="response.create"))["code"] == "conversation_already_has_active_response"
    assert s.m.current is None
    err = error(s.client(type="conversation.item.create", item=dict(text, content=[{"type": "input_text", "text": "x" * 40_000}])))
    assert err["code"] == "context_length_exceeded" and err["param"] == "item.content"
    assert types(s.client(type="input_audio_buffer.clear")) == ["input_audio_buffer.cleared"]
    s.client(type="input_audio_buffer.append", audio=P.encode_pcm(np.zeros(4, np.int16)))
    assert s.voice.asked[-2:] == [("clear",), ("feed", 4)]


def test_items_are_kept_retrieved_and_deleted():
    s = Scene()
    for i in range(MAX_ITEMS + 1):
        s.client(type="conversation.item.create", item={"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                                                          "text": str(i)}]})
    assert error(s.client(type="conversation.item.retrieve", item_id="item_1"))["code"] == "item_not_found"  # the oldest, forgotten
    [got] = s.client(type="conversation.item.retrieve", item_id="item_2")
    assert got.item["content"][0]["text"] == "1"
    assert types(s.client(type="conversation.item.delete", item_id="item_2")) == ["conversation.item.deleted"]
    assert error(s.client(type="conversation.item.delete", item_id="item_2"))["code"] == "item_not_found"
    item = s.answer("Hi.")
    err = error(s.client(type="conversation.item.delete", item_id=item))
    assert err["code"] == "conversation_already_has_active_response"


def test_loop_voice_and_the_stand_in_have_what_the_machine_asks():
    from server.realtime.loop_voice import LoopVoice
    from server.realtime.machine import Voice

    members = [m for m in vars(Voice) if not m.startswith("_")]
    assert "respond" in members and "answering" in members
    for cls in (LoopVoice, StandInVoice):
        for m in members:
            want = getattr(Voice, m)
            if isinstance(want, property):
                assert isinstance(getattr(cls, m, None), property) or cls is StandInVoice, (cls, m)
            else:
                assert list(inspect.signature(getattr(cls, m)).parameters) == list(inspect.signature(want).parameters), (cls, m)


# -- text-only output ---------------------------------------------------------------------------------------------------


def test_a_text_only_session_answers_in_output_text_only():
    """``output_modalities: ["text"]``: the loop is asked for text only, and the answer's phrases go out as
    ``response.output_text.*`` in an ``output_text`` part; no audio event of any kind."""
    s = Scene()
    out = s.client(type="session.update", session={"output_modalities": ["text"]})
    assert types(out) == ["session.updated"] and out[0].session["output_modalities"] == ["text"]
    s.client(type="conversation.item.create", item={"type": "message", "role": "user",
                                                    "content": [{"type": "input_text", "text": "Hours?"}]})
    s.client(type="response.create")
    assert s.voice.spoken == [False]
    s.wire.clear()
    [created] = s.loop(L.ResponseStarted(audio=False))
    assert created.response["output_modalities"] == ["text"]
    out = s.loop(L.PhraseStarted(index=0, text="Nine", start_s=0.0)) + s.loop(L.PhraseStarted(index=1, text="to five.", start_s=0.0))
    assert types(out) == ["response.output_item.added", "conversation.item.added", "response.content_part.added",
                          "response.output_text.delta", "response.output_text.delta"]
    assert out[2].part == {"type": "text", "text": ""} and [e.delta for e in out[3:]] == ["Nine", " to five."]
    assert s.m.audio(np.ones(10, np.int16)) == []  # (a text response has no audio, whatever is played)
    s.voice.tail = np.ones(7, np.int16)
    out = s.loop(ended("Nine to five."))
    assert types(out) == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "conversation.item.done", "response.done"]
    assert out[0].text == "".join(e.delta for e in s.wire if e.type == "response.output_text.delta") == "Nine to five."
    assert out[1].part == {"type": "text", "text": "Nine to five."}
    done = out[-1].response
    assert done["output_modalities"] == ["text"] and done["output"][0]["content"] == [{"type": "output_text", "text": "Nine to five."}]
    assert not [e for e in s.wire if isinstance(e, AudioOut) or "audio" in e.type]
    item = done["output"][0]["id"]
    [got] = s.client(type="conversation.item.retrieve", item_id=item)
    assert got.item["content"] == [{"type": "output_text", "text": "Nine to five."}]
    err = error(s.client(type="conversation.item.truncate", item_id=item, content_index=0, audio_end_ms=0))
    assert (err["code"], err["param"]) == ("invalid_value", "item_id")  # only audio is truncated


def test_response_create_output_modalities_are_that_responses_own():
    """``response.create``'s ``output_modalities`` (or the beta ``modalities``) override the session's for that response."""
    s = Scene()
    text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hours?"}]}
    for params, spoken in (({"output_modalities": ["text"]}, False), ({"modalities": ["text"]}, False), ({}, True),
                           ({"output_modalities": ["audio"]}, True)):
        s.client(type="conversation.item.create", item=text)
        s.client(type="response.create", response=params)
        assert s.voice.spoken[-1] is spoken
        [created] = s.loop(L.ResponseStarted(audio=spoken))
        assert created.response["output_modalities"] == (["audio"] if spoken else ["text"])
        out = s.loop(L.PhraseStarted(index=0, text="Nine.", start_s=0.0))
        assert types(out)[-1] == ("response.output_audio_transcript.delta" if spoken else "response.output_text.delta")
        done = s.loop(ended("Nine."))[-1].response
        assert done["output"][0]["content"][0]["type"] == ("output_audio" if spoken else "output_text")
    s.client(type="session.update", session={"output_modalities": ["text"]})
    s.client(type="conversation.item.create", item=text)
    s.client(type="response.create", response={"output_modalities": ["audio"]})  # a text session, one spoken answer
    assert s.voice.spoken[-1] is True
