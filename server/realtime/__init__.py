"""The Realtime wire (the OpenAI Realtime API subset ``wafervox serve`` speaks), sans-I/O, in three parts:

- ``events``: the typed client events the codec yields, ``ProtocolError``, and the server events (the
  ``SERVER_EVENTS`` table and the one ``ServerEvent`` class);
- ``config``: the negotiated ``SessionConfig`` / ``TurnDetection`` and their validation from ``session.update``;
- ``codec``: ``ProtocolSession`` (client JSON -> events, server events built and encoded, ids from an
  ``IdSource``) and the PCM16 base64 helpers.

Users import the package: ``from server import realtime as P``, then ``P.ProtocolSession``, ``P.ItemCreate``...
"""

from .codec import DEFAULT_MAX_MESSAGE_BYTES, PCM_DTYPE, IdSource, ProtocolSession, decode_pcm, encode_pcm
from .config import DEFAULT_RATE, MAX_RATE, MIN_RATE, SessionConfig, TurnDetection, apply_session_update
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
    "DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_RATE", "MAX_RATE", "MIN_RATE", "PCM_DTYPE", "SERVER_EVENTS",
    "ClientEvent", "FunctionOutputCreate",
    "IdSource", "InputAudioAppend", "InputAudioClear", "InputAudioCommit", "ItemCreate", "ItemDelete",
    "ItemRetrieve", "ItemTruncate",
    "OutputAudioPlayed", "ProtocolError", "ProtocolSession", "ResponseCancel", "ResponseCreate", "ServerEvent",
    "SessionConfig", "SessionLatencyRequest", "SessionUpdate", "TurnDetection",
    "apply_session_update", "decode_pcm", "encode_pcm",
]
