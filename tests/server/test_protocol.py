"""The Realtime wire codec (server/realtime/) against the openai SDK's own types: every server event we build
validates with openai's pydantic model for its type (no extra fields anywhere), client events shaped by the
SDK's param TypedDicts parse, and bad input gives one clear error without stopping the session."""

from __future__ import annotations

import base64
import json

import numpy as np
import pydantic
import pytest
from openai.types import realtime as rt
from openai.types.realtime.conversation_item_create_event_param import ConversationItemCreateEventParam
from openai.types.realtime.conversation_item_truncate_event_param import ConversationItemTruncateEventParam
from openai.types.realtime.input_audio_buffer_append_event_param import InputAudioBufferAppendEventParam
from openai.types.realtime.realtime_server_event import ConversationItemRetrieved
from openai.types.realtime.response_cancel_event_param import ResponseCancelEventParam
from openai.types.realtime.response_create_event_param import ResponseCreateEventParam
from openai.types.realtime.session_update_event_param import SessionUpdateEventParam

from server import realtime as P
from server.realtime.events import EXTENSION_EVENTS
from voice.latency import TurnTrace, summarize

OPENAI_MODELS = {
    "session.created": rt.SessionCreatedEvent,
    "session.updated": rt.SessionUpdatedEvent,
    "input_audio_buffer.speech_started": rt.InputAudioBufferSpeechStartedEvent,
    "input_audio_buffer.speech_stopped": rt.InputAudioBufferSpeechStoppedEvent,
    "input_audio_buffer.committed": rt.InputAudioBufferCommittedEvent,
    "input_audio_buffer.cleared": rt.InputAudioBufferClearedEvent,
    "conversation.item.input_audio_transcription.completed": rt.ConversationItemInputAudioTranscriptionCompletedEvent,
    "response.created": rt.ResponseCreatedEvent,
    "response.output_audio.delta": rt.ResponseAudioDeltaEvent,
    "response.output_audio.done": rt.ResponseAudioDoneEvent,
    "response.output_audio_transcript.delta": rt.ResponseAudioTranscriptDeltaEvent,
    "response.output_audio_transcript.done": rt.ResponseAudioTranscriptDoneEvent,
    "response.output_text.delta": rt.ResponseTextDeltaEvent,
    "response.output_text.done": rt.ResponseTextDoneEvent,
    "response.done": rt.ResponseDoneEvent,
    "conversation.item.truncated": rt.ConversationItemTruncatedEvent,
    "error": rt.RealtimeErrorEvent,
    "conversation.item.added": rt.ConversationItemAdded,
    "conversation.item.done": rt.ConversationItemDone,
    "conversation.item.retrieved": ConversationItemRetrieved,
    "conversation.item.deleted": rt.ConversationItemDeletedEvent,
    "response.output_item.added": rt.ResponseOutputItemAddedEvent,
    "response.output_item.done": rt.ResponseOutputItemDoneEvent,
    "response.content_part.added": rt.ResponseContentPartAddedEvent,
    "response.content_part.done": rt.ResponseContentPartDoneEvent,
    "input_audio_buffer.timeout_triggered": rt.InputAudioBufferTimeoutTriggered,
    "response.function_call_arguments.delta": rt.ResponseFunctionCallArgumentsDeltaEvent,
    "response.function_call_arguments.done": rt.ResponseFunctionCallArgumentsDoneEvent,
}


def _extras(m, path="") -> list[str]:
    """Every field anywhere in a validated openai model that its schema does not declare."""
    out = []
    if isinstance(m, pydantic.BaseModel):
        out += [f"{path}.{k}" for k in (m.model_extra or {})]
        for k in type(m).model_fields:
            out += _extras(getattr(m, k), f"{path}.{k}")
    elif isinstance(m, list):
        for i, v in enumerate(m):
            out += _extras(v, f"{path}[{i}]")
    return out


def validate(ev: P.ServerEvent):
    """Validate the JSON text we would send with openai's model for its type, strictly: no extra fields,
    the same keys back when dumped, and the RealtimeServerEvent union agrees."""
    data = json.loads(ev.to_json())
    model = OPENAI_MODELS[data["type"]].model_validate(data)
    assert _extras(model) == []
    assert model.model_dump(mode="json", exclude_unset=True) == data
    union = pydantic.TypeAdapter(rt.RealtimeServerEvent).validate_python(data)
    assert type(union) is type(model)
    return model


