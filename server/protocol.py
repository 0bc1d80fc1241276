"""The wire codec for the subset of the OpenAI Realtime API (GA event names) that ``wafervox serve`` speaks.

Owns: parsing client JSON text into typed client events, building server events with the exact field names
of ``openai.types.realtime`` and encoding them to JSON text, the session's negotiated configuration
(``SessionConfig``), and id assignment (``event_<n>``, ``item_<n>``, ``resp_<n>`` from an injected
``IdSource``).  It is sans-I/O (DESIGN.md principle 1): no sockets, asyncio, threads or clocks; the
websocket adapter feeds it text and writes out the text it returns.

Errors: ``ProtocolSession.receive(text)`` never raises for bad input.  Each problem becomes one
``ProtocolError`` *in the returned list*, in place of the event it spoils (code, a message naming the
problem and the event type, ``param``, and the client's ``event_id`` when it could be read; an oversize
message is not parsed, so its ``event_id`` is ``None``).  The adapter answers it with
``session.error(err)``.  Unknown fields inside a known event are ignored: the SDK may send more than we use.

A valid ``session.update`` is applied on receipt (all or nothing); the returned ``SessionUpdate`` carries
the new effective ``SessionConfig`` and the adapter answers with ``session.session_updated()``.

Our extensions, in the same style: client ``output_audio.played`` (``sample``: index, in output samples
since the session began, of the sample the client has started playing; optional ``response_id``,
``item_id``, and ``input_sample``: how many input samples the client had sent at that moment, which
puts voice-to-voice on the client's own audio clock) and ``session.latency`` (a request); server ``turn.latency`` (``report``: exactly
``voice.latency.TurnReport.to_dict()``) and ``session.latency`` (``summary``, e.g.
``voice.latency.summarize(...)``).  We also accept ``audio/pcm`` rates other than 24000 (8000..48000),
which the openai types do not allow; a session at another rate reports it, outside openai's schema.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeAlias

import numpy as np

DEFAULT_RATE = 24000
MIN_RATE, MAX_RATE = 8000, 48000
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB of JSON text: ~16 s of 24 kHz PCM16 in one append
PCM_DTYPE = np.dtype("<i2")  # PCM16 little-endian, as the Realtime API sends it


# --------------------------------------------------------------------------- ids and PCM


class IdSource:
    """``ids("item") -> "item_1"``: one counter per prefix, each starting at ``start``.  Injected into a
    ``ProtocolSession`` so that tests are deterministic; share one between sessions for unique ids."""

    __slots__ = ("_counts", "_start")

    def __init__(self, start: int = 1) -> None:
        self._start = start
        self._counts: dict[str, int] = {}

    def __call__(self, prefix: str) -> str:
        n = self._counts.get(prefix, self._start)
        self._counts[prefix] = n + 1
        return f"{prefix}_{n}"


def encode_pcm(samples: np.ndarray | bytes) -> str:
    """PCM16 samples (int16 array, or raw little-endian bytes) -> base64 text."""
    raw = samples if isinstance(samples, bytes | bytearray | memoryview) else np.asarray(samples, dtype=PCM_DTYPE).tobytes()
    return base64.b64encode(raw).decode("ascii")


def decode_pcm(text: str) -> np.ndarray:
    """base64 text -> read-only int16 array.  Raises ``ValueError`` for bad base64 or an odd byte count."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"not valid base64 ({e})") from None
    if len(raw) % 2:
        raise ValueError(f"{len(raw)} bytes is not a whole number of PCM16 samples (odd byte count)")
    return np.frombuffer(raw, dtype=PCM_DTYPE).astype(np.int16, copy=False)


