"""The events of the Realtime wire, as the codec (``server.realtime.codec``) yields and builds them.

Owns: the typed client events ``ProtocolSession.receive`` returns (one frozen, slotted dataclass per client
event type, each with its wire name as ``TYPE``; the ``ClientEvent`` union), ``ProtocolError`` (a client
message we could not accept), and the server events: ``SERVER_EVENTS``, the one table of server event type
-> its fields in wire order with the exact field names of ``openai.types.realtime``, and ``ServerEvent``, the
one class every built server event is.

Our extensions, in the same style: client ``output_audio.played`` (``sample``: index, in output samples
since the session began, of the sample the client has started playing; optional ``response_id``,
``item_id``, and ``input_sample``: how many input samples the client had sent at that moment, which
puts voice-to-voice on the client's own audio clock) and ``session.latency`` (a request); server
``turn.latency`` (``report``: exactly ``voice.latency.TurnReport.to_dict()``) and ``session.latency``
(``summary``, e.g. ``voice.latency.summarize(...)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import numpy as np

from .config import SessionConfig

# --------------------------------------------------------------------------- client events


@dataclass(frozen=True, slots=True)
class _ClientEvent:
    """What every client event has: its wire name (``TYPE``) and the client's ``event_id``."""

    TYPE: ClassVar[str]
    event_id: str | None


@dataclass(frozen=True, slots=True)
class _ItemEvent(_ClientEvent):
    """A client event about one conversation item."""

    item_id: str


@dataclass(frozen=True, slots=True)
class _NewItem(_ItemEvent):
    """A ``conversation.item.create``: ``item_id`` is the client's or one we assigned."""

    TYPE: ClassVar[str] = "conversation.item.create"
    previous_item_id: str | None


@dataclass(frozen=True, slots=True)
class SessionUpdate(_ClientEvent):
    TYPE: ClassVar[str] = "session.update"
    config: SessionConfig  # the new effective configuration, already applied
    changed: frozenset[str]  # SessionConfig field names the update touched