def a_turn(proto: P.ProtocolSession) -> list:
    """The server events of one complete voice turn, in wire order."""
    pcm = (np.sin(np.arange(480) / 7) * 8000).astype(np.int16)
    evs = [proto.session_created(), proto.speech_started(1200)]
    user = evs[-1].item_id
    evs += [proto.speech_stopped(2600, user), proto.committed(user), proto.transcription_completed(user, "what time is it", 1.4),
            proto.response_created()]
    resp, item = evs[-1].response_id, proto.new_item_id()
    return evs + [proto.transcript_delta(resp, item, "It is "), proto.audio_delta(resp, item, pcm),
                  proto.audio_delta(resp, item, pcm.tobytes()), proto.audio_done(resp, item),
                  proto.transcript_done(resp, item, "It is noon."), proto.response_done(resp, item, "It is noon."), proto.cleared()]


def test_every_server_event_validates_with_openai_models():
    proto = P.ProtocolSession(ids=P.IdSource())
    evs = a_turn(proto)
    resp2 = proto.response_created()
    evs += [resp2, proto.response_done(resp2.response_id, proto.new_item_id(), "It is", cancelled=True, reason="turn_detected"),
            proto.response_done(proto.response_created().response_id, None, cancelled=True), proto.truncated("item_9", 640),
            proto.session_updated(), proto.error(P.ProtocolError("invalid_audio", "bad", "evt_client", "audio"))]
    user, said = proto.user_item("item_u", transcript=None), proto.user_item("item_u", transcript="what time is it")
    typed, bot = proto.user_item("item_t", text="Hello"), proto.assistant_item("item_a", None, "in_progress")
    spoken = proto.assistant_item("item_a", "It is noon.", "completed")
    items = [proto.item_added(user, None), proto.item_done(said, None), proto.item_added(typed, "item_u"),
             proto.item_done(typed, "item_u"), proto.output_item_added("resp_1", bot), proto.item_added(bot, "item_t"),
             proto.content_part_added("resp_1", "item_a"), proto.content_part_done("resp_1", "item_a", "It is noon."),
             proto.output_item_done("resp_1", spoken), proto.item_done(spoken, "item_t"), proto.item_retrieved(spoken),
             proto.item_deleted("item_a")]
    call = proto.function_call_item("item_c", "call_1", "get_weather", "", "in_progress")
    called = proto.function_call_item("item_c", "call_1", "get_weather", '{"city": "Paris"}', "completed")
    result = proto.function_output_item("item_o", "call_1", '{"sky": "sunny"}')
    items += [proto.output_item_added("resp_2", call), proto.item_added(call, "item_a"),
              proto.arguments_delta("resp_2", "item_c", 0, "call_1", '{"city": "Paris"}'),
              proto.arguments_done("resp_2", "item_c", 0, "call_1", "get_weather", '{"city": "Paris"}'),
              proto.output_item_done("resp_2", called), proto.item_done(called, "item_a"), proto.item_added(result, "item_c"),
              proto.response_done("resp_2", None, output=[called]), proto.timeout_triggered(1200, 6200, "item_i"),
              proto.response_done("resp_3", "item_b", "We", error="the LLM backend at http://x/v1 stopped mid-answer")]
    text = proto.assistant_item("item_x", "Noon.", "completed", text=True)
    items += [proto.content_part_added("resp_4", "item_x", text=True), proto.text_delta("resp_4", "item_x", "Noon."),
              proto.text_done("resp_4", "item_x", "Noon."), proto.content_part_done("resp_4", "item_x", "Noon.", text=True),
              proto.output_item_done("resp_4", text), proto.response_done("resp_4", None, output=[text], modalities=["text"])]
    covered = {validate(ev).type for ev in evs + items}
    assert covered == set(OPENAI_MODELS) == set(P.SERVER_EVENTS) - EXTENSION_EVENTS  # less our extensions
    failed = validate(items[-7]).response
    assert failed.status == "failed" and failed.status_details.error.code == "llm_backend_failed"
    assert validate(items[-9]).response.output[0].type == "function_call"
    answered = validate(items[-1]).response
    assert answered.output_modalities == ["text"] and answered.output[0].content[0].model_dump(exclude_none=True) == {
        "type": "output_text", "text": "Noon."}
    done = validate(evs[-5])
    assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
    assert done.response.output[0].content[0].transcript == "It is"
    err = validate(evs[-1])
    assert (err.error.code, err.error.event_id, err.error.param) == ("invalid_audio", "evt_client", "audio")