# --------------------------------------------------------------------------- session configuration


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """``audio.input.turn_detection`` of type ``server_vad`` (the only type we run).  The defaults are
    our endpointer's (``voice.vad``), not OpenAI's 300 / 500 ms: every ms of silence is spent from the budget."""

    threshold: float = 0.5
    prefix_padding_ms: int = 200
    silence_duration_ms: int = 400
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None

    def to_dict(self) -> dict:
        return {"type": "server_vad", **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """The effective session configuration; ``turn_detection=None`` means manual commits."""

    model: str = "wafervox"
    instructions: str = ""
    voice: str = "default"
    input_rate: int = DEFAULT_RATE
    output_rate: int = DEFAULT_RATE
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    output_modalities: tuple[str, ...] = ("audio",)

    def to_dict(self) -> dict:
        """The ``session`` object of ``session.created`` / ``session.updated`` (RealtimeSessionCreateRequest)."""
        td = None if self.turn_detection is None else self.turn_detection.to_dict()
        return {
            "type": "realtime",
            "model": self.model,
            "instructions": self.instructions,
            "output_modalities": list(self.output_modalities),
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": self.input_rate}, "turn_detection": td},
                "output": {"format": {"type": "audio/pcm", "rate": self.output_rate}, "voice": self.voice},
            },
        }


# --------------------------------------------------------------------------- client events


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    TYPE: ClassVar[str] = "session.update"
    event_id: str | None
    config: SessionConfig  # the new effective configuration, already applied
    changed: frozenset[str]  # SessionConfig field names the update touched


@dataclass(frozen=True, slots=True, eq=False)
class InputAudioAppend:
    TYPE: ClassVar[str] = "input_audio_buffer.append"
    event_id: str | None
    samples: np.ndarray  # int16, read-only
    rate: int  # the session's input rate when the chunk arrived


@dataclass(frozen=True, slots=True)
class InputAudioCommit:
    TYPE: ClassVar[str] = "input_audio_buffer.commit"
    event_id: str | None


@dataclass(frozen=True, slots=True)
class InputAudioClear:
    TYPE: ClassVar[str] = "input_audio_buffer.clear"
    event_id: str | None


@dataclass(frozen=True, slots=True)
class ItemCreate:
    """A user text message (``conversation.item.create``); ``item_id`` is the client's or one we assigned."""

    TYPE: ClassVar[str] = "conversation.item.create"
    event_id: str | None
    item_id: str
    text: str
    previous_item_id: str | None


@dataclass(frozen=True, slots=True)
class ResponseCreate:
    TYPE: ClassVar[str] = "response.create"
    event_id: str | None
    instructions: str | None  # per-response override; other response params are ignored


@dataclass(frozen=True, slots=True)
class ResponseCancel:
    TYPE: ClassVar[str] = "response.cancel"
    event_id: str | None
    response_id: str | None


@dataclass(frozen=True, slots=True)
class ItemTruncate:
    TYPE: ClassVar[str] = "conversation.item.truncate"
    event_id: str | None
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class OutputAudioPlayed:
    """Our extension: the client has started playing output sample ``sample`` (counted since session start)."""

    TYPE: ClassVar[str] = "output_audio.played"
    event_id: str | None
    sample: int
    response_id: str | None
    item_id: str | None
    input_sample: int | None = None  # input samples the client had sent when it started playing ``sample``


@dataclass(frozen=True, slots=True)
class SessionLatencyRequest:
    """Our extension: the client asks for a ``session.latency`` summary."""

    TYPE: ClassVar[str] = "session.latency"
    event_id: str | None


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """A client message we could not accept; answer it with ``ProtocolSession.error``."""

    code: str
    message: str
    event_id: str | None = None
    param: str | None = None
    type: str = "invalid_request_error"


ClientEvent: TypeAlias = (SessionUpdate | InputAudioAppend | InputAudioCommit | InputAudioClear | ItemCreate | ResponseCreate
                          | ResponseCancel | ItemTruncate | OutputAudioPlayed | SessionLatencyRequest)


# --------------------------------------------------------------------------- server events


