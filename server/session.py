"""One connection's realtime session: its own voice loop, conversation, KV cache, VAD and budget, run on its own
thread so that its compute never holds up the event loop.

The websocket adapter (``server.app``) only moves bytes: it ``submit()``s every client message and writes out what the
session hands to ``emit(frame, droppable)``.  Everything else happens on the session thread, and this module is the
adapter between its parts: the codec (``server.realtime.ProtocolSession``) parses each message into typed client events;
the conversation machine (``server.realtime.machine.RealtimeConversation``) turns them, and the voice loop's events and
output audio, into server events; ``LoopVoice`` (``server.realtime.loop_voice``) is what the machine asks of the loop
and its engines; the ``VoiceLoop`` is fed and stepped here (``run_until``, polling the inbox between pieces of work).
Output audio is resampled to the session's output rate and framed here: ``response.output_audio.delta`` events, or raw
PCM16 frames on ``/v1/stream``.

Two ways to talk: ``/v1/realtime`` (JSON events, base64 audio, the OpenAI Realtime subset) and the native
``/v1/stream`` (binary frames of raw PCM16 both ways, JSON events for the rest).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from voice import loop_events as L
from voice.clock import RealClock
from voice.loop import LoopConfig, VoiceLoop, run_until
from voice.protocols import ASR_RATE

from . import realtime as P
from . import tracing
from .memory import trim
from .realtime.config import G711_FORMATS
from .realtime.loop_voice import LoopVoice
from .realtime.machine import AudioOut, Output, RealtimeConversation

log = logging.getLogger("wafervox.server")
DELTA_MS = 200  # longest output audio delta
#: the most often a turn's end trims the allocator's heaps (for the whole process)
TRIM_INTERVAL_S = 5.0
IDLE_WAIT_S = 0.02  # the longest the session thread waits for a message before it looks at the loop again


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-server and per-session limits; every one ends in a clear error, never in unbounded memory."""

    max_sessions: int = 4
    max_message_bytes: int = P.DEFAULT_MAX_MESSAGE_BYTES
    max_input_s: float = 30.0  # received-but-unprocessed input, and the longest utterance
    max_output_bytes: int = 8 << 20  # output queued for a client that does not read; then audio is dropped
    idle_timeout_s: float = 300.0  # no message from the client for this long: closed

    def session_buffer_bytes(self, input_rate: int = 24000) -> int:
        """The most one session's wire buffers hold: its input backlog (base64 text, the larger form) and
        the utterance kept, plus its output queue (events may reach twice the audio limit)."""
        backlog = self.backlog_bytes(input_rate)
        utterance = int(self.max_input_s * ASR_RATE * 2)
        return backlog + utterance + 2 * self.max_output_bytes

    def backlog_bytes(self, input_rate: int, g711: bool = False, binary: bool = False) -> int:
        """The most input waiting for the session's thread: ``max_input_s`` of audio in the session's format (a byte a
        G.711 sample, two a PCM16 one), as base64 text (4/3 of it) unless ``binary``, plus one message."""
        return int(self.max_input_s * input_rate * (1 if g711 else 2) * (1 if binary else 4 / 3)) + self.max_message_bytes