def test_ids_are_deterministic_and_conversation_order_tracked():
    evs = a_turn(P.ProtocolSession(ids=P.IdSource()))
    assert [e.event_id for e in evs] == [f"event_{i}" for i in range(1, len(evs) + 1)]
    again = a_turn(P.ProtocolSession(ids=P.IdSource()))
    assert [e.to_json() for e in evs] == [e.to_json() for e in again]
    _, started, _, committed, *_ = evs
    assert started.item_id == "item_1" and committed.item_id == "item_1" and committed.previous_item_id is None
    assert evs[5].response_id == "resp_1"
    proto = P.ProtocolSession(ids=P.IdSource(start=100))
    assert proto.committed().item_id == "item_100" and proto.committed().previous_item_id == "item_100"


def test_pcm_base64_round_trip():
    pcm = np.array([0, 1, -1, 32767, -32768, 1234], dtype=np.int16)
    text = P.encode_pcm(pcm)
    assert base64.b64decode(text) == pcm.astype("<i2").tobytes()
    assert np.array_equal(P.decode_pcm(text), pcm)
    proto = P.ProtocolSession(ids=P.IdSource())
    [ev] = proto.receive(json.dumps({"type": "input_audio_buffer.append", "audio": text}))
    assert isinstance(ev, P.InputAudioAppend) and ev.samples.dtype == np.int16 and ev.rate == 24000
    assert np.array_equal(ev.samples, pcm) and not ev.samples.flags.writeable
    delta = proto.audio_delta("resp_1", "item_1", pcm)
    assert np.array_equal(P.decode_pcm(delta.delta), pcm)


def _sdk_json(event) -> str:
    """What the SDK's realtime connection puts on the wire for a param dict (json.dumps of the TypedDict)."""
    return json.dumps(event)


def test_client_events_as_the_sdk_sends_them():
    proto = P.ProtocolSession(ids=P.IdSource())
    update: SessionUpdateEventParam = {
        "type": "session.update", "event_id": "c1",
        "session": {"type": "realtime", "instructions": "Be brief.", "output_modalities": ["audio"],
                    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                        "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 400,
                                                           "prefix_padding_ms": 200}},
                              "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}}}}
    append: InputAudioBufferAppendEventParam = {"type": "input_audio_buffer.append", "audio": P.encode_pcm(np.zeros(4, np.int16)),
                                                "event_id": "c2"}
    item: ConversationItemCreateEventParam = {"type": "conversation.item.create",
                                              "item": {"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": "Hello"}]}}
    create: ResponseCreateEventParam = {"type": "response.create", "response": {"instructions": "Answer in French."}}
    cancel: ResponseCancelEventParam = {"type": "response.cancel", "response_id": "resp_3"}
    trunc: ConversationItemTruncateEventParam = {"type": "conversation.item.truncate", "item_id": "item_2", "content_index": 0,
                                                 "audio_end_ms": 1500}
    msgs = [update, append, {"type": "input_audio_buffer.commit"}, {"type": "input_audio_buffer.clear", "event_id": "c3"}, item,
            create, {"type": "response.create"}, cancel, trunc, {"type": "output_audio.played", "sample": 48000, "response_id": "resp_3"},
            {"type": "session.latency"}]
    out = [ev for m in msgs for ev in proto.receive(_sdk_json(m))]
    assert [type(e) for e in out] == [P.SessionUpdate, P.InputAudioAppend, P.InputAudioCommit, P.InputAudioClear, P.ItemCreate,
                                      P.ResponseCreate, P.ResponseCreate, P.ResponseCancel, P.ItemTruncate, P.OutputAudioPlayed,
                                      P.SessionLatencyRequest]
    up = out[0]
    assert up.event_id == "c1" and up.changed == {"instructions", "output_modalities", "input_rate", "output_rate", "turn_detection",
                                                   "voice", "input_format", "output_format_type"}
    assert proto.config == up.config and up.config.voice == "marin" and up.config.instructions == "Be brief."
    assert up.config.turn_detection == P.TurnDetection(threshold=0.6, silence_duration_ms=400, prefix_padding_ms=200)
    assert out[1].event_id == "c2" and len(out[1].samples) == 4 and out[3].event_id == "c3"
    assert (out[4].text, out[4].item_id, out[4].previous_item_id) == ("Hello", "item_1", None)
    assert out[5].instructions == "Answer in French." and out[6].instructions is None
    assert out[7].response_id == "resp_3"
    assert (out[8].item_id, out[8].content_index, out[8].audio_end_ms) == ("item_2", 0, 1500)
    assert (out[9].sample, out[9].response_id, out[9].item_id) == (48000, "resp_3", None)
    updated = validate(proto.session_updated())
    assert updated.session.audio.output.voice == "marin" and updated.session.audio.input.turn_detection.threshold == 0.6
    assert proto.committed().previous_item_id == "item_1"  # the text item is the newest in the conversation


