"""The Realtime wire (the OpenAI Realtime API subset ``wafervox serve`` speaks), sans-I/O, in three parts:

- ``events``: the typed client events the codec yields, ``ProtocolError``, and the server events (the
  ``SERVER_EVENTS`` table and the one ``ServerEvent`` class);
- ``config``: the negotiated ``SessionConfig`` / ``TurnDetection`` and their validation from ``session.update``;
- ``codec``: ``ProtocolSession`` (client JSON -> events, server events built and encoded, ids from an
  ``IdSource``) and the PCM16 base64 helpers;
- ``machine``: ``RealtimeConversation``, the conversation and response lifecycle as a state machine (typed client
  events and the voice loop's events in, server events out), with ``Voice``, what it asks of the loop;
- ``loop_voice``: ``LoopVoice``, that ``Voice`` on a running ``VoiceLoop`` and the server's engines (the one module
  here that runs engines; ``server.session`` wires the three together on its thread).

Users import the package: ``from server import realtime as P``, then ``P.ProtocolSession``, ``P.ItemCreate``...
(``machine`` and ``loop_voice`` by their module names: they import the voice loop; the codec needs only ``voice.g711``).
"""

from .codec import DEFAULT_MAX_MESSAGE_BYTES, PCM_DTYPE, IdSource, ProtocolSession, decode_audio, decode_pcm, encode_audio, encode_pcm
from .config import (
    AUDIO_FORMATS,
    DEFAULT_RATE,
    G711_FORMATS,
    G711_RATE,
    MAX_RATE,
    MIN_RATE,
    SessionConfig,
    TurnDetection,
    apply_session_update,
)
from .events import (
    SERVER_EVENTS,
    ClientEvent,
    FunctionOutputCreate,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    ItemCreate,
    ItemDelete,
    ItemRetrieve,
    ItemTruncate,
    OutputAudioPlayed,
    ProtocolError,
    ResponseCancel,
    ResponseCreate,
    ServerEvent,
    SessionLatencyRequest,
    SessionUpdate,
)

__all__ = [
    "AUDIO_FORMATS", "DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_RATE", "G711_FORMATS", "G711_RATE",
    "MAX_RATE", "MIN_RATE", "PCM_DTYPE", "SERVER_EVENTS",
    "ClientEvent", "FunctionOutputCreate",
    "IdSource", "InputAudioAppend", "InputAudioClear", "InputAudioCommit", "ItemCreate", "ItemDelete",
    "ItemRetrieve", "ItemTruncate",
    "OutputAudioPlayed", "ProtocolError", "ProtocolSession", "ResponseCancel", "ResponseCreate", "ServerEvent",
    "SessionConfig", "SessionLatencyRequest", "SessionUpdate", "TurnDetection",
    "apply_session_update", "decode_audio", "decode_pcm", "encode_audio", "encode_pcm",
]