class RealtimeSession:
    """``submit(msg)`` from the event loop; the rest runs on ``self.thread``."""

    recorder = None  # a voice.recording.SessionRecording that follows the loop (wafervox serve --record DIR)

    def __init__(self, shared, emit: Callable[[str | bytes, bool], None], *, native: bool = False, limits: Limits = Limits(),
                 ids: Callable[[str], str] | None = None, loop_config: LoopConfig | None = None, metrics=None,
                 close: Callable[[int, str], None] | None = None, name: str = "session", extensions: bool = False):
        self.shared = shared
        self.emit = emit
        self.native = native
        #: send our extension events (turn.latency; session.latency at close): the client asked for them
        #: (``/v1/stream``, or ``/v1/realtime?extensions=1``). A ``session.latency`` request is answered either way.
        self.extensions = extensions
        self.limits = limits
        self.metrics = metrics
        self.close_connection = close or (lambda code, reason: None)
        self.name = name
        persona = shared.base.llm.persona
        self.proto = P.ProtocolSession(P.SessionConfig(instructions=persona.system), ids=ids, max_message_bytes=limits.max_message_bytes)
        self.voice = LoopVoice(shared, self.proto.config, limits.max_input_s)
        self.machine = RealtimeConversation(self.proto, self.voice, extensions=extensions, metrics=metrics)
        self.loop_config = loop_config or LoopConfig()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0  # bytes of submitted messages not yet handled
        self._backlog_reported = False  # an input backlog episode was reported
        self._pending_lock = threading.Lock()
        self._closing = threading.Event()
        self.last_message = time.monotonic()
        self._summary: dict | None = None  # kept when the session closes
        self._trace: tracing.SessionTrace | None = None  # its OpenTelemetry spans (``wafervox serve --otel``)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def loop(self) -> VoiceLoop | None:
        """The session's voice loop, while it runs."""
        return self.voice.loop

    # -- event-loop side ---------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def submit(self, msg: str | bytes) -> bool:
        """Queue one client message; False (and an error to the client) when the session's input
        backlog is over its limit, in which case the message is dropped."""
        self.last_message = time.monotonic()
        size = len(msg)
        if size > self.limits.max_message_bytes:  # (text is counted in characters here: at most its UTF-8 bytes)
            self.inbox.put(P.ProtocolError("message_too_large", f"{'binary' if isinstance(msg, bytes) else 'text'} message of "
                                             f"{size} bytes exceeds the limit of {self.limits.max_message_bytes} bytes; dropped"))
            return False
        cfg = self.proto.config
        cap = self.limits.backlog_bytes(cfg.input_rate, cfg.input_format in G711_FORMATS, isinstance(msg, bytes))
        with self._pending_lock:
            over = self._pending + size > cap
            if not over:
                self._pending += size
                if self._pending < cap // 2:
                    self._backlog_reported = False
            report, self._backlog_reported = over and not self._backlog_reported, self._backlog_reported or over
        if over:
            if report:  # one error per episode, not one per dropped message (in its place among the messages)
                self.inbox.put(P.ProtocolError("input_audio_buffer_overflow", f"more than {self.limits.max_input_s:g} s of "
                                                 "input is waiting to be processed; messages are dropped until it is"))
            return False
        self.inbox.put(msg)
        return True

    def stop(self) -> None:
        self._closing.set()
        self.inbox.put(None)

    # -- session thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        failed = None
        try:
            self._write([self.proto.session_created()])  # first: messages sent meanwhile wait in the inbox
            # the audio sent cannot be taken back (``clear_after``): speech over the answer is judged with it going on
            config = replace(self.loop_config, interruption=replace(self.loop_config.interruption, hold_output=False))
            loop = VoiceLoop(self.shared.session(), sink=self, clock=RealClock(), config=config, on_event=self._on_loop_event)
            self._trace = tracing.open_session(self.name, loop, "stream" if self.native else "realtime")
            if self.recorder is not None:  # wafervox serve --record DIR (voice.recording; set by server.app)
                self.recorder.attach(loop)
            self.voice.start(loop)
            while not self._closing.is_set():
                run_until(loop, loop.clock.now() + IDLE_WAIT_S, poll=self._drain)
        except Exception as e:  # a bug, or an engine failing: this session ends, the server goes on
            failed = e
            log.exception("%s failed", self.name)
            self._write([self.proto.error(P.ProtocolError("server_error", f"the session failed: {type(e).__name__}: {e}",
                                                          type="server_error"))])
            self.close_connection(1011, "internal error")
        finally:
            if self._trace is not None:  # (a turn cut by the end has no report: its spans were never opened)
                self._trace.close("error" if failed else "closed", error=failed, cut_turn=bool(self.loop and self.loop.answering))
            self._release()

    def _release(self) -> None:
        """The session is over: keep its summary, free its KV cache and scratch now, and break the references
        back to this object (the loop's sink and callbacks, the connection's), so the rest is freed as soon as
        the server drops the session, with no garbage collector run needed."""
        if self.loop is not None:
            self._summary = self.summary()
        self.voice.close()
        self.emit = lambda frame, droppable: None
        self.close_connection = lambda code, reason: None
        self.machine.close()

    def _drain(self, timeout_s: float) -> None:
        """Handle the messages that arrive within ``timeout_s`` (0: only those waiting); returns once some came."""
        self.voice.boundary()  # new instructions apply between turns
        try:
            msg = self.inbox.get(timeout=timeout_s) if timeout_s > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        for _ in range(1000):
            if msg is None:
                return
            if not isinstance(msg, P.ProtocolError):  # (else a message refused on arrival, reported in its turn)
                with self._pending_lock:
                    self._pending -= len(msg)
            for ev in self._events(msg):
                self._write(self.machine.handle(ev))
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _events(self, msg: str | bytes | P.ProtocolError) -> list[P.ClientEvent | P.ProtocolError]:
        """A client message as typed client events: JSON text through the codec, a binary frame as input audio."""
        if isinstance(msg, P.ProtocolError):
            return [msg]
        if not isinstance(msg, bytes):
            return self.proto.receive(msg)
        if not self.native:
            return [P.ProtocolError("binary_not_supported", "binary frames are only accepted on /v1/stream; send "
                                    "input_audio_buffer.append events here")]
        if len(msg) % 2:
            return [P.ProtocolError("invalid_audio", f"binary frame of {len(msg)} bytes is not whole PCM16 samples")]
        samples = np.frombuffer(msg, P.PCM_DTYPE).astype(np.int16)
        return [P.InputAudioAppend(event_id=None, samples=samples, rate=self.proto.config.input_rate)]

    def _on_loop_event(self, ev: L.LoopEvent) -> None:
        if self._trace is not None:
            self._trace.on_event(ev)
        self._write(self.machine.on_loop_event(ev))
        if isinstance(ev, L.TurnEnded):
            self.voice.boundary()  # (else at the next turn boundary)
            trim(TRIM_INTERVAL_S)  # a turn's temporaries, freed, go back to the system (off the critical path: it is over)

    def summary(self) -> dict:
        if self.loop is None and self._summary is not None:  # closed
            return self._summary
        return self.machine.summary()

    # -- the sink the loop plays into --------------------------------------------------------------

    def play(self, t: float, pcm: np.ndarray) -> None:
        if self.machine.responding:  # only answers go on the wire
            out = self.voice.output(pcm)
            if out is not None:
                self._write(self.machine.audio(out))

    def clear_after(self, t: float) -> None:
        """Barge-in: audio already sent cannot be recalled; ``response.done`` (cancelled) tells the client to stop."""

    # -- output ------------------------------------------------------------------------------------

    def _write(self, outputs: list[Output]) -> None:
        for out in outputs:
            if isinstance(out, AudioOut):
                self._write_audio(out)
                continue
            if out.type == "error":
                err = out.error
                if self.metrics:
                    self.metrics.error(err["code"])
                log.info("%s: error %s: %s", self.name, err["code"], err["message"])
            self.emit(out.to_json(), False)

    def _write_audio(self, out: AudioOut) -> None:
        """In deltas of at most ``DELTA_MS`` (TTS hands over whole sentences); droppable for a client that does not read."""
        step = self.proto.config.output_rate * DELTA_MS // 1000
        for i in range(0, len(out.pcm), step):
            piece = out.pcm[i:i + step]
            if self.native:
                self.emit(piece.astype(P.PCM_DTYPE, copy=False).tobytes(), True)
            else:
                self.emit(self.proto.audio_delta(out.response_id, out.item_id, piece, out.output_index).to_json(), True)
