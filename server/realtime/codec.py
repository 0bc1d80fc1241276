"""The wire codec for the subset of the OpenAI Realtime API (GA event names) that ``wafervox serve`` speaks.

Owns: ``ProtocolSession``, one connection's codec: parsing client JSON text into the typed client events of
``server.realtime.events``, building server events (one generic ``build(type, **fields)`` checked against
``SERVER_EVENTS``, and a named builder per event for the adapter) and id assignment (``event_<n>``,
``item_<n>``, ``resp_<n>`` from an injected ``IdSource``); and the audio base64 helpers (PCM16, G.711).  It is sans-I/O
(DESIGN.md principle 1): no sockets, asyncio, threads or clocks; the websocket adapter feeds it text and
writes out the text it returns.

Errors: ``ProtocolSession.receive(text)`` never raises for bad input.  Each problem becomes one
``ProtocolError`` *in the returned list*, in place of the event it spoils (code, a message naming the
problem and the event type, ``param``, and the client's ``event_id`` when it could be read; an oversize
message is not parsed, so its ``event_id`` is ``None``).  The adapter answers it with
``session.error(err)``.  Unknown fields inside a known event are ignored: the SDK may send more than we use.

A valid ``session.update`` is applied on receipt (all or nothing, ``server.realtime.config``); the returned
``SessionUpdate`` carries the new effective ``SessionConfig`` and the adapter answers with
``session.session_updated()``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from voice import g711

from . import events as E
from .config import PCM, FieldError, SessionConfig, apply_session_update, nonneg, read, tool_choice

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


def encode_audio(samples: np.ndarray | bytes, kind: str = PCM) -> str:
    """Output audio in the session's format ``kind`` as base64 text: PCM16 as it is, G.711 companded (``voice.g711``).
    ``samples`` are PCM16 at the format's rate (raw bytes pass as they are: already in the format)."""
    if kind == PCM or isinstance(samples, bytes | bytearray | memoryview):
        return encode_pcm(samples)
    return base64.b64encode(g711.CODECS[kind][0](samples)).decode("ascii")


def decode_audio(text: str, kind: str = PCM) -> np.ndarray:
    """base64 text in the session's input format ``kind`` -> int16 PCM samples.  Raises ``ValueError`` as ``decode_pcm``."""
    if kind == PCM:
        return decode_pcm(text)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"not valid base64 ({e})") from None
    return g711.CODECS[kind][1](raw)