def test_session_update_partial_rate_and_vad_off():
    proto = P.ProtocolSession(ids=P.IdSource())
    [ev] = proto.receive(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "x"}}))
    assert ev.changed == {"instructions"} and ev.config.input_rate == 24000 and ev.config.turn_detection is not None
    [ev] = proto.receive(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}}))
    assert ev.config.input_rate == 16000 and ev.config.turn_detection is None and ev.config.instructions == "x"
    [app] = proto.receive(json.dumps({"type": "input_audio_buffer.append", "audio": P.encode_pcm(np.ones(2, np.int16))}))
    assert app.rate == 16000
    # turning VAD back on with only a type gives the defaults
    vad_on = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}}}
    [ev] = proto.receive(json.dumps(vad_on))
    assert ev.config.turn_detection == P.TurnDetection()
    # a rejected update changes nothing
    before = proto.config
    [err] = proto.receive(json.dumps({"type": "session.update", "event_id": "u9", "session": {
        "instructions": "changed", "audio": {"input": {"format": {"type": "audio/g729"}}}}}))
    assert isinstance(err, P.ProtocolError) and err.code == "unsupported_format" and err.event_id == "u9"
    assert proto.config == before


def test_semantic_vad_is_the_default_and_round_trips():
    proto = P.ProtocolSession(ids=P.IdSource())
    td = validate(proto.session_created()).session.audio.input.turn_detection
    assert td.type == "semantic_vad" and td.eagerness == "auto"
    [ev] = proto.receive(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
        "type": "semantic_vad", "eagerness": "high", "interrupt_response": False}}}}}))
    assert ev.config.turn_detection == P.TurnDetection(type="semantic_vad", eagerness="high", interrupt_response=False)
    wire = validate(proto.session_updated()).session.audio.input.turn_detection
    assert (wire.type, wire.eagerness, wire.interrupt_response) == ("semantic_vad", "high", False)
    assert "silence_duration_ms" not in json.loads(proto.session_updated().to_json())["session"]["audio"]["input"]["turn_detection"]
    [ev] = proto.receive(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 600}}}}}))
    assert ev.config.turn_detection == P.TurnDetection(silence_duration_ms=600)  # server_vad's own defaults


def test_response_metadata_is_read_and_echoed():
    proto = P.ProtocolSession(ids=P.IdSource())
    [ev] = proto.receive(json.dumps({"type": "response.create", "response": {"metadata": {"topic": "hours"}}}))
    assert ev.metadata == (("topic", "hours"),) and ev.instructions is None
    created = validate(proto.response_created(dict(ev.metadata)))
    done = validate(proto.response_done(created.response.id, "item_1", "Hi.", metadata=dict(ev.metadata)))
    assert created.response.metadata == done.response.metadata == {"topic": "hours"}
    from voice.llm import Usage

    used = validate(proto.response_done(created.response.id, "item_1", "Hi.", usage=Usage(480, 470, 9).to_realtime()))
    assert (used.response.usage.total_tokens, used.response.usage.input_token_details.cached_tokens) == (489, 470)
    assert "metadata" not in json.loads(proto.response_created().to_json())["response"]