@dataclass(frozen=True, slots=True, eq=False)
class InputAudioAppend(_ClientEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.append"
    samples: np.ndarray  # int16, read-only
    rate: int  # the session's input rate when the chunk arrived


@dataclass(frozen=True, slots=True)
class InputAudioCommit(_ClientEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.commit"


@dataclass(frozen=True, slots=True)
class InputAudioClear(_ClientEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.clear"


@dataclass(frozen=True, slots=True)
class ItemCreate(_NewItem):
    """A user text message."""

    text: str


@dataclass(frozen=True, slots=True)
class FunctionOutputCreate(_NewItem):
    """A tool's result (an item of type ``function_call_output``)."""

    call_id: str
    output: str


@dataclass(frozen=True, slots=True)
class ResponseCreate(_ClientEvent):
    TYPE: ClassVar[str] = "response.create"
    instructions: str | None  # this response's instructions instead of the session's; other params are ignored
    metadata: tuple[tuple[str, str], ...] | None = None  # echoed in the response object (pairs: the event is frozen)
    tool_choice: str | dict | None = None  # this response's, instead of the session's
    #: this response's output modalities (``response.output_modalities``, or the beta ``modalities``) instead of the
    #: session's: ("text",) answers in text only, with no audio
    output_modalities: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ResponseCancel(_ClientEvent):
    TYPE: ClassVar[str] = "response.cancel"
    response_id: str | None


@dataclass(frozen=True, slots=True)
class ItemTruncate(_ItemEvent):
    TYPE: ClassVar[str] = "conversation.item.truncate"
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class ItemRetrieve(_ItemEvent):
    TYPE: ClassVar[str] = "conversation.item.retrieve"


@dataclass(frozen=True, slots=True)
class ItemDelete(_ItemEvent):
    TYPE: ClassVar[str] = "conversation.item.delete"


@dataclass(frozen=True, slots=True)
class OutputAudioPlayed(_ClientEvent):
    """Our extension: the client has started playing output sample ``sample`` (counted since session start)."""

    TYPE: ClassVar[str] = "output_audio.played"
    sample: int
    response_id: str | None
    item_id: str | None
    input_sample: int | None = None  # input samples the client had sent when it started playing ``sample``


@dataclass(frozen=True, slots=True)
class SessionLatencyRequest(_ClientEvent):
    """Our extension: the client asks for a ``session.latency`` summary."""

    TYPE: ClassVar[str] = "session.latency"


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """A client message we could not accept; answer it with ``ProtocolSession.error``."""

    code: str
    message: str
    event_id: str | None = None
    param: str | None = None
    type: str = "invalid_request_error"


ClientEvent: TypeAlias = (SessionUpdate | InputAudioAppend | InputAudioCommit | InputAudioClear | ItemCreate | FunctionOutputCreate
                          | ResponseCreate | ResponseCancel | ItemTruncate | ItemRetrieve | ItemDelete | OutputAudioPlayed
                          | SessionLatencyRequest)


# --------------------------------------------------------------------------- server events

_PART = ("response_id", "item_id", "output_index", "content_index")  # where in a response an output content part is

SERVER_EVENTS: dict[str, tuple[str, ...]] = {
    # type: its fields after ``type`` and ``event_id``, in wire order
    "session.created": ("session",),  # SessionConfig.to_dict()
    "session.updated": ("session",),
    "input_audio_buffer.speech_started": ("audio_start_ms", "item_id"),
    "input_audio_buffer.speech_stopped": ("audio_end_ms", "item_id"),
    "input_audio_buffer.committed": ("item_id", "previous_item_id"),
    "input_audio_buffer.cleared": (),
    "input_audio_buffer.timeout_triggered": ("audio_start_ms", "audio_end_ms", "item_id"),  # turn_detection.idle_timeout_ms
    # usage, required by openai: {"type": "duration", "seconds": ...}
    "conversation.item.input_audio_transcription.completed": ("item_id", "content_index", "transcript", "usage"),
    # the item lifecycle: a realtime.item object (``item``) as it is added, and again when it is done
    "conversation.item.added": ("previous_item_id", "item"),
    "conversation.item.done": ("previous_item_id", "item"),
    "conversation.item.retrieved": ("item",),
    "conversation.item.deleted": ("item_id",),
    "response.created": ("response",),  # a realtime.response object
    "response.output_item.added": ("response_id", "output_index", "item"),
    "response.output_item.done": ("response_id", "output_index", "item"),
    "response.content_part.added": (*_PART, "part"),  # part: {"type": "audio", "transcript": ...} or {"type": "text", "text": ...}
    "response.content_part.done": (*_PART, "part"),
    "response.output_audio.delta": (*_PART, "delta"),  # delta: base64 PCM16
    "response.output_audio.done": _PART,
    "response.output_audio_transcript.delta": (*_PART, "delta"),
    "response.output_audio_transcript.done": (*_PART, "transcript"),
    # a text-only response's message (output_modalities ["text"]): its output_text content part, as it streams
    "response.output_text.delta": (*_PART, "delta"),
    "response.output_text.done": (*_PART, "text"),
    # a function_call item's arguments, as they stream (an OpenAI-compatible backend's tool call)
    "response.function_call_arguments.delta": ("response_id", "item_id", "output_index", "call_id", "delta"),
    "response.function_call_arguments.done": ("response_id", "item_id", "output_index", "call_id", "name", "arguments"),
    "response.done": ("response",),
    "conversation.item.truncated": ("item_id", "content_index", "audio_end_ms"),
    "error": ("error",),  # RealtimeError: type, code, message, param, event_id (the client's)
    "turn.latency": ("report",),  # our extension: one turn's report, exactly TurnReport.to_dict()
    "session.latency": ("summary",),  # our extension: the session's latency summary
    # our extension: the user's speech over the answer is being judged (voice.overlap) from audio_start_ms; it ends as
    # an interruption (input_audio_buffer.speech_started, then the response cancelled) or as output_audio.resumed
    "output_audio.paused": ("audio_start_ms",),
    "output_audio.resumed": ("kind", "text"),  # our extension: it was no turn ("backchannel", "noise"); the answer goes on
}


#: the server events that are ours, not the Realtime API's (only a client that asked for our extensions gets them)
EXTENSION_EVENTS = frozenset({"turn.latency", "session.latency", "output_audio.paused", "output_audio.resumed"})


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """One server event: ``type`` (a key of ``SERVER_EVENTS``), our ``event_id``, and ``data``, its fields in
    wire order.  The fields read as attributes too (``ev.item_id``); ``.to_json()`` is the text to send.
    Built by ``ProtocolSession.build``, which checks ``data`` against the table."""

    type: str
    event_id: str
    data: dict[str, Any]

    def __getattr__(self, name: str) -> Any:  # only called when ``name`` is not a slot, method or property
        if name.startswith("_") or name == "data":  # never look into ``data`` while it is not set (copy, pickle)
            raise AttributeError(name)
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(f"a {self.type} event has no field {name!r}") from None

    @property
    def response_id(self) -> str:
        """The response this event belongs to: its ``response_id`` field, or its ``response`` object's id."""
        if "response_id" in self.data:
            return self.data["response_id"]
        if "response" in self.data:
            return self.data["response"]["id"]
        raise AttributeError(f"a {self.type} event has no field 'response_id'")

    def to_dict(self) -> dict:
        return {"type": self.type, "event_id": self.event_id, **self.data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)