def _valid(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def invalid_unicode(value, path: str = "") -> str | None:
    """The path (``item.content[0].text``) of the first string in a parsed JSON value, key or value, that is not
    valid Unicode (JSON may escape lone surrogates, which no UTF-8 text can hold), or None."""
    stack = [(value, path)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            if not _valid(v):
                return where or "(message)"
        elif isinstance(v, dict):
            for k, x in v.items():
                name = f"{where}.{k}" if where else k
                if not _valid(k):
                    return (where + "." if where else "") + "(key)"
                stack.append((x, name))
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]") for i, x in enumerate(v))
    return None


# --------------------------------------------------------------------------- client message bodies


def _text_item(msg: dict, ids: Callable[[str], str], event_id: str | None) -> E.ItemCreate | E.FunctionOutputCreate:
    item = read(msg, "item", dict, "", required=True)
    kind = read(item, "type", str, "item")
    if kind == "function_call_output":
        return E.FunctionOutputCreate(event_id=event_id, item_id=read(item, "id", str, "item") or ids("item"),
                                      call_id=read(item, "call_id", str, "item", required=True),
                                      output=read(item, "output", str, "item", required=True),
                                      previous_item_id=read(msg, "previous_item_id", str, ""))
    if kind not in (None, "message"):
        raise FieldError("unsupported_item", f"item type '{item['type']}' is not supported (only 'message' and "
                         "'function_call_output')", "item.type")
    role = read(item, "role", str, "item", required=True)
    if role != "user":
        raise FieldError("unsupported_item", f"item role '{role}' is not supported (only 'user' text messages)", "item.role")
    content = read(item, "content", list, "item", required=True)
    texts = []
    for i, part in enumerate(content):
        where = f"item.content[{i}]"
        if not isinstance(part, dict):
            raise FieldError("invalid_type", f"field '{where}' must be an object", where)
        if read(part, "type", str, where) not in (None, "input_text"):
            raise FieldError("unsupported_content", f"content type '{part['type']}' at '{where}' is not supported (only 'input_text')",
                             where + ".type")
        texts.append(read(part, "text", str, where, required=True))
    if not texts:
        raise FieldError("invalid_value", "field 'item.content' must hold at least one input_text part", "item.content")
    return E.ItemCreate(event_id=event_id, item_id=read(item, "id", str, "item") or ids("item"), text=" ".join(texts),
                        previous_item_id=read(msg, "previous_item_id", str, ""))


# --------------------------------------------------------------------------- the session


class ProtocolSession:
    """One connection's codec: ``receive(text) -> [ClientEvent | ProtocolError]`` and builders returning
    ``ServerEvent``s (``.to_json()`` gives the text to send).  Ids come from ``ids``; the config from
    ``session.update``.  Not thread-safe: one adapter task owns it."""

    def __init__(self, config: SessionConfig | None = None, *, ids: Callable[[str], str] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.config = config or SessionConfig()
        self.ids = ids or IdSource()
        self.max_message_bytes = max_message_bytes
        self.last_item_id: str | None = None  # the conversation's newest item, for previous_item_id

    # ---- client -> server

    def receive(self, text: str | bytes) -> list[E.ClientEvent | E.ProtocolError]:
        """Parse one websocket text message.  Never raises for bad input (see the module docstring)."""
        if isinstance(text, bytes | bytearray):
            size = len(text)
        else:
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_message_bytes:
            return [E.ProtocolError("message_too_large", f"message of {size} bytes exceeds the limit of {self.max_message_bytes} bytes")]
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            return [E.ProtocolError("invalid_json", f"message is not valid JSON: {e}")]
        if not isinstance(msg, dict):
            return [E.ProtocolError("invalid_event", f"message must be a JSON object, got {type(msg).__name__}")]
        bad = invalid_unicode(msg)
        if bad is not None:  # a lone surrogate ("\ud800" in the JSON): no string of it is used, or echoed
            event_id = msg.get("event_id") if bad != "event_id" and isinstance(msg.get("event_id"), str) else None
            return [E.ProtocolError("invalid_unicode", f"field '{bad}' is not valid Unicode text (it holds a lone surrogate "
                                    "escape such as \\ud800)", event_id, bad)]
        event_id = msg.get("event_id")
        if event_id is not None and not isinstance(event_id, str):
            return [E.ProtocolError("invalid_type", f"field 'event_id' must be string, got {type(event_id).__name__}", None, "event_id")]
        kind = msg.get("type")
        if not isinstance(kind, str):
            what = "missing required field 'type'" if kind is None else f"field 'type' must be string, got {type(kind).__name__}"
            return [E.ProtocolError("missing_required_parameter" if kind is None else "invalid_type", what, event_id, "type")]
        parse = self._PARSERS.get(kind)
        if parse is None:
            return [E.ProtocolError("unknown_event_type", f"unknown or unsupported event type '{kind}'", event_id, "type")]
        try:
            return [parse(self, msg, event_id)]
        except FieldError as e:
            return [E.ProtocolError(e.code, f"{kind}: {e.message}", event_id, e.param)]

    def _session_update(self, msg: dict, event_id: str | None) -> E.SessionUpdate:
        cfg, changed = apply_session_update(msg, self.config)
        self.config = cfg
        return E.SessionUpdate(event_id=event_id, config=cfg, changed=changed)

    def _append(self, msg: dict, event_id: str | None) -> E.InputAudioAppend:
        audio = read(msg, "audio", str, "", required=True)
        try:
            samples = decode_audio(audio, self.config.input_format)
        except ValueError as e:
            raise FieldError("invalid_audio", f"field 'audio' is {e}", "audio") from None
        return E.InputAudioAppend(event_id=event_id, samples=samples, rate=self.config.input_rate)

    def _item_create(self, msg: dict, event_id: str | None) -> E.ItemCreate | E.FunctionOutputCreate:
        ev = _text_item(msg, self.ids, event_id)
        self.last_item_id = ev.item_id
        return ev

    def _response_create(self, msg: dict, event_id: str | None) -> E.ResponseCreate:
        params = read(msg, "response", dict, "") or {}
        meta = read(params, "metadata", dict, "response")
        if meta is not None:
            if len(meta) > 16:
                raise FieldError("invalid_value", f"field 'response.metadata' holds {len(meta)} keys, at most 16", "response.metadata")
            for k, v in meta.items():
                if not isinstance(v, str) or len(k) > 64 or len(v) > 512:
                    raise FieldError("invalid_value", "field 'response.metadata' maps keys of up to 64 characters to strings "
                                     f"of up to 512 (key {k[:64]!r})", "response.metadata")
            meta = tuple(meta.items())
        choice = tool_choice(params["tool_choice"], "response.tool_choice") if "tool_choice" in params else None
        key = "output_modalities" if "output_modalities" in params else "modalities"  # (GA, beta)
        mods = read(params, key, list, "response")
        if mods is not None and (not mods or any(m not in ("text", "audio") for m in mods)):
            raise FieldError("invalid_value", f"field 'response.{key}' must be a non-empty list of 'text'/'audio'", f"response.{key}")
        return E.ResponseCreate(event_id=event_id, instructions=read(params, "instructions", str, "response"), metadata=meta,
                                tool_choice=choice, output_modalities=None if mods is None else tuple(dict.fromkeys(mods)))

    def _truncate(self, msg: dict, event_id: str | None) -> E.ItemTruncate:
        return E.ItemTruncate(event_id=event_id, item_id=read(msg, "item_id", str, "", required=True),
                              content_index=nonneg(read(msg, "content_index", int, "", required=True), "content_index"),
                              audio_end_ms=nonneg(read(msg, "audio_end_ms", int, "", required=True), "audio_end_ms"))

    def _item_ref(self, msg: dict, event_id: str | None, cls):
        return cls(event_id=event_id, item_id=read(msg, "item_id", str, "", required=True))

    def _played(self, msg: dict, event_id: str | None) -> E.OutputAudioPlayed:
        return E.OutputAudioPlayed(event_id=event_id, sample=nonneg(read(msg, "sample", int, "", required=True), "sample"),
                                   response_id=read(msg, "response_id", str, ""), item_id=read(msg, "item_id", str, ""),
                                   input_sample=nonneg(read(msg, "input_sample", int, ""), "input_sample"))

    _PARSERS: ClassVar[dict[str, Callable[[ProtocolSession, dict, str | None], E.ClientEvent]]] = {
        E.SessionUpdate.TYPE: _session_update,
        E.InputAudioAppend.TYPE: _append,
        E.InputAudioCommit.TYPE: lambda self, msg, eid: E.InputAudioCommit(event_id=eid),
        E.InputAudioClear.TYPE: lambda self, msg, eid: E.InputAudioClear(event_id=eid),
        E.ItemCreate.TYPE: _item_create,
        E.ResponseCreate.TYPE: _response_create,
        E.ResponseCancel.TYPE: lambda self, msg, eid: E.ResponseCancel(event_id=eid, response_id=read(msg, "response_id", str, "")),
        E.ItemTruncate.TYPE: _truncate,
        E.ItemRetrieve.TYPE: lambda self, msg, eid: self._item_ref(msg, eid, E.ItemRetrieve),
        E.ItemDelete.TYPE: lambda self, msg, eid: self._item_ref(msg, eid, E.ItemDelete),
        E.OutputAudioPlayed.TYPE: _played,
        E.SessionLatencyRequest.TYPE: lambda self, msg, eid: E.SessionLatencyRequest(event_id=eid),
    }

    # ---- server -> client

    def build(self, type: str, **fields) -> E.ServerEvent:
        """The server event ``type`` with a fresh ``event_id``: ``fields`` must be exactly those ``SERVER_EVENTS``
        names for it (any order; they go out in the table's).  Anything else is our bug: ``TypeError``."""
        names = E.SERVER_EVENTS[type]
        if fields.keys() != set(names):
            raise TypeError(f"{type} takes the fields {names}, got {tuple(fields)}")
        return E.ServerEvent(type=type, event_id=self.ids("event"), data={k: fields[k] for k in names})

    def new_item_id(self) -> str:
        return self.ids("item")

    def session_created(self) -> E.ServerEvent:
        return self.build("session.created", session=self.config.to_dict())

    def session_updated(self) -> E.ServerEvent:
        return self.build("session.updated", session=self.config.to_dict())

    def speech_started(self, audio_start_ms: int, item_id: str | None = None) -> E.ServerEvent:
        """``item_id`` of the user item this speech will become; a fresh one when not given."""
        return self.build("input_audio_buffer.speech_started", audio_start_ms=int(audio_start_ms), item_id=item_id or self.new_item_id())

    def speech_stopped(self, audio_end_ms: int, item_id: str) -> E.ServerEvent:
        return self.build("input_audio_buffer.speech_stopped", audio_end_ms=int(audio_end_ms), item_id=item_id)

    def committed(self, item_id: str | None = None) -> E.ServerEvent:
        """The buffer became user item ``item_id`` (fresh when not given), after the newest item."""
        item_id = item_id or self.new_item_id()
        previous, self.last_item_id = self.last_item_id, item_id
        return self.build("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)

    def cleared(self) -> E.ServerEvent:
        return self.build("input_audio_buffer.cleared")

    def timeout_triggered(self, audio_start_ms: int, audio_end_ms: int, item_id: str) -> E.ServerEvent:
        return self.build("input_audio_buffer.timeout_triggered", audio_start_ms=int(audio_start_ms), audio_end_ms=int(audio_end_ms),
                          item_id=item_id)

    def transcription_completed(self, item_id: str, transcript: str, audio_seconds: float, content_index: int = 0) -> E.ServerEvent:
        return self.build("conversation.item.input_audio_transcription.completed", item_id=item_id, content_index=content_index,
                          transcript=transcript, usage={"type": "duration", "seconds": float(audio_seconds)})

    def _response(self, response_id: str, status: str, output: list, status_details: dict | None = None,
                  metadata: dict | None = None, usage: dict | None = None, modalities: list[str] | None = None) -> dict:
        """A ``realtime.response`` object (with the client's ``metadata`` when it gave some, and ``usage`` when known);
        ``modalities``: the response's own, else the session's."""
        out = {"id": response_id, "object": "realtime.response", "status": status, "status_details": status_details,
               "output": output, "output_modalities": list(modalities or self.config.output_modalities),
               "audio": {"output": self.config.output_format()}}
        if metadata is not None:
            out["metadata"] = dict(metadata)
        if usage is not None:
            out["usage"] = usage
        return out

    def response_created(self, metadata: dict | None = None, modalities: list[str] | None = None) -> E.ServerEvent:
        """A fresh response (``.response_id``), in progress, with no output yet; use ``new_item_id()`` for its item."""
        return self.build("response.created", response=self._response(self.ids("resp"), "in_progress", [], metadata=metadata,
                                                                      modalities=modalities))

    def audio_delta(self, response_id: str, item_id: str, pcm: np.ndarray | bytes, output_index: int = 0,
                    content_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_audio.delta", response_id=response_id, item_id=item_id, output_index=output_index,
                          content_index=content_index, delta=encode_audio(pcm, self.config.output_format_type))

    def audio_done(self, response_id: str, item_id: str, output_index: int = 0, content_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_audio.done", response_id=response_id, item_id=item_id, output_index=output_index,
                          content_index=content_index)

    def transcript_delta(self, response_id: str, item_id: str, delta: str, output_index: int = 0,
                         content_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_audio_transcript.delta", response_id=response_id, item_id=item_id,
                          output_index=output_index, content_index=content_index, delta=delta)

    def transcript_done(self, response_id: str, item_id: str, transcript: str, output_index: int = 0,
                        content_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_audio_transcript.done", response_id=response_id, item_id=item_id,
                          output_index=output_index, content_index=content_index, transcript=transcript)

    def text_delta(self, response_id: str, item_id: str, delta: str, output_index: int = 0, content_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_text.delta", response_id=response_id, item_id=item_id, output_index=output_index,
                          content_index=content_index, delta=delta)

    def text_done(self, response_id: str, item_id: str, text: str, output_index: int = 0, content_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_text.done", response_id=response_id, item_id=item_id, output_index=output_index,
                          content_index=content_index, text=text)

    def response_done(self, response_id: str, item_id: str | None, transcript: str = "", *, cancelled: bool = False,
                      reason: str = "client_cancelled", metadata: dict | None = None, usage: dict | None = None,
                      output: list[dict] | None = None, error: str | None = None, modalities: list[str] | None = None) -> E.ServerEvent:
        """``status`` completed, cancelled with ``reason`` ('client_cancelled' or 'turn_detected' for barge-in), or
        failed with ``error`` (the LLM backend's).  ``output``: the response's items as they are now; by default the
        assistant item ``item_id`` with ``transcript`` (``item_id`` None: the response produced no item)."""
        if output is None:
            output = [] if item_id is None else [self.assistant_item(item_id, transcript, "incomplete" if cancelled else "completed")]
        if output:
            self.last_item_id = output[-1]["id"]
        if error is not None:
            status, details = "failed", {"type": "failed", "error": {"type": "server_error", "code": "llm_backend_failed",
                                                                     "message": error}}
        elif cancelled:
            status, details = "cancelled", {"type": "cancelled", "reason": reason}
        else:
            status, details = "completed", None
        return self.build("response.done", response=self._response(response_id, status, output, details, metadata, usage, modalities))

    # ---- the item lifecycle

    @staticmethod
    def user_item(item_id: str, *, text: str | None = None, transcript: str | None = None,
                  status: str = "completed") -> dict:
        """A user ``realtime.item``: typed ``text`` (``input_text``), else audio with its ``transcript`` (None while
        it is not known)."""
        part = {"type": "input_text", "text": text} if text is not None else {"type": "input_audio", "transcript": transcript}
        return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": status,
                "content": [part]}

    @staticmethod
    def assistant_item(item_id: str, transcript: str | None, status: str, text: bool = False) -> dict:
        """An assistant ``realtime.item``: spoken audio with its ``transcript`` (``text``: an ``output_text`` part, a
        text-only response's); no content while it is None."""
        part = {"type": "output_text", "text": transcript} if text else {"type": "output_audio", "transcript": transcript}
        content = [] if transcript is None else [part]
        return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant", "status": status,
                "content": content}

    @staticmethod
    def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
        """A ``function_call`` ``realtime.item`` (a tool call the answer makes)."""
        return {"id": item_id, "object": "realtime.item", "type": "function_call", "status": status, "call_id": call_id,
                "name": name, "arguments": arguments}

    @staticmethod
    def function_output_item(item_id: str, call_id: str, output: str) -> dict:
        """A ``function_call_output`` ``realtime.item`` (a tool's result, from the client)."""
        return {"id": item_id, "object": "realtime.item", "type": "function_call_output", "status": "completed",
                "call_id": call_id, "output": output}

    def arguments_delta(self, response_id: str, item_id: str, output_index: int, call_id: str, delta: str) -> E.ServerEvent:
        return self.build("response.function_call_arguments.delta", response_id=response_id, item_id=item_id,
                          output_index=output_index, call_id=call_id, delta=delta)

    def arguments_done(self, response_id: str, item_id: str, output_index: int, call_id: str, name: str,
                       arguments: str) -> E.ServerEvent:
        return self.build("response.function_call_arguments.done", response_id=response_id, item_id=item_id,
                          output_index=output_index, call_id=call_id, name=name, arguments=arguments)

    def item_added(self, item: dict, previous_item_id: str | None) -> E.ServerEvent:
        return self.build("conversation.item.added", previous_item_id=previous_item_id, item=item)

    def item_done(self, item: dict, previous_item_id: str | None) -> E.ServerEvent:
        return self.build("conversation.item.done", previous_item_id=previous_item_id, item=item)

    def item_retrieved(self, item: dict) -> E.ServerEvent:
        return self.build("conversation.item.retrieved", item=item)

    def item_deleted(self, item_id: str) -> E.ServerEvent:
        return self.build("conversation.item.deleted", item_id=item_id)

    def output_item_added(self, response_id: str, item: dict, output_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_item.added", response_id=response_id, output_index=output_index, item=item)

    def output_item_done(self, response_id: str, item: dict, output_index: int = 0) -> E.ServerEvent:
        return self.build("response.output_item.done", response_id=response_id, output_index=output_index, item=item)

    def content_part_added(self, response_id: str, item_id: str, output_index: int = 0, content_index: int = 0,
                           text: bool = False) -> E.ServerEvent:
        """The message's audio part (``text``: its text part, a text-only response's)."""
        return self.build("response.content_part.added", response_id=response_id, item_id=item_id, output_index=output_index,
                          content_index=content_index, part=_part("", text))

    def content_part_done(self, response_id: str, item_id: str, transcript: str, output_index: int = 0,
                          content_index: int = 0, text: bool = False) -> E.ServerEvent:
        return self.build("response.content_part.done", response_id=response_id, item_id=item_id, output_index=output_index,
                          content_index=content_index, part=_part(transcript, text))

    def truncated(self, item_id: str, audio_end_ms: int, content_index: int = 0) -> E.ServerEvent:
        return self.build("conversation.item.truncated", item_id=item_id, content_index=content_index, audio_end_ms=int(audio_end_ms))

    def error(self, err: E.ProtocolError) -> E.ServerEvent:
        return self.build("error", error={"type": err.type, "code": err.code, "message": err.message, "param": err.param,
                                          "event_id": err.event_id})

    def turn_latency(self, report: dict) -> E.ServerEvent:
        """``report``: ``TurnReport.to_dict()``, carried unchanged."""
        return self.build("turn.latency", report=report)

    def session_latency(self, summary: dict) -> E.ServerEvent:
        return self.build("session.latency", summary=summary)

    def output_paused(self, audio_start_ms: int) -> E.ServerEvent:
        return self.build("output_audio.paused", audio_start_ms=int(audio_start_ms))

    def output_resumed(self, kind: str, text: str) -> E.ServerEvent:
        return self.build("output_audio.resumed", kind=kind, text=text)


def _part(words: str, text: bool) -> dict:
    """A ``response.content_part.*`` part: audio with its transcript, or (``text``) text."""
    return {"type": "text", "text": words} if text else {"type": "audio", "transcript": words}