def test_response_output_modalities_are_read():
    """``response.create``'s ``output_modalities`` (or the beta ``modalities``): this response's, instead of the session's."""
    proto = P.ProtocolSession(ids=P.IdSource())
    [ga, beta, none] = [proto.receive(json.dumps({"type": "response.create", "response": r}))[0]
                        for r in ({"output_modalities": ["text"]}, {"modalities": ["text", "text"]}, {})]
    assert (ga.output_modalities, beta.output_modalities, none.output_modalities) == (("text",), ("text",), None)
    [bad] = proto.receive(json.dumps({"type": "response.create", "response": {"output_modalities": ["video"]}}))
    assert (bad.code, bad.param) == ("invalid_value", "response.output_modalities")
    created = validate(proto.response_created(modalities=["text"]))
    assert created.response.output_modalities == ["text"] and proto.config.output_modalities == ("audio",)


def test_function_tools_are_kept_and_echoed_in_the_session():
    proto = P.ProtocolSession(ids=P.IdSource())
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    [ev] = proto.receive(json.dumps({"type": "session.update", "session": {"type": "realtime", "tools": [tool]}}))
    assert ev.changed == {"tools"} and ev.config.tools == (tool,)
    session = validate(proto.session_updated()).session
    assert session.tools[0].name == "get_weather" and session.tools[0].parameters["required"] == ["city"]
    [ev] = proto.receive(json.dumps({"type": "session.update", "session": {"tools": []}}))
    assert ev.config.tools == () and "tools" not in json.loads(proto.session_updated().to_json())["session"]
    assert session.tool_choice == "auto"
    [ev] = proto.receive(json.dumps({"type": "session.update", "session": {"tool_choice": {"type": "function", "name": "get_weather"}}}))
    assert ev.changed == {"tool_choice"} and ev.config.tool_choice == {"type": "function", "name": "get_weather"}
    assert validate(proto.session_updated()).session.tool_choice.name == "get_weather"
    [out] = proto.receive(json.dumps({"type": "conversation.item.create", "event_id": "e1", "item": {
        "type": "function_call_output", "call_id": "call_1", "output": '{"sky": "sunny"}'}}))
    assert out == P.FunctionOutputCreate(event_id="e1", item_id=out.item_id, call_id="call_1", output='{"sky": "sunny"}',
                                         previous_item_id=None)
    [rc] = proto.receive(json.dumps({"type": "response.create", "response": {"tool_choice": "none", "instructions": "Be brief."}}))
    assert (rc.tool_choice, rc.instructions) == ("none", "Be brief.")
    [r] = proto.receive(json.dumps({"type": "conversation.item.retrieve", "item_id": "item_7", "event_id": "e"}))
    [d] = proto.receive(json.dumps({"type": "conversation.item.delete", "item_id": "item_8"}))
    assert (r, d) == (P.ItemRetrieve(event_id="e", item_id="item_7"), P.ItemDelete(event_id=None, item_id="item_8"))


def _truncate(event_id: str, content_index, audio_end_ms) -> str:
    return json.dumps({"type": "conversation.item.truncate", "event_id": event_id, "item_id": "i", "content_index": content_index,
                       "audio_end_ms": audio_end_ms})