class _ServerEvent:
    __slots__ = ()
    TYPE: ClassVar[str]

    def to_dict(self) -> dict:
        return {"type": self.TYPE, **{f.name: getattr(self, f.name) for f in fields(self)}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class SessionCreated(_ServerEvent):
    TYPE: ClassVar[str] = "session.created"
    event_id: str
    session: dict


@dataclass(frozen=True, slots=True)
class SessionUpdated(_ServerEvent):
    TYPE: ClassVar[str] = "session.updated"
    event_id: str
    session: dict


@dataclass(frozen=True, slots=True)
class SpeechStarted(_ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.speech_started"
    event_id: str
    audio_start_ms: int
    item_id: str


@dataclass(frozen=True, slots=True)
class SpeechStopped(_ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.speech_stopped"
    event_id: str
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True, slots=True)
class AudioCommitted(_ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.committed"
    event_id: str
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True, slots=True)
class AudioCleared(_ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.cleared"
    event_id: str


@dataclass(frozen=True, slots=True)
class TranscriptionCompleted(_ServerEvent):
    TYPE: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    event_id: str
    item_id: str
    content_index: int
    transcript: str
    usage: dict  # required by openai: {"type": "duration", "seconds": ...}


@dataclass(frozen=True, slots=True)
class ResponseCreated(_ServerEvent):
    TYPE: ClassVar[str] = "response.created"
    event_id: str
    response: dict

    @property
    def response_id(self) -> str:
        return self.response["id"]


@dataclass(frozen=True, slots=True)
class OutputAudioDelta(_ServerEvent):
    TYPE: ClassVar[str] = "response.output_audio.delta"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str  # base64 PCM16


@dataclass(frozen=True, slots=True)
class OutputAudioDone(_ServerEvent):
    TYPE: ClassVar[str] = "response.output_audio.done"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int


@dataclass(frozen=True, slots=True)
class OutputTranscriptDelta(_ServerEvent):
    TYPE: ClassVar[str] = "response.output_audio_transcript.delta"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class OutputTranscriptDone(_ServerEvent):
    TYPE: ClassVar[str] = "response.output_audio_transcript.done"
    event_id: str
    response_id: str
    item_id: str
    output_index: int
    content_index: int
    transcript: str


@dataclass(frozen=True, slots=True)
class ResponseDone(_ServerEvent):
    TYPE: ClassVar[str] = "response.done"
    event_id: str
    response: dict


@dataclass(frozen=True, slots=True)
class ItemTruncated(_ServerEvent):
    TYPE: ClassVar[str] = "conversation.item.truncated"
    event_id: str
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class ErrorEvent(_ServerEvent):
    TYPE: ClassVar[str] = "error"
    event_id: str
    error: dict  # RealtimeError: type, code, message, param, event_id (the client's)


@dataclass(frozen=True, slots=True)
class TurnLatency(_ServerEvent):
    """Our extension: one turn's report, exactly ``TurnReport.to_dict()``."""

    TYPE: ClassVar[str] = "turn.latency"
    event_id: str
    report: dict


@dataclass(frozen=True, slots=True)
class SessionLatency(_ServerEvent):
    """Our extension: the session's latency summary."""

    TYPE: ClassVar[str] = "session.latency"
    event_id: str
    summary: dict


ServerEvent: TypeAlias = (SessionCreated | SessionUpdated | SpeechStarted | SpeechStopped | AudioCommitted | AudioCleared
                          | TranscriptionCompleted | ResponseCreated | OutputAudioDelta | OutputAudioDone | OutputTranscriptDelta
                          | OutputTranscriptDone | ResponseDone | ItemTruncated | ErrorEvent | TurnLatency | SessionLatency)


# --------------------------------------------------------------------------- field readers


class _Invalid(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


_MISSING = object()


def _get(obj: dict, key: str, kinds: type | tuple[type, ...], where: str, required: bool = False, nullable: bool = True):
    """``obj[key]`` checked against ``kinds`` (bool is never an int here); ``None`` when absent and optional."""
    v = obj.get(key, _MISSING)
    path = f"{where}.{key}" if where else key
    if v is _MISSING or (v is None and nullable and not required):
        if required:
            raise _Invalid("missing_required_parameter", f"missing required field '{path}'", path)
        return None
    names = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
    if (isinstance(v, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,))) or not isinstance(v, kinds):
        raise _Invalid("invalid_type", f"field '{path}' must be {names}, got {type(v).__name__}", path)
    return v


def _nonneg(v: int | None, path: str) -> int | None:
    if v is not None and v < 0:
        raise _Invalid("invalid_value", f"field '{path}' must be >= 0, got {v}", path)
    return v


def _format_rate(fmt: Any, path: str, current: int) -> int:
    if fmt is None:
        return current
    if not isinstance(fmt, dict):
        raise _Invalid("invalid_type", f"field '{path}' must be an object", path)
    kind = _get(fmt, "type", str, path)
    if kind not in (None, "audio/pcm"):
        raise _Invalid("unsupported_format", f"audio format '{kind}' at '{path}' is not supported (only 'audio/pcm')", path + ".type")
    rate = _get(fmt, "rate", int, path)
    if rate is None:
        return current
    if not MIN_RATE <= rate <= MAX_RATE:
        raise _Invalid("invalid_value", f"field '{path}.rate' must be in {MIN_RATE}..{MAX_RATE} Hz, got {rate}", path + ".rate")
    return rate


def _turn_detection(td: Any, current: TurnDetection | None) -> TurnDetection:
    path = "session.audio.input.turn_detection"
    if not isinstance(td, dict):
        raise _Invalid("invalid_type", f"field '{path}' must be an object or null", path)
    kind = _get(td, "type", str, path)
    if kind not in (None, "server_vad"):
        raise _Invalid("unsupported_turn_detection", f"turn_detection type '{kind}' is not supported (only 'server_vad')", path + ".type")
    base = current or TurnDetection()
    ch: dict[str, Any] = {}
    thr = _get(td, "threshold", (int, float), path)
    if thr is not None:
        if not 0.0 <= thr <= 1.0:
            raise _Invalid("invalid_value", f"field '{path}.threshold' must be in 0..1, got {thr}", path + ".threshold")
        ch["threshold"] = float(thr)
    for k in ("prefix_padding_ms", "silence_duration_ms"):
        v = _nonneg(_get(td, k, int, path), f"{path}.{k}")
        if v is not None:
            ch[k] = v
    for k in ("create_response", "interrupt_response"):
        v = _get(td, k, bool, path)
        if v is not None:
            ch[k] = v
    if "idle_timeout_ms" in td:
        ch["idle_timeout_ms"] = _nonneg(_get(td, "idle_timeout_ms", int, path), f"{path}.idle_timeout_ms")
    return replace(base, **ch)


def _voice(v: Any, path: str) -> str:
    if isinstance(v, dict):
        v = _get(v, "id", str, path, required=True)
    if not isinstance(v, str):
        raise _Invalid("invalid_type", f"field '{path}' must be a string or {{\"id\": string}}", path)
    return v


def _apply_session_update(msg: dict, cfg: SessionConfig) -> tuple[SessionConfig, frozenset[str]]:
    s = _get(msg, "session", dict, "", required=True)
    kind = _get(s, "type", str, "session")
    if kind not in (None, "realtime"):
        raise _Invalid("unsupported_session_type", f"session type '{kind}' is not supported (only 'realtime')", "session.type")
    ch: dict[str, Any] = {}
    if (ins := _get(s, "instructions", str, "session")) is not None:
        ch["instructions"] = ins
    if (mods := _get(s, "output_modalities", list, "session")) is not None:
        if not mods or any(m not in ("text", "audio") for m in mods):
            raise _Invalid("invalid_value", "field 'session.output_modalities' must be a non-empty list of 'text'/'audio'",
                           "session.output_modalities")
        ch["output_modalities"] = tuple(dict.fromkeys(mods))
    audio = _get(s, "audio", dict, "session") or {}
    inp = _get(audio, "input", dict, "session.audio") or {}
    out = _get(audio, "output", dict, "session.audio") or {}
    if "format" in inp:
        ch["input_rate"] = _format_rate(inp["format"], "session.audio.input.format", cfg.input_rate)
    if "turn_detection" in inp:
        td = inp["turn_detection"]
        ch["turn_detection"] = None if td is None else _turn_detection(td, cfg.turn_detection)
    if "format" in out:
        ch["output_rate"] = _format_rate(out["format"], "session.audio.output.format", cfg.output_rate)
    if out.get("voice") is not None:
        ch["voice"] = _voice(out["voice"], "session.audio.output.voice")
    return replace(cfg, **ch), frozenset(ch)


def _text_item(msg: dict, ids: Callable[[str], str], event_id: str | None) -> ItemCreate:
    item = _get(msg, "item", dict, "", required=True)
    if _get(item, "type", str, "item") not in (None, "message"):
        raise _Invalid("unsupported_item", f"item type '{item['type']}' is not supported (only 'message')", "item.type")
    role = _get(item, "role", str, "item", required=True)
    if role != "user":
        raise _Invalid("unsupported_item", f"item role '{role}' is not supported (only 'user' text messages)", "item.role")
    content = _get(item, "content", list, "item", required=True)
    texts = []
    for i, part in enumerate(content):
        where = f"item.content[{i}]"
        if not isinstance(part, dict):
            raise _Invalid("invalid_type", f"field '{where}' must be an object", where)
        if _get(part, "type", str, where) not in (None, "input_text"):
            raise _Invalid("unsupported_content", f"content type '{part['type']}' at '{where}' is not supported (only 'input_text')",
                           where + ".type")
        texts.append(_get(part, "text", str, where, required=True))
    if not texts:
        raise _Invalid("invalid_value", "field 'item.content' must hold at least one input_text part", "item.content")
    return ItemCreate(event_id=event_id, item_id=_get(item, "id", str, "item") or ids("item"), text=" ".join(texts),
                      previous_item_id=_get(msg, "previous_item_id", str, ""))


# --------------------------------------------------------------------------- the session


class ProtocolSession:
    """One connection's codec: ``receive(text) -> [ClientEvent | ProtocolError]`` and builders returning
    server events (``.to_json()`` gives the text to send).  Ids come from ``ids``; the config from
    ``session.update``.  Not thread-safe: one adapter task owns it."""

    def __init__(self, config: SessionConfig | None = None, *, ids: Callable[[str], str] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.config = config or SessionConfig()
        self.ids = ids or IdSource()
        self.max_message_bytes = max_message_bytes
        self.last_item_id: str | None = None  # the conversation's newest item, for previous_item_id

    # ---- client -> server

    def receive(self, text: str | bytes) -> list[ClientEvent | ProtocolError]:
        """Parse one websocket text message.  Never raises for bad input (see the module docstring)."""
        if isinstance(text, bytes | bytearray):
            size = len(text)
        else:
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_message_bytes:
            return [ProtocolError("message_too_large", f"message of {size} bytes exceeds the limit of {self.max_message_bytes} bytes")]
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return [ProtocolError("invalid_json", f"message is not valid JSON: {e}")]
        if not isinstance(msg, dict):
            return [ProtocolError("invalid_event", f"message must be a JSON object, got {type(msg).__name__}")]
        event_id = msg.get("event_id")
        if event_id is not None and not isinstance(event_id, str):
            return [ProtocolError("invalid_type", f"field 'event_id' must be string, got {type(event_id).__name__}", None, "event_id")]
        kind = msg.get("type")
        if not isinstance(kind, str):
            what = "missing required field 'type'" if kind is None else f"field 'type' must be string, got {type(kind).__name__}"
            return [ProtocolError("missing_required_parameter" if kind is None else "invalid_type", what, event_id, "type")]
        parse = self._PARSERS.get(kind)
        if parse is None:
            return [ProtocolError("unknown_event_type", f"unknown or unsupported event type '{kind}'", event_id, "type")]
        try:
            return [parse(self, msg, event_id)]
        except _Invalid as e:
            return [ProtocolError(e.code, f"{kind}: {e.message}", event_id, e.param)]

    def _session_update(self, msg: dict, event_id: str | None) -> SessionUpdate:
        cfg, changed = _apply_session_update(msg, self.config)
        self.config = cfg
        return SessionUpdate(event_id=event_id, config=cfg, changed=changed)

    def _append(self, msg: dict, event_id: str | None) -> InputAudioAppend:
        audio = _get(msg, "audio", str, "", required=True)
        try:
            samples = decode_pcm(audio)
        except ValueError as e:
            raise _Invalid("invalid_audio", f"field 'audio' is {e}", "audio") from None
        return InputAudioAppend(event_id=event_id, samples=samples, rate=self.config.input_rate)

    def _item_create(self, msg: dict, event_id: str | None) -> ItemCreate:
        ev = _text_item(msg, self.ids, event_id)
        self.last_item_id = ev.item_id
        return ev

    def _response_create(self, msg: dict, event_id: str | None) -> ResponseCreate:
        params = _get(msg, "response", dict, "") or {}
        return ResponseCreate(event_id=event_id, instructions=_get(params, "instructions", str, "response"))

    def _truncate(self, msg: dict, event_id: str | None) -> ItemTruncate:
        return ItemTruncate(event_id=event_id, item_id=_get(msg, "item_id", str, "", required=True),
                            content_index=_nonneg(_get(msg, "content_index", int, "", required=True), "content_index"),
                            audio_end_ms=_nonneg(_get(msg, "audio_end_ms", int, "", required=True), "audio_end_ms"))

    def _played(self, msg: dict, event_id: str | None) -> OutputAudioPlayed:
        return OutputAudioPlayed(event_id=event_id, sample=_nonneg(_get(msg, "sample", int, "", required=True), "sample"),
                                 response_id=_get(msg, "response_id", str, ""), item_id=_get(msg, "item_id", str, ""),
                                 input_sample=_nonneg(_get(msg, "input_sample", int, ""), "input_sample"))

    _PARSERS: ClassVar[dict[str, Callable[[ProtocolSession, dict, str | None], ClientEvent]]] = {
        SessionUpdate.TYPE: _session_update,
        InputAudioAppend.TYPE: _append,
        InputAudioCommit.TYPE: lambda self, msg, eid: InputAudioCommit(event_id=eid),
        InputAudioClear.TYPE: lambda self, msg, eid: InputAudioClear(event_id=eid),
        ItemCreate.TYPE: _item_create,
        ResponseCreate.TYPE: _response_create,
        ResponseCancel.TYPE: lambda self, msg, eid: ResponseCancel(event_id=eid, response_id=_get(msg, "response_id", str, "")),
        ItemTruncate.TYPE: _truncate,
        OutputAudioPlayed.TYPE: _played,
        SessionLatencyRequest.TYPE: lambda self, msg, eid: SessionLatencyRequest(event_id=eid),
    }

    # ---- server -> client builders (each assigns a fresh event_id)

    def _eid(self) -> str:
        return self.ids("event")

    def new_item_id(self) -> str:
        return self.ids("item")

    def session_created(self) -> SessionCreated:
        return SessionCreated(event_id=self._eid(), session=self.config.to_dict())

    def session_updated(self) -> SessionUpdated:
        return SessionUpdated(event_id=self._eid(), session=self.config.to_dict())

    def speech_started(self, audio_start_ms: int, item_id: str | None = None) -> SpeechStarted:
        """``item_id`` of the user item this speech will become; a fresh one when not given."""
        return SpeechStarted(event_id=self._eid(), audio_start_ms=int(audio_start_ms), item_id=item_id or self.new_item_id())

    def speech_stopped(self, audio_end_ms: int, item_id: str) -> SpeechStopped:
        return SpeechStopped(event_id=self._eid(), audio_end_ms=int(audio_end_ms), item_id=item_id)

    def committed(self, item_id: str | None = None) -> AudioCommitted:
        """The buffer became user item ``item_id`` (fresh when not given), after the newest item."""
        item_id = item_id or self.new_item_id()
        ev = AudioCommitted(event_id=self._eid(), item_id=item_id, previous_item_id=self.last_item_id)
        self.last_item_id = item_id
        return ev

    def cleared(self) -> AudioCleared:
        return AudioCleared(event_id=self._eid())

    def transcription_completed(self, item_id: str, transcript: str, audio_seconds: float,
                                content_index: int = 0) -> TranscriptionCompleted:
        return TranscriptionCompleted(event_id=self._eid(), item_id=item_id, content_index=content_index, transcript=transcript,
                                      usage={"type": "duration", "seconds": float(audio_seconds)})

    def _response(self, response_id: str, status: str, output: list, status_details: dict | None = None) -> dict:
        return {"id": response_id, "object": "realtime.response", "status": status, "status_details": status_details,
                "output": output, "output_modalities": list(self.config.output_modalities),
                "audio": {"output": {"format": {"type": "audio/pcm", "rate": self.config.output_rate}, "voice": self.config.voice}}}

    def response_created(self) -> ResponseCreated:
        """A fresh response (``.response_id``), in progress, with no output yet; use ``new_item_id()`` for its item."""
        return ResponseCreated(event_id=self._eid(), response=self._response(self.ids("resp"), "in_progress", []))

    def audio_delta(self, response_id: str, item_id: str, pcm: np.ndarray | bytes, output_index: int = 0,
                    content_index: int = 0) -> OutputAudioDelta:
        return OutputAudioDelta(event_id=self._eid(), response_id=response_id, item_id=item_id, output_index=output_index,
                                content_index=content_index, delta=encode_pcm(pcm))

    def audio_done(self, response_id: str, item_id: str, output_index: int = 0, content_index: int = 0) -> OutputAudioDone:
        return OutputAudioDone(event_id=self._eid(), response_id=response_id, item_id=item_id, output_index=output_index,
                               content_index=content_index)

    def transcript_delta(self, response_id: str, item_id: str, delta: str, output_index: int = 0,
                         content_index: int = 0) -> OutputTranscriptDelta:
        return OutputTranscriptDelta(event_id=self._eid(), response_id=response_id, item_id=item_id, output_index=output_index,
                                     content_index=content_index, delta=delta)

    def transcript_done(self, response_id: str, item_id: str, transcript: str, output_index: int = 0,
                        content_index: int = 0) -> OutputTranscriptDone:
        return OutputTranscriptDone(event_id=self._eid(), response_id=response_id, item_id=item_id, output_index=output_index,
                                    content_index=content_index, transcript=transcript)

    def response_done(self, response_id: str, item_id: str | None, transcript: str = "", *, cancelled: bool = False,
                      reason: str = "client_cancelled") -> ResponseDone:
        """``status`` completed, or cancelled with ``reason`` ('client_cancelled' or 'turn_detected' for barge-in).
        ``item_id`` None: the response produced no item."""
        output = []
        if item_id is not None:
            output = [{"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                       "status": "incomplete" if cancelled else "completed",
                       "content": [{"type": "output_audio", "transcript": transcript}]}]
            self.last_item_id = item_id
        details = {"type": "cancelled", "reason": reason} if cancelled else None
        return ResponseDone(event_id=self._eid(), response=self._response(response_id, "cancelled" if cancelled else "completed",
                                                                          output, details))

    def truncated(self, item_id: str, audio_end_ms: int, content_index: int = 0) -> ItemTruncated:
        return ItemTruncated(event_id=self._eid(), item_id=item_id, content_index=content_index, audio_end_ms=int(audio_end_ms))

    def error(self, err: ProtocolError) -> ErrorEvent:
        return ErrorEvent(event_id=self._eid(), error={"type": err.type, "code": err.code, "message": err.message,
                                                       "param": err.param, "event_id": err.event_id})

    def turn_latency(self, report: dict) -> TurnLatency:
        """``report``: ``TurnReport.to_dict()``, carried unchanged."""
        return TurnLatency(event_id=self._eid(), report=report)

    def session_latency(self, summary: dict) -> SessionLatency:
        return SessionLatency(event_id=self._eid(), summary=summary)
