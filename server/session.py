"""One connection's realtime session: its own voice loop, conversation, KV cache, VAD and budget,
run on its own thread so that its compute never holds up the event loop.

The websocket adapter (``server.app``) only moves bytes: it ``submit()``s every client message and
writes out what the session hands to ``emit(frame, droppable)``.  Everything else happens here, on
the session thread: the codec (``server.realtime``) parses the message, the ``VoiceLoop`` is fed and
stepped (``run_until``, polling the inbox between pieces of work), and the loop's events
(``voice.loop_events``) become server events.  Output audio is resampled to the session's output
rate and counted in output samples since the session began, which is the position the client's
``output_audio.played`` refers to; each answer's ``Playout`` in those units says which of its words
were heard.

Two ways to talk: ``/v1/realtime`` (JSON events, base64 audio, the OpenAI Realtime subset) and the
native ``/v1/stream`` (binary frames of raw PCM16 both ways, JSON events for the rest).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from voice.audio import AudioChunk, Resampler
from voice.clock import RealClock
from voice.latency import percentile, summarize
from voice.llm import Persona
from voice.loop import LoopConfig, VoiceLoop, run_until
from voice.loop_events import (
    FunctionCallDelta,
    IdleTimeout,
    LoopEvent,
    PhraseStarted,
    ResponseStarted,
    TranscriptFinal,
    TurnEnded,
    UserSpeechStarted,
    UserSpeechStopped,
)
from voice.playout import Playout
from voice.protocols import ASR_RATE

from . import realtime as P
from .memory import trim

log = logging.getLogger("wafervox.server")
DELTA_MS = 200  # longest output audio delta
#: audio may run this far past ``max_input_s`` ahead of the clock before it is dropped, so that one over-long
#: utterance sent at once meets the utterance limit (cleared, its own error) first
AHEAD_GRACE_S = 1.0
#: the most often a turn's end trims the allocator's heaps (for the whole process)
TRIM_INTERVAL_S = 5.0
#: text items waiting for response.create, in characters (several times what the 2,048-token context holds)
MAX_TYPED_CHARS = 32_000
#: conversation items kept for conversation.item.retrieve / .delete / .truncate (the oldest are forgotten)
MAX_ITEMS = 64
#: tokens kept free for a user turn (its message, the facts and the chat markup) when instructions are checked
TURN_RESERVE_TOKENS = 256
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
        backlog = int(self.max_input_s * input_rate * 2 * 4 / 3) + self.max_message_bytes
        utterance = int(self.max_input_s * ASR_RATE * 2)
        return backlog + utterance + 2 * self.max_output_bytes


@dataclass
class _Answer:
    """One response on the wire."""

    response_id: str
    item_id: str
    user_item: str | None
    last_voiced: int | None  # input sample (ASR_RATE) of the user's last voiced sample
    first_sample: int | None = None  # output sample index of its first audio sample
    samples: int = 0
    playout: Playout = field(default_factory=Playout)  # its phrases' audio, in output samples
    client: dict | None = None  # voice-to-voice on the client's clock, once it told us
    reported: dict | None = None  # the turn.latency report sent
    metadata: dict | None = None  # response.create's, echoed in the response object
    message_index: int | None = None  # the assistant message's output index, once it was added (its first audio or phrase)
    #: the response's output items in order: ("message", item id) or ("call", call id)
    outputs: list = field(default_factory=list)
    calls: dict = field(default_factory=dict)  # call id -> [item id, output index, name, arguments, done]


class RealtimeSession:
    """``submit(msg)`` from the event loop; the rest runs on ``self.thread``."""

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
        self._default_persona = persona
        self.proto = P.ProtocolSession(P.SessionConfig(instructions=persona.system), ids=ids, max_message_bytes=limits.max_message_bytes)
        self._config = self.proto.config  # the configuration in force (a refused session.update goes back to it)
        self.loop_config = loop_config or LoopConfig()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0  # bytes of submitted messages not yet handled
        self._backlog_reported = False  # an input backlog episode was reported
        self._pending_lock = threading.Lock()
        self._closing = threading.Event()
        self.last_message = time.monotonic()
        self.loop: VoiceLoop | None = None
        self._out_rs: Resampler | None = None
        self._out_samples = 0
        self._answer: _Answer | None = None
        self._answers: dict[str, _Answer] = {}  # by assistant item id (the last few)
        self._items: dict[str, tuple[str | None, dict]] = {}  # item id -> (previous item id, realtime.item), in order
        self._user_item: str | None = None  # the item the current speech becomes
        self._speech_start = 0  # input sample (ASR_RATE) where it started
        self._last_voiced: int | None = None
        self._typed: list[str] = []  # text items waiting for response.create
        self._tool_output = False  # a tool's result came (function_call_output): response.create goes on from it
        self._metadata: dict | None = None  # response.create's metadata, for the response it starts
        self._deferred_engines = None
        self._summary: dict | None = None  # kept when the session closes
        self._audio_origin: float | None = None  # monotonic time the input audio taken would have started at, in real time
        self._audio_s = 0.0  # input audio taken, in seconds
        self._ahead_reported = False  # an "arriving faster than real time" episode was reported
        self.client_v2v: list[float] = []
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

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
        rate = self.proto.config.input_rate
        cap = int(self.limits.max_input_s * rate * 2 * (1 if isinstance(msg, bytes) else 4 / 3)) + self.limits.max_message_bytes
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
        try:
            self._send(self.proto.session_created())  # first: messages sent meanwhile wait in the inbox
            engines = self.shared.session()
            self.loop = VoiceLoop(engines, sink=self, clock=RealClock(), config=self.loop_config, on_event=self._on_loop_event)
            engines.llm.prepare()  # the persona's KV prefix (copied from the shared one, so usually nothing to do)
            self._out_rs = Resampler(self.shared.sample_rate, self.proto.config.output_rate)
            while not self._closing.is_set():
                run_until(self.loop, self.loop.clock.now() + IDLE_WAIT_S, poll=self._drain)
        except Exception as e:  # a bug, or an engine failing: this session ends, the server goes on
            log.exception("%s failed", self.name)
            if self.metrics:
                self.metrics.error("server_error")
            self._send_error(P.ProtocolError("server_error", f"the session failed: {type(e).__name__}: {e}", type="server_error"))
            self.close_connection(1011, "internal error")
        finally:
            self._release()

    def _release(self) -> None:
        """The session is over: keep its summary, free its KV cache and scratch now, and break the references
        back to this object (the loop's sink and callbacks, the connection's), so the rest is freed as soon as
        the server drops the session, with no garbage collector run needed."""
        loop = self.loop
        if loop is not None:
            self._summary = self.summary()
            loop.close()
            for engines in (loop.e, self._deferred_engines):
                if engines is not None:
                    engines.llm.close()
                    if engines.turn_end is not None:
                        engines.turn_end.generator.close()
        self.loop = self._deferred_engines = None
        self.emit = lambda frame, droppable: None
        self.close_connection = lambda code, reason: None
        self._answer = None
        self._answers.clear()
        self._items.clear()

    def _drain(self, timeout_s: float) -> None:
        """Handle the messages that arrive within ``timeout_s`` (0: only those waiting); returns once some came."""
        if self._deferred_engines is not None and not self.loop.in_progress:  # a turn boundary: new instructions apply
            self._swap_engines(self._deferred_engines)
        try:
            msg = self.inbox.get(timeout=timeout_s) if timeout_s > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        for _ in range(1000):
            if msg is None:
                return
            if isinstance(msg, P.ProtocolError):  # a message refused on arrival, reported in its turn
                self._send_error(msg)
            else:
                with self._pending_lock:
                    self._pending -= len(msg)
                self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg: str | bytes) -> None:
        if isinstance(msg, bytes):
            if not self.native:
                events = [P.ProtocolError("binary_not_supported", "binary frames are only accepted on /v1/stream; send "
                                          "input_audio_buffer.append events here")]
            elif len(msg) % 2:
                events = [P.ProtocolError("invalid_audio", f"binary frame of {len(msg)} bytes is not whole PCM16 samples")]
            else:
                events = [P.InputAudioAppend(event_id=None, samples=np.frombuffer(msg, P.PCM_DTYPE).astype(np.int16),
                                             rate=self.proto.config.input_rate)]
        else:
            events = self.proto.receive(msg)
        for ev in events:
            handler = self._HANDLERS.get(type(ev))
            handler(self, ev)

    # -- client events -----------------------------------------------------------------------------

    def _on_error(self, err: P.ProtocolError) -> None:
        self._send_error(err)

    def _on_update(self, ev: P.SessionUpdate) -> None:
        cfg = ev.config
        if "instructions" in ev.changed:
            persona = self._default_persona if cfg.instructions.strip() in ("", self._default_persona.system) \
                else Persona.from_instructions(cfg.instructions)
            llm = self.loop.e.llm
            need, room = llm.opening_tokens(persona) + TURN_RESERVE_TOKENS, llm.n_ctx - llm.max_tokens
            if need > room:  # the whole update is refused: the codec's config goes back to the one in force
                self.proto.config = self._config
                self._send_error(P.ProtocolError(
                    "context_length_exceeded", f"session.update: the instructions take {need - TURN_RESERVE_TOKENS} tokens and "
                    f"a turn needs {TURN_RESERVE_TOKENS} more, over the {room} the {llm.n_ctx}-token context leaves "
                    "beside the answer; the session is unchanged", ev.event_id, "session.instructions"))
                return
            if persona != llm.persona:
                engines = self.shared.with_persona(self.loop.e, persona)
                if not self.loop.in_progress:
                    self._swap_engines(engines)
                else:  # at the turn boundary: never under an open (or speculative) answer
                    self._deferred_engines = engines
        if "turn_detection" in ev.changed:
            td = cfg.turn_detection
            if td is None:
                lc = self.loop.cfg.manual()
            elif td.type == "semantic_vad":
                lc = self.loop.cfg.with_semantic_turn_detection(eagerness=td.eagerness, interrupt_response=td.interrupt_response,
                                                                create_response=td.create_response)
            else:
                lc = self.loop.cfg.with_turn_detection(threshold=td.threshold, silence_duration_ms=td.silence_duration_ms,
                                                       prefix_padding_ms=td.prefix_padding_ms,
                                                       interrupt_response=td.interrupt_response,
                                                       create_response=td.create_response, idle_timeout_ms=td.idle_timeout_ms)
            self.loop.configure(lc)
        if "output_rate" in ev.changed:
            self._out_rs = Resampler(self.shared.sample_rate, cfg.output_rate)
        if "tools" in ev.changed and cfg.tools and not self.loop.e.llm.calls_tools:
            self._send_error(P.ProtocolError(
                "tools_not_supported", f"session.update: {len(cfg.tools)} tool(s) accepted but never called: the local "
                "model cannot call tools (an OpenAI-compatible backend, `wafervox serve --llm URL`, can); the rest of the "
                "update applies", ev.event_id, "session.tools"))
        self._config = cfg
        self._set_tools(self.loop.e.llm)
        self._send(self.proto.session_updated())

    def _swap_engines(self, engines) -> None:
        self.loop.set_engines(engines)
        self._deferred_engines = None
        self._set_tools(engines.llm)

    def _set_tools(self, llm, choice=None) -> None:
        """The session's tools (and ``choice``, else its tool_choice) to an LLM that calls tools."""
        if llm.calls_tools:
            from voice.openai_llm import chat_tool, chat_tool_choice

            llm.tools = tuple(chat_tool(t) for t in self._config.tools)
            llm.tool_choice = chat_tool_choice(choice or self._config.tool_choice)

    def _on_append(self, ev: P.InputAudioAppend) -> None:
        if not len(ev.samples):
            return
        now = time.monotonic()
        if self._audio_origin is None or now - self._audio_origin > self._audio_s:
            self._audio_origin = now - self._audio_s  # behind the clock (a pause in sending) earns no credit for a burst
        ahead = self._audio_s + len(ev.samples) / ev.rate - (now - self._audio_origin)
        if ahead > self.limits.max_input_s + AHEAD_GRACE_S:  # a client sending faster than real time, past the backlog we take
            if not self._ahead_reported:
                self._ahead_reported = True
                self._send_error(P.ProtocolError("input_audio_buffer_overflow", f"audio is arriving faster than real time: "
                                                 f"{ahead:.1f} s ahead of the clock, over the {self.limits.max_input_s:g} s "
                                                 "limit; audio is dropped until the clock catches up", ev.event_id))
            return
        self._ahead_reported = False
        self._audio_s += len(ev.samples) / ev.rate
        self.loop.feed(AudioChunk(ev.samples, ev.rate, 0))
        if self.loop.buffered_s() > self.limits.max_input_s:
            self.loop.clear_input()
            self._send_error(P.ProtocolError("input_audio_buffer_overflow", f"the utterance is longer than {self.limits.max_input_s:g} s; "
                                             "the input buffer was cleared", ev.event_id))

    def _on_commit(self, ev: P.InputAudioCommit) -> None:
        if not self.loop.commit_input():
            why = "an answer is in progress" if self.loop.answering else "the input buffer is empty"
            self._send_error(P.ProtocolError("input_audio_buffer_commit_empty", f"nothing to commit: {why}", ev.event_id))

    def _on_clear(self, ev: P.InputAudioClear) -> None:
        self.loop.clear_input()
        self._user_item = None
        self._send(self.proto.cleared())

    def _on_item(self, ev: P.ItemCreate) -> None:
        waiting = sum(len(t) for t in self._typed) + len(ev.text)
        if waiting > MAX_TYPED_CHARS:  # more text than any prompt can hold: not kept
            self._send_error(P.ProtocolError("context_length_exceeded", f"{waiting} characters of text items are waiting for "
                                             f"response.create, over the {MAX_TYPED_CHARS} a prompt could hold; this item "
                                             "was dropped", ev.event_id, "item.content"))
            return
        self._typed.append(ev.text)
        self._add_item(self.proto.user_item(ev.item_id, text=ev.text), done=True)

    def _on_function_output(self, ev: P.FunctionOutputCreate) -> None:
        llm = self.loop.e.llm
        if not llm.calls_tools:
            self._send_error(P.ProtocolError("unsupported_item", "function_call_output: the local model calls no tools, so "
                                             "there is no call to answer", ev.event_id, "item.type"))
            return
        llm.add_function_output(ev.call_id, ev.output)
        self._tool_output = True
        self._add_item(self.proto.function_output_item(ev.item_id, ev.call_id, ev.output), done=True)

    def _on_response_create(self, ev: P.ResponseCreate) -> None:
        llm = self.loop.e.llm
        # this response's own instructions (None or blank: the session's), counted in the prompt below
        llm.instructions = ev.instructions if ev.instructions and ev.instructions.strip() else None
        if not self._typed and self._tool_output:  # the answer goes on from the tools' results
            self._respond(ev, None)
            return
        if not self._typed:
            llm.instructions = None
            self._send_error(P.ProtocolError("no_user_input", "response.create needs a user text item first "
                                             "(spoken turns are answered by themselves)", ev.event_id))
            return
        text = " ".join(self._typed)
        need, n_ctx = llm.prompt_tokens(text) + llm.max_tokens, llm.n_ctx
        if need > n_ctx:
            llm.instructions = None
            self._typed.clear()
            self._send_error(P.ProtocolError("context_length_exceeded", f"the user text ({len(text)} characters) with the "
                                             f"instructions and room for the answer takes {need} tokens, over the {n_ctx}-token "
                                             "context; the text items were dropped", ev.event_id, "item.content"))
            return
        self._respond(ev, text)

    def _respond(self, ev: P.ResponseCreate, text: str | None) -> None:
        """Start the response ``ev`` asks for: to the typed ``text``, or (None) going on after the tools' results."""
        llm = self.loop.e.llm
        if ev.tool_choice is not None:
            self._set_tools(llm, ev.tool_choice)
        self._metadata = None if ev.metadata is None else dict(ev.metadata)
        if not self.loop.respond_text(text):
            self._metadata = None
            llm.instructions = None
            self._send_error(P.ProtocolError("conversation_already_has_active_response",
                                             "a response is in progress; cancel it or wait for response.done", ev.event_id))
            return
        if text is not None:
            self._typed.clear()
        self._tool_output = False
        self._user_item = None

    def _on_cancel(self, ev: P.ResponseCancel) -> None:
        if ev.response_id and (self._answer is None or self._answer.response_id != ev.response_id):
            self._send_error(P.ProtocolError("response_not_found", f"no active response '{ev.response_id}'", ev.event_id, "response_id"))
        elif not self.loop.cancel():
            self._send_error(P.ProtocolError("response_cancel_not_active", "there is no response to cancel", ev.event_id))

    def _on_truncate(self, ev: P.ItemTruncate) -> None:
        a = self._answers.get(ev.item_id)
        if a is None:
            self._send_error(P.ProtocolError("item_not_found", f"no assistant audio item '{ev.item_id}'", ev.event_id, "item_id"))
            return
        rate = self.proto.config.output_rate
        if ev.audio_end_ms * rate // 1000 > a.samples:
            self._send_error(P.ProtocolError("invalid_value", f"audio_end_ms {ev.audio_end_ms} is past the item's "
                                             f"{a.samples * 1000 // rate} ms of audio", ev.event_id, "audio_end_ms"))
            return
        if a is self._answer:
            self.loop.cancel("client_truncated")
        heard = a.playout.heard((a.first_sample or 0) + ev.audio_end_ms * rate // 1000)
        if a is self._last_answer():
            self.loop.amend_reply(heard)
        kept = self._items.get(ev.item_id)
        if kept is not None:
            self._items[ev.item_id] = (kept[0], self.proto.assistant_item(ev.item_id, heard, "incomplete"))
        self._send(self.proto.truncated(ev.item_id, ev.audio_end_ms, ev.content_index))

    def _on_retrieve(self, ev: P.ItemRetrieve) -> None:
        kept = self._items.get(ev.item_id)
        if kept is None:
            self._send_error(P.ProtocolError("item_not_found", f"no item '{ev.item_id}' in the conversation (the last "
                                             f"{MAX_ITEMS} are kept)", ev.event_id, "item_id"))
            return
        self._send(self.proto.item_retrieved(kept[1]))

    def _on_delete(self, ev: P.ItemDelete) -> None:
        if ev.item_id not in self._items:
            self._send_error(P.ProtocolError("item_not_found", f"no item '{ev.item_id}' in the conversation", ev.event_id, "item_id"))
            return
        if self._answer is not None and ev.item_id == self._answer.item_id:
            self._send_error(P.ProtocolError("conversation_already_has_active_response", f"item '{ev.item_id}' is the answer "
                                             "in progress; cancel the response first", ev.event_id, "item_id"))
            return
        del self._items[ev.item_id]
        self._answers.pop(ev.item_id, None)
        self._send(self.proto.item_deleted(ev.item_id))

    # -- the conversation's items --------------------------------------------------------------------

    def _add_item(self, item: dict, done: bool = False) -> None:
        """``conversation.item.added`` for a new item (after the newest kept), and ``.done`` at once when ``done``."""
        previous = next(reversed(self._items), None)
        self._items[item["id"]] = (previous, item)
        while len(self._items) > MAX_ITEMS:
            self._items.pop(next(iter(self._items)))
        self._send(self.proto.item_added(item, previous))
        if done:
            self._send(self.proto.item_done(item, previous))

    def _item_done(self, item: dict) -> None:
        """``conversation.item.done`` for a kept item, now ``item``."""
        kept = self._items.get(item["id"])
        previous = kept[0] if kept is not None else next(reversed(self._items), None)
        if kept is not None:
            self._items[item["id"]] = (previous, item)
        self._send(self.proto.item_done(item, previous))

    def _usage(self) -> dict | None:
        """The token counts of the reply just ended (``response.done``'s ``usage``), when the LLM has them."""
        usage = self.loop.e.llm.last_usage
        return None if usage is None else usage.to_realtime()

    def _last_answer(self) -> _Answer | None:
        return next(reversed(self._answers.values()), None)

    def _on_played(self, ev: P.OutputAudioPlayed) -> None:
        if ev.item_id:
            a = self._answers.get(ev.item_id)
        else:  # the answer whose audio holds the played sample
            a = next((x for x in reversed(self._answers.values())
                      if x.first_sample is not None and x.first_sample <= ev.sample < x.first_sample + x.samples), None)
        if a is None or a.client is not None or a.first_sample is None or a.last_voiced is None or ev.sample < a.first_sample:
            return
        rate_out = self.proto.config.output_rate
        ahead_ms = (ev.sample - a.first_sample) * 1000 / rate_out  # the first answer sample played this much earlier
        if ev.input_sample is not None:
            rate_in = self.proto.config.input_rate
            v2v = (ev.input_sample - a.last_voiced * rate_in / ASR_RATE) * 1000 / rate_in - ahead_ms
            clock = "client_audio"
        else:
            v2v = (self.loop.clock.now() - self.loop.audio_time(a.last_voiced)) * 1000 - ahead_ms
            clock = "server_receipt"
        a.client = {"voice_to_voice_ms": round(v2v, 1), "clock": clock}
        self.client_v2v.append(v2v)
        if a.reported is not None:  # the turn was reported already: send it again, completed
            self._send_latency(a, a.reported)

    def _on_latency_request(self, ev: P.SessionLatencyRequest) -> None:
        self._send(self.proto.session_latency(self.summary()))

    def summary(self) -> dict:
        if self.loop is None and self._summary is not None:  # closed
            return self._summary
        out = summarize(self.loop.reports if self.loop else [])
        p50, p95 = percentile(self.client_v2v, 0.5), percentile(self.client_v2v, 0.95)
        out["client_voice_to_voice_ms"] = {"p50": None if p50 is None else round(p50, 1), "p95": None if p95 is None else round(p95, 1),
                                           "turns": len(self.client_v2v)}
        return out

    _HANDLERS: dict = {
        P.ProtocolError: _on_error,
        P.SessionUpdate: _on_update,
        P.InputAudioAppend: _on_append,
        P.InputAudioCommit: _on_commit,
        P.InputAudioClear: _on_clear,
        P.ItemCreate: _on_item,
        P.FunctionOutputCreate: _on_function_output,
        P.ResponseCreate: _on_response_create,
        P.ResponseCancel: _on_cancel,
        P.ItemTruncate: _on_truncate,
        P.ItemRetrieve: _on_retrieve,
        P.ItemDelete: _on_delete,
        P.OutputAudioPlayed: _on_played,
        P.SessionLatencyRequest: _on_latency_request,
    }

    # -- the loop's events -------------------------------------------------------------------------

    def _on_loop_event(self, ev: LoopEvent) -> None:
        self._LOOP_HANDLERS[type(ev)](self, ev)

    def _on_speech_started(self, ev: UserSpeechStarted) -> None:
        self._user_item = self.proto.new_item_id()
        self._speech_start = ev.first_voiced_sample
        self._send(self.proto.speech_started(_ms(ev.first_voiced_sample), self._user_item))

    def _on_speech_stopped(self, ev: UserSpeechStopped) -> None:
        item = self._user_item or self.proto.new_item_id()
        if self.loop.cfg.turn_detection:
            self._send(self.proto.speech_stopped(_ms(ev.last_voiced_sample), item))
        self._send(self.proto.committed(item))
        self._add_item(self.proto.user_item(item, transcript=None))
        self._user_item = item
        self._last_voiced = ev.last_voiced_sample
        self._speech_start = ev.first_voiced_sample

    def _on_transcript(self, ev: TranscriptFinal) -> None:
        if self._user_item is not None:
            seconds = max(0, (self._last_voiced or 0) - self._speech_start) / ASR_RATE
            self._send(self.proto.transcription_completed(self._user_item, ev.text, seconds))
            self._item_done(self.proto.user_item(self._user_item, transcript=ev.text))
            if not self.loop.cfg.create_response and ev.text.strip():  # answered when the client sends response.create
                self._typed.append(ev.text.strip())

    def _on_response_started(self, ev: ResponseStarted) -> None:
        metadata, self._metadata = self._metadata, None
        created = self.proto.response_created(metadata)
        spoken = self._user_item is not None
        self._answer = _Answer(created.response_id, self.proto.new_item_id(), self._user_item,
                               self._last_voiced if spoken else None, metadata=metadata)
        self._user_item = None
        self._answers[self._answer.item_id] = self._answer
        while len(self._answers) > 16:
            self._answers.pop(next(iter(self._answers)))
        self._send(created)

    def _message(self, a: _Answer) -> int:
        """The answer's assistant message item, added on its first audio or phrase (a response that only calls a tool
        has none); returns its output index."""
        if a.message_index is None:
            a.message_index = len(a.outputs)
            a.outputs.append(("message", a.item_id))
            item = self.proto.assistant_item(a.item_id, None, "in_progress")
            self._send(self.proto.output_item_added(a.response_id, item, a.message_index))
            self._add_item(item)
            self._send(self.proto.content_part_added(a.response_id, a.item_id, a.message_index))
        return a.message_index

    def _on_phrase(self, ev: PhraseStarted) -> None:
        a = self._answer
        if a is not None:
            index = self._message(a)
            a.playout.begin_phrase(ev.text)  # the audio sent from now on is this phrase's
            delta = ev.text if ev.index == 0 else " " + ev.text
            self._send(self.proto.transcript_delta(a.response_id, a.item_id, delta, index))

    def _on_idle_timeout(self, ev: IdleTimeout) -> None:
        """``idle_timeout_ms`` passed with no speech: the silent audio becomes an (empty) user item, then the prompt."""
        item = self.proto.new_item_id()
        self._send(self.proto.timeout_triggered(_ms(ev.start_sample), _ms(ev.end_sample), item))
        self._send(self.proto.committed(item))
        self._add_item(self.proto.user_item(item, transcript=""), done=True)

    def _on_function_call(self, ev: FunctionCallDelta) -> None:
        a, p = self._answer, ev.piece
        if a is None:
            return
        call = a.calls.get(p.call_id)
        if call is None:
            call = a.calls[p.call_id] = [self.proto.new_item_id(), len(a.outputs), p.name, "", False]
            a.outputs.append(("call", p.call_id))
            item = self.proto.function_call_item(call[0], p.call_id, p.name, "", "in_progress")
            self._send(self.proto.output_item_added(a.response_id, item, call[1]))
            self._add_item(item)
        if p.delta:
            call[3] += p.delta
            self._send(self.proto.arguments_delta(a.response_id, call[0], call[1], p.call_id, p.delta))
        if p.done:
            call[3], call[4] = p.arguments, True
            self._send(self.proto.arguments_done(a.response_id, call[0], call[1], p.call_id, p.name, p.arguments))
            item = self.proto.function_call_item(call[0], p.call_id, p.name, p.arguments, "completed")
            self._send(self.proto.output_item_done(a.response_id, item, call[1]))
            self._item_done(item)

    def _on_turn_ended(self, ev: TurnEnded) -> None:
        a, self._answer = self._answer, None
        report = ev.report
        if a is not None:
            status = "incomplete" if ev.cancelled or ev.error else "completed"
            if a.message_index is None and not a.calls:  # an answer with nothing at all still has its (empty) message
                self._message(a)
            if a.message_index is not None:
                index = a.message_index
                if a.samples:
                    tail = self._out_rs.flush()
                    if not ev.cancelled:
                        self._audio(a, tail)
                    self._send(self.proto.audio_done(a.response_id, a.item_id, index))
                self._send(self.proto.transcript_done(a.response_id, a.item_id, ev.spoken, index))
                self._send(self.proto.content_part_done(a.response_id, a.item_id, ev.spoken, index))
                item = self.proto.assistant_item(a.item_id, ev.spoken, status)
                self._send(self.proto.output_item_done(a.response_id, item, index))
                self._item_done(item)
            output = []
            for kind, key in a.outputs:
                if kind == "message":
                    output.append(self.proto.assistant_item(a.item_id, ev.spoken, status))
                else:
                    item_id, _, name, arguments, done = a.calls[key]
                    output.append(self.proto.function_call_item(item_id, key, name, arguments, "completed" if done else "incomplete"))
            if ev.error:
                self._send_error(P.ProtocolError("llm_backend_failed", ev.error, type="server_error"))
            self._send(self.proto.response_done(a.response_id, a.item_id, ev.spoken, cancelled=ev.cancelled,
                                                 reason=ev.reason or "client_cancelled", metadata=a.metadata,
                                                 usage=self._usage(), output=output, error=ev.error))
        if report is not None:
            d = report.to_dict()
            if self.metrics:
                self.metrics.turn(d)
            if a is not None:
                a.reported = d
            self._send_latency(a, d)
        if self._deferred_engines is not None and not self.loop.in_progress:  # (else at the next turn boundary)
            self._swap_engines(self._deferred_engines)
        trim(TRIM_INTERVAL_S)  # a turn's temporaries, freed, go back to the system (off the critical path: it is over)

    _LOOP_HANDLERS: dict = {
        UserSpeechStarted: _on_speech_started,
        UserSpeechStopped: _on_speech_stopped,
        TranscriptFinal: _on_transcript,
        ResponseStarted: _on_response_started,
        PhraseStarted: _on_phrase,
        FunctionCallDelta: _on_function_call,
        IdleTimeout: _on_idle_timeout,
        TurnEnded: _on_turn_ended,
    }

    def _send_latency(self, a: _Answer | None, report: dict) -> None:
        d = dict(report)
        if a is not None:
            d["response_id"], d["item_id"] = a.response_id, a.item_id
            if a.client is not None:
                v2v = report["latency_ms"].get("voice_to_voice_ms")
                d["client"] = dict(a.client, overhead_ms=None if v2v is None else round(a.client["voice_to_voice_ms"] - v2v, 1))
                if self.metrics and a.reported is report:
                    self.metrics.client_turn(a.client["voice_to_voice_ms"])
        if self.extensions:
            self._send(self.proto.turn_latency(d))

    # -- the sink the loop plays into --------------------------------------------------------------

    def play(self, t: float, pcm: np.ndarray) -> None:
        a = self._answer
        if a is None or pcm is self.loop.e.ack_pcm:  # only answers go on the wire (no acknowledgement sounds: a client
            return  # would take one for the answer's first audio)
        self._audio(a, self._out_rs(pcm))

    def _audio(self, a: _Answer, pcm: np.ndarray) -> None:
        """Send ``pcm`` in deltas of at most ``DELTA_MS`` (TTS hands over whole sentences)."""
        if not len(pcm):
            return
        index = self._message(a)
        if a.first_sample is None:
            a.first_sample = self._out_samples
        if a.playout.texts:  # (audio before the first phrase, an acknowledgement, holds no words)
            a.playout.play(self._out_samples, len(pcm))
        a.samples += len(pcm)
        self._out_samples += len(pcm)
        step = self.proto.config.output_rate * DELTA_MS // 1000
        for i in range(0, len(pcm), step):
            piece = pcm[i:i + step]
            if self.native:
                self.emit(piece.astype(P.PCM_DTYPE, copy=False).tobytes(), True)
            else:
                self.emit(self.proto.audio_delta(a.response_id, a.item_id, piece, index).to_json(), True)

    def clear_after(self, t: float) -> None:
        """Barge-in: audio already sent cannot be recalled; ``response.done`` (cancelled) tells the client to stop."""

    # -- output ------------------------------------------------------------------------------------

    def _send(self, event) -> None:
        self.emit(event.to_json(), False)

    def _send_error(self, err: P.ProtocolError) -> None:
        if self.metrics:
            self.metrics.error(err.code)
        log.info("%s: error %s: %s", self.name, err.code, err.message)
        self._send(self.proto.error(err))


def _ms(sample: int) -> int:
    """Input sample (ASR_RATE) -> ms since the session began, as the wire counts audio."""
    return sample * 1000 // ASR_RATE