BAD = [
    ("not json", "{nope", "invalid_json", None, "not valid JSON"),
    ("json array", "[1, 2]", "invalid_event", None, "JSON object"),
    ("no type", '{"event_id": "e1"}', "missing_required_parameter", "e1", "'type'"),
    ("unknown type", '{"type": "response.frobnicate", "event_id": "e2"}', "unknown_event_type", "e2", "response.frobnicate"),
    ("beta name", '{"type": "response.audio.delta", "event_id": "e3"}', "unknown_event_type", "e3", "response.audio.delta"),
    ("missing audio", '{"type": "input_audio_buffer.append", "event_id": "e4"}', "missing_required_parameter", "e4", "'audio'"),
    ("odd length audio", json.dumps({"type": "input_audio_buffer.append", "event_id": "e5", "audio": base64.b64encode(b"abc").decode()}),
     "invalid_audio", "e5", "odd byte count"),
    ("bad base64", '{"type": "input_audio_buffer.append", "event_id": "e6", "audio": "@@@not base64"}', "invalid_audio", "e6", "base64"),
    ("audio not a string", '{"type": "input_audio_buffer.append", "event_id": "e7", "audio": 12}', "invalid_type", "e7", "'audio'"),
    ("truncate wrong type", _truncate("e8", 0, "10"), "invalid_type", "e8", "'audio_end_ms'"),
    ("truncate bool index", _truncate("e9", True, 10), "invalid_type", "e9", "'content_index'"),
    ("negative sample", '{"type": "output_audio.played", "event_id": "e10", "sample": -1}', "invalid_value", "e10", "'sample'"),
    ("session not object", '{"type": "session.update", "event_id": "e11", "session": "x"}', "invalid_type", "e11", "'session'"),
    ("vad threshold", '{"type": "session.update", "event_id": "e12", "session": {"audio": {"input": {"turn_detection": '
                      '{"type": "server_vad", "threshold": 3}}}}}', "invalid_value", "e12", "threshold"),
    ("semantic eagerness", '{"type": "session.update", "event_id": "e13", "session": {"audio": {"input": {"turn_detection": '
                           '{"type": "semantic_vad", "eagerness": "eager"}}}}}', "invalid_value", "e13", "eagerness"),
    ("other vad type", '{"type": "session.update", "event_id": "e13", "session": {"audio": {"input": {"turn_detection": '
                       '{"type": "push_to_talk"}}}}}', "unsupported_turn_detection", "e13", "push_to_talk"),
    ("rate out of range", '{"type": "session.update", "event_id": "e14", "session": {"audio": {"input": {"format": '
                          '{"type": "audio/pcm", "rate": 96000}}}}}', "invalid_value", "e14", "96000"),
    ("assistant item", '{"type": "conversation.item.create", "event_id": "e15", "item": {"type": "message", "role": "assistant", '
                       '"content": [{"type": "output_text", "text": "hi"}]}}', "unsupported_item", "e15", "assistant"),
    ("event_id not str", '{"type": "input_audio_buffer.commit", "event_id": 5}', "invalid_type", None, "'event_id'"),
    ("tool without name", '{"type": "session.update", "event_id": "e17", "session": {"tools": [{"type": "function"}]}}',
     "missing_required_parameter", "e17", "session.tools[0].name"),
    ("mcp tool", '{"type": "session.update", "event_id": "e18", "session": {"tools": [{"type": "mcp", "name": "x"}]}}',
     "unsupported_value", "e18", "mcp"),
    ("metadata not strings", '{"type": "response.create", "event_id": "e21", "response": {"metadata": {"n": 3}}}',
     "invalid_value", "e21", "response.metadata"),
    ("bad tool_choice", '{"type": "session.update", "event_id": "e22", "session": {"tool_choice": "sometimes"}}',
     "invalid_value", "e22", "session.tool_choice"),
    ("output without call_id", '{"type": "conversation.item.create", "event_id": "e23", "item": {"type": "function_call_output", '
                               '"output": "x"}}', "missing_required_parameter", "e23", "call_id"),
    ("response tool_choice", '{"type": "response.create", "event_id": "e24", "response": {"tool_choice": {"type": "function"}}}',
     "invalid_value", "e24", "response.tool_choice"),
    ("retrieve without id", '{"type": "conversation.item.retrieve", "event_id": "e19"}', "missing_required_parameter", "e19",
     "'item_id'"),
    ("delete id not str", '{"type": "conversation.item.delete", "event_id": "e20", "item_id": 3}', "invalid_type", "e20",
     "'item_id'"),
    ("oversize", json.dumps({"type": "input_audio_buffer.append", "event_id": "e16", "audio": "A" * 2000}), "message_too_large", None,
     "exceeds the limit of 1000 bytes"),
]


@pytest.mark.parametrize("text,code,event_id,needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_gives_one_clear_error_and_the_session_keeps_working(text, code, event_id, needle):
    proto = P.ProtocolSession(ids=P.IdSource(), max_message_bytes=1000)
    before = proto.config
    [err] = proto.receive(text)
    assert isinstance(err, P.ProtocolError)
    assert (err.code, err.event_id) == (code, event_id)
    assert needle in err.message, err.message
    assert proto.config == before
    wire = validate(proto.error(err))
    assert wire.error.event_id == event_id and wire.error.message == err.message
    [ok] = proto.receive(json.dumps({"type": "input_audio_buffer.append", "audio": P.encode_pcm(np.arange(8, dtype=np.int16))}))
    assert isinstance(ok, P.InputAudioAppend) and len(ok.samples) == 8


def test_bytes_and_non_ascii_text():
    proto = P.ProtocolSession(ids=P.IdSource(), max_message_bytes=200)
    msg = {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                        "content": [{"type": "input_text", "text": "Grüße 🎙"}]}}
    [ev] = proto.receive(json.dumps(msg, ensure_ascii=False).encode())
    assert ev.text == "Grüße 🎙"
    [err] = proto.receive(b"\xff\xfe{}")
    assert err.code == "invalid_json"
    # the limit counts UTF-8 bytes, not characters
    [err] = proto.receive(json.dumps({"type": "session.latency", "pad": "é" * 120}, ensure_ascii=False))
    assert err.code == "message_too_large"


def test_latency_extensions_carry_the_report_unchanged():
    proto = P.ProtocolSession(ids=P.IdSource())
    tr = TurnTrace(turn=1, budget_ms=500.0, transcript="hi", reply="hello")
    for name, t in [("speech_start", 0.0), ("last_voiced", 1.0), ("endpoint", 1.2), ("transcript", 1.25), ("first_token", 1.3),
                    ("first_phrase", 1.35), ("tts_first_audio", 1.4), ("answer_audio", 1.45), ("first_audio", 1.45)]:
        tr.mark(name, t)
    report = tr.report()
    ev = proto.turn_latency(report.to_dict())
    data = json.loads(ev.to_json())
    assert data == {"type": "turn.latency", "event_id": "event_1", "report": report.to_dict()}
    assert data["report"]["within_budget"] is True and data["report"]["latency_ms"]["voice_to_voice_ms"] == 450.0
    summary = summarize([report])
    assert json.loads(proto.session_latency(summary).to_json()) == {"type": "session.latency", "event_id": "event_2", "summary": summary}
    # an unanswered turn: overrun is null on the wire, not Infinity
    late = TurnTrace(turn=2, budget_ms=500.0)
    late.mark("last_voiced", 1.0)
    assert json.loads(proto.turn_latency(late.report().to_dict()).to_json())["report"]["overrun_ms"] is None


def test_events_are_frozen_and_slotted():
    proto = P.ProtocolSession(ids=P.IdSource())
    ev = proto.cleared()
    with pytest.raises(AttributeError):
        ev.event_id = "x"
    assert not hasattr(ev, "__dict__")
    [cmd] = proto.receive('{"type": "input_audio_buffer.commit"}')
    assert not hasattr(cmd, "__dict__")


def test_one_builder_checks_its_fields_against_the_table():
    proto = P.ProtocolSession(ids=P.IdSource())
    ev = proto.build("conversation.item.truncated", audio_end_ms=5, item_id="item_3", content_index=0)
    assert json.loads(ev.to_json()) == {"type": "conversation.item.truncated", "event_id": "event_1", "item_id": "item_3",
                                        "content_index": 0, "audio_end_ms": 5}  # the table's order, not the call's
    assert list(json.loads(ev.to_json())) == ["type", "event_id", "item_id", "content_index", "audio_end_ms"]
    assert (ev.item_id, ev.audio_end_ms) == ("item_3", 5)
    with pytest.raises(AttributeError, match="no field 'transcript'"):
        ev.transcript  # noqa: B018
    with pytest.raises(AttributeError):
        ev.response_id  # noqa: B018
    for bad in ({"item_id": "i", "content_index": 0}, {"item_id": "i", "content_index": 0, "audio_end_ms": 1, "extra": 2}):
        with pytest.raises(TypeError, match="conversation.item.truncated takes the fields"):
            proto.build("conversation.item.truncated", **bad)
    with pytest.raises(KeyError):
        proto.build("response.audio.delta")  # a beta name is not ours to send
    assert proto.ids("event") == "event_2"  # a rejected build spends no id
    created = proto.response_created()
    assert created.response_id == "resp_1" == proto.response_done(created.response_id, None).response_id
    assert proto.audio_done(created.response_id, "item_1").response_id == "resp_1"
