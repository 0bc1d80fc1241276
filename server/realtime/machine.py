"""The Realtime conversation and its responses, as a sans-I/O state machine.

``RealtimeConversation`` takes typed inputs: the client events the codec yields (``ProtocolSession.receive``), the
voice loop's events (``voice.loop_events``) and the output audio the loop plays (``audio(pcm)``); each call returns
what it caused, in order: ``ServerEvent``s, and ``AudioOut`` (a response's audio, which the adapter frames for its
transport and may drop for a client that does not read).  No threads, sockets or clocks: what it needs of the voice
loop and its engines it asks of a ``Voice`` (``server.realtime.loop_voice.LoopVoice`` on a running loop; a stand-in
in tests).

Owns: the conversation's items (the last ``MAX_ITEMS``, each with the id of the one before it, for retrieve, delete
and truncate), the user's typed text waiting for ``response.create``, and the responses: a ``Response`` holds its
output items in order (its assistant message, added on its first audio or phrase, with one content part: audio, or
text for a text-only response (``output_modalities: ["text"]``, the session's or the response's own); its tool
calls), its audio in output samples since the session began, and the words of it that were heard (``Playout``).

A response's life is ``ResponseState``; ``TRANSITIONS`` is the one table of the moves allowed, and a move it has no
entry for raises ``IllegalTransition`` (a bug, never the client's doing: the client's mistakes are error events).

Dispatch: ``HANDLERS`` maps each input type (every client event type, ``ProtocolError``, every loop event type) to
exactly one handler, read from the handlers' own annotations and checked when the module is imported: a type with no
handler or two, or a handler of another signature, is an import error.

Reentrancy: a ``Voice`` call may make the loop emit events at once (a cancel ends the turn), which the adapter feeds
back in (``on_loop_event``) from inside the outer call.  Outputs are queued as they arise and every call returns all
that are queued, so they leave in the order they arose, whichever call returns them.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import numpy as np

from voice import loop_events as L
from voice.latency import percentile, summarize
from voice.playout import Playout
from voice.protocols import ASR_RATE
from voice.turns import IllegalTransition

from . import events as E
from .codec import ProtocolSession

#: text items waiting for response.create, in characters (several times what the 2,048-token context holds)
MAX_TYPED_CHARS = 32_000
#: conversation items kept for conversation.item.retrieve / .delete / .truncate (the oldest are forgotten)
MAX_ITEMS = 64
#: responses kept for conversation.item.truncate and output_audio.played (the oldest are forgotten)
MAX_RESPONSES = 16


class Voice(Protocol):
    """What the machine asks of the voice loop and its engines (``LoopVoice``)."""

    @property
    def answering(self) -> bool: ...  # an answer is being computed or played

    @property
    def turn_detection(self) -> bool: ...  # the loop ends turns by itself (else: manual commits)

    @property
    def create_response(self) -> bool: ...  # a spoken turn is answered by itself (else: on response.create)

    @property
    def calls_tools(self) -> bool: ...  # the LLM calls the session's tools

    def update(self, ev: E.SessionUpdate) -> E.ProtocolError | None:
        """Apply a session.update to the engines, or refuse all of it (the returned error): the codec's config goes back."""

    def feed(self, ev: E.InputAudioAppend) -> list[E.ProtocolError]:
        """Take input audio (or drop it, saying why)."""

    def commit_input(self) -> bool: ...

    def clear_input(self) -> None: ...

    def add_function_output(self, call_id: str, output: str) -> None: ...

    def prompt_tokens(self, text: str, instructions: str | None) -> tuple[int, int]:
        """(tokens the answer to ``text`` needs with ``instructions`` and room for the reply, the context's size)."""

    def respond(self, text: str | None, instructions: str | None, tool_choice: str | dict | None, audio: bool) -> bool:
        """Answer ``text`` (None: go on after the tools' results), spoken or (``audio`` False) in text only; False while
        another answer is in progress."""

    def cancel(self, reason: str) -> bool: ...

    def amend_reply(self, heard: str) -> None: ...

    def flush_output(self) -> np.ndarray:
        """The end of the output audio the resampler still holds (at a response's end)."""

    def usage(self) -> dict | None: ...  # the last reply's token counts, as response.done's usage

    def since_voiced_ms(self, sample: int) -> float: ...  # now, less when input sample ``sample`` arrived

    def reports(self) -> list: ...  # the loop's turn reports so far


class ResponseState(Enum):
    REQUESTED = "requested"  # response.create taken by the loop; nothing on the wire yet (its metadata waits)
    IN_PROGRESS = "in_progress"  # response.created sent; its output streams
    COMPLETED = "completed"  # played out
    CANCELLED = "cancelled"  # response.cancel, a barge-in, a truncation
    FAILED = "failed"  # the LLM backend failed
    UNANSWERED = "unanswered"  # requested, and its turn ended with no answer (text without words): no response.done


_S = ResponseState
#: (a response's state, None for none, trigger) -> its next state
TRANSITIONS: dict[tuple[ResponseState | None, str], ResponseState] = {
    (None, "requested"): _S.REQUESTED,
    (None, "started"): _S.IN_PROGRESS,  # a spoken turn's answer, or the idle prompt
    (_S.REQUESTED, "started"): _S.IN_PROGRESS,
    (_S.REQUESTED, "ended"): _S.UNANSWERED,
    (_S.IN_PROGRESS, "completed"): _S.COMPLETED,
    (_S.IN_PROGRESS, "cancelled"): _S.CANCELLED,
    (_S.IN_PROGRESS, "failed"): _S.FAILED,
}
#: the states of the response in progress (the conversation has at most one)
LIVE = frozenset({_S.REQUESTED, _S.IN_PROGRESS})


@dataclass(eq=False)
class Call:
    """One tool call of a response: its function_call item."""

    item_id: str
    output_index: int
    name: str
    arguments: str = ""
    done: bool = False


@dataclass(eq=False)
class Response:
    """One response on the wire."""

    state: ResponseState | None = None
    metadata: dict | None = None  # response.create's, echoed in the response object
    id: str = ""  # once in progress
    item_id: str = ""  # its assistant message's item id
    last_voiced: int | None = None  # input sample (ASR_RATE) of the user's last voiced sample (a spoken turn's)
    first_sample: int | None = None  # output sample index of its first audio sample
    samples: int = 0
    playout: Playout = field(default_factory=Playout)  # its phrases' audio, in output samples
    client: dict | None = None  # voice-to-voice on the client's clock, once it told us
    reported: dict | None = None  # the turn.latency report sent
    message_index: int | None = None  # the assistant message's output index, once it was added
    outputs: list[tuple[str, str]] = field(default_factory=list)  # ("message", item id) or ("call", call id), in order
    calls: dict[str, Call] = field(default_factory=dict)  # by call id
    audio: bool = True  # spoken (an output_audio part); False: text only (output_text), as the loop said it starts

    @property
    def modalities(self) -> list[str]:
        return ["audio"] if self.audio else ["text"]


@dataclass(frozen=True, slots=True, eq=False)
class AudioOut:
    """Output audio of a response's message, at the session's output rate."""

    response_id: str
    item_id: str
    output_index: int
    pcm: np.ndarray


Output = E.ServerEvent | AudioOut


class RealtimeConversation:
    """One session's conversation: ``handle(client_event)``, ``on_loop_event(ev)``, ``audio(pcm)`` -> outputs."""

    def __init__(self, proto: ProtocolSession, voice: Voice, *, extensions: bool = False, metrics=None) -> None:
        self.proto = proto
        self.voice = voice
        #: send turn.latency (our extension): the client asked for it
        self.extensions = extensions
        self.metrics = metrics  # turn(report) and client_turn(ms), when given
        self.config = proto.config  # the configuration in force (a refused session.update goes back to it)
        self.current: Response | None = None  # the response requested or in progress
        self._responses: dict[str, Response] = {}  # by assistant item id (the last few)
        self._items: dict[str, tuple[str | None, dict]] = {}  # item id -> (previous item id, realtime.item), in order
        self._user_item: str | None = None  # the item the current speech becomes
        self._speech_start = 0  # input sample (ASR_RATE) where it started
        self._last_voiced: int | None = None
        self._typed: list[str] = []  # text items waiting for response.create
        self._tool_output = False  # a tool's result came (function_call_output): response.create goes on from it
        self._out_samples = 0  # output samples sent since the session began
        self.client_v2v: list[float] = []  # voice-to-voice on the client's clock, ms, per turn it reported
        self._out: list[Output] = []

    # -- entry points ----------------------------------------------------------------------------

    def handle(self, ev: E.ClientEvent | E.ProtocolError) -> list[Output]:
        HANDLERS[type(ev)](self, ev)
        return self._take()

    def on_loop_event(self, ev: L.LoopEvent) -> list[Output]:
        HANDLERS[type(ev)](self, ev)
        return self._take()

    def audio(self, pcm: np.ndarray) -> list[Output]:
        """The loop plays ``pcm`` (resampled to the output rate) for the response in progress."""
        if self.responding and self.current.audio:  # (a text-only response has none)
            self._audio(self.current, pcm)
        return self._take()

    @property
    def responding(self) -> bool:
        """A response is in progress (response.created was sent): audio played now is its."""
        return self.current is not None and self.current.state is _S.IN_PROGRESS

    def summary(self) -> dict:
        """The session's latency summary: the loop's turn reports, and voice-to-voice as clients measured it."""
        out = summarize(self.voice.reports())
        p50, p95 = percentile(self.client_v2v, 0.5), percentile(self.client_v2v, 0.95)
        out["client_voice_to_voice_ms"] = {"p50": None if p50 is None else round(p50, 1), "p95": None if p95 is None else round(p95, 1),
                                           "turns": len(self.client_v2v)}
        return out

    def close(self) -> None:
        self.current = None
        self._responses.clear()
        self._items.clear()

    def _emit(self, ev: Output) -> None:
        self._out.append(ev)

    def _error(self, err: E.ProtocolError) -> None:
        self._emit(self.proto.error(err))

    def _take(self) -> list[Output]:
        out, self._out = self._out, []
        return out

    def _move(self, trigger: str) -> Response:
        """The response in progress (a new one from none) moves on ``trigger``, by ``TRANSITIONS``."""
        r = self.current
        state = TRANSITIONS.get((None if r is None else r.state, trigger))
        if state is None:
            raise IllegalTransition(f"a response {'none' if r is None else r.state.value} cannot be {trigger}")
        r = r or Response()
        r.state = state
        self.current = r if state in LIVE else None
        return r

    # -- client events ---------------------------------------------------------------------------

    def _on_error(self, err: E.ProtocolError) -> None:
        self._error(err)

    def _on_update(self, ev: E.SessionUpdate) -> None:
        refused = self.voice.update(ev)
        if refused is not None:  # the whole update is refused: the codec's config goes back to the one in force
            self.proto.config = self.config
            self._error(refused)
            return
        cfg = ev.config
        if "tools" in ev.changed and cfg.tools and not self.voice.calls_tools:
            self._error(E.ProtocolError(
                "tools_not_supported", f"session.update: {len(cfg.tools)} tool(s) accepted but never called: the local "
                "model cannot call tools (an OpenAI-compatible backend, `wafervox serve --llm URL`, can); the rest of the "
                "update applies", ev.event_id, "session.tools"))
        self.config = cfg
        self._emit(self.proto.session_updated())

    def _on_append(self, ev: E.InputAudioAppend) -> None:
        for err in self.voice.feed(ev):
            self._error(err)

    def _on_commit(self, ev: E.InputAudioCommit) -> None:
        if not self.voice.commit_input():
            why = "an answer is in progress" if self.voice.answering else "the input buffer is empty"
            self._error(E.ProtocolError("input_audio_buffer_commit_empty", f"nothing to commit: {why}", ev.event_id))

    def _on_clear(self, ev: E.InputAudioClear) -> None:
        self.voice.clear_input()
        self._user_item = None
        self._emit(self.proto.cleared())

    def _on_item(self, ev: E.ItemCreate) -> None:
        waiting = sum(len(t) for t in self._typed) + len(ev.text)
        if waiting > MAX_TYPED_CHARS:  # more text than any prompt can hold: not kept
            self._error(E.ProtocolError("context_length_exceeded", f"{waiting} characters of text items are waiting for "
                                        f"response.create, over the {MAX_TYPED_CHARS} a prompt could hold; this item "
                                        "was dropped", ev.event_id, "item.content"))
            return
        self._typed.append(ev.text)
        self._add_item(self.proto.user_item(ev.item_id, text=ev.text), done=True)

    def _on_function_output(self, ev: E.FunctionOutputCreate) -> None:
        if not self.voice.calls_tools:
            self._error(E.ProtocolError("unsupported_item", "function_call_output: the local model calls no tools, so "
                                        "there is no call to answer", ev.event_id, "item.type"))
            return
        self.voice.add_function_output(ev.call_id, ev.output)
        self._tool_output = True
        self._add_item(self.proto.function_output_item(ev.item_id, ev.call_id, ev.output), done=True)

    def _on_response_create(self, ev: E.ResponseCreate) -> None:
        # this response's own instructions (None or blank: the session's), counted in the prompt
        instructions = ev.instructions if ev.instructions and ev.instructions.strip() else None
        if not self._typed and not self._tool_output:
            self._error(E.ProtocolError("no_user_input", "response.create needs a user text item first "
                                        "(spoken turns are answered by themselves)", ev.event_id))
            return
        text = " ".join(self._typed) if self._typed else None  # None: the answer goes on from the tools' results
        if text is not None:
            need, n_ctx = self.voice.prompt_tokens(text, instructions)
            if need > n_ctx:
                self._typed.clear()
                self._error(E.ProtocolError("context_length_exceeded", f"the user text ({len(text)} characters) with the "
                                            f"instructions and room for the answer takes {need} tokens, over the {n_ctx}-token "
                                            "context; the text items were dropped", ev.event_id, "item.content"))
                return
        audio = "audio" in (ev.output_modalities or self.config.output_modalities)  # (this response's, else the session's)
        if not self.voice.respond(text, instructions, ev.tool_choice, audio):
            self._error(E.ProtocolError("conversation_already_has_active_response",
                                        "a response is in progress; cancel it or wait for response.done", ev.event_id))
            return
        self._move("requested").metadata = None if ev.metadata is None else dict(ev.metadata)
        if text is not None:
            self._typed.clear()
        self._tool_output = False
        self._user_item = None

    def _on_cancel(self, ev: E.ResponseCancel) -> None:
        if ev.response_id and not (self.responding and self.current.id == ev.response_id):
            self._error(E.ProtocolError("response_not_found", f"no active response '{ev.response_id}'", ev.event_id, "response_id"))
        elif not self.voice.cancel("client_cancelled"):
            self._error(E.ProtocolError("response_cancel_not_active", "there is no response to cancel", ev.event_id))

    def _on_truncate(self, ev: E.ItemTruncate) -> None:
        r = self._responses.get(ev.item_id)
        if r is None or not r.audio:
            what = "no assistant audio item" if r is None else "only audio can be truncated: text-only assistant item"
            self._error(E.ProtocolError("item_not_found" if r is None else "invalid_value", f"{what} '{ev.item_id}'", ev.event_id,
                                        "item_id"))
            return
        rate = self.proto.config.output_rate
        if ev.audio_end_ms * rate // 1000 > r.samples:
            self._error(E.ProtocolError("invalid_value", f"audio_end_ms {ev.audio_end_ms} is past the item's "
                                        f"{r.samples * 1000 // rate} ms of audio", ev.event_id, "audio_end_ms"))
            return
        if r is self.current:
            self.voice.cancel("client_cancelled")  # the API's reason for a response the client ended
        heard = r.playout.heard((r.first_sample or 0) + ev.audio_end_ms * rate // 1000)
        if r is next(reversed(self._responses.values()), None):  # the last answer: the LLM's context hears the change
            self.voice.amend_reply(heard)
        kept = self._items.get(ev.item_id)
        if kept is not None:
            self._items[ev.item_id] = (kept[0], self.proto.assistant_item(ev.item_id, heard, "incomplete"))
        self._emit(self.proto.truncated(ev.item_id, ev.audio_end_ms, ev.content_index))

    def _on_retrieve(self, ev: E.ItemRetrieve) -> None:
        kept = self._items.get(ev.item_id)
        if kept is None:
            self._error(E.ProtocolError("item_not_found", f"no item '{ev.item_id}' in the conversation (the last "
                                        f"{MAX_ITEMS} are kept)", ev.event_id, "item_id"))
            return
        self._emit(self.proto.item_retrieved(kept[1]))

    def _on_delete(self, ev: E.ItemDelete) -> None:
        if ev.item_id not in self._items:
            self._error(E.ProtocolError("item_not_found", f"no item '{ev.item_id}' in the conversation", ev.event_id, "item_id"))
            return
        if self.responding and ev.item_id == self.current.item_id:
            self._error(E.ProtocolError("conversation_already_has_active_response", f"item '{ev.item_id}' is the answer "
                                        "in progress; cancel the response first", ev.event_id, "item_id"))
            return
        del self._items[ev.item_id]
        self._responses.pop(ev.item_id, None)
        self._emit(self.proto.item_deleted(ev.item_id))

    def _on_played(self, ev: E.OutputAudioPlayed) -> None:
        if ev.item_id:
            r = self._responses.get(ev.item_id)
        else:  # the response whose audio holds the played sample
            r = next((x for x in reversed(self._responses.values())
                      if x.first_sample is not None and x.first_sample <= ev.sample < x.first_sample + x.samples), None)
        if r is None or r.client is not None or r.first_sample is None or r.last_voiced is None or ev.sample < r.first_sample:
            return
        rate_out = self.proto.config.output_rate
        ahead_ms = (ev.sample - r.first_sample) * 1000 / rate_out  # the first answer sample played this much earlier
        if ev.input_sample is not None:
            rate_in = self.proto.config.input_rate
            v2v = (ev.input_sample - r.last_voiced * rate_in / ASR_RATE) * 1000 / rate_in - ahead_ms
            clock = "client_audio"
        else:
            v2v = self.voice.since_voiced_ms(r.last_voiced) - ahead_ms
            clock = "server_receipt"
        r.client = {"voice_to_voice_ms": round(v2v, 1), "clock": clock}
        self.client_v2v.append(v2v)
        if r.reported is not None:  # the turn was reported already: send it again, completed
            self._latency(r, r.reported)

    def _on_latency_request(self, ev: E.SessionLatencyRequest) -> None:
        self._emit(self.proto.session_latency(self.summary()))

    # -- the loop's events -----------------------------------------------------------------------

    def _on_speech_started(self, ev: L.UserSpeechStarted) -> None:
        self._user_item = self.proto.new_item_id()
        self._speech_start = ev.first_voiced_sample
        self._emit(self.proto.speech_started(_ms(ev.first_voiced_sample), self._user_item))

    def _on_output_paused(self, ev: L.OutputPaused) -> None:
        """Speech over the answer is judged: nothing on the Realtime wire (``speech_started`` comes only for an
        interruption, so a client stops its audio only then); a client of our extensions hears of it."""
        if self.extensions:
            self._emit(self.proto.output_paused(_ms(ev.first_voiced_sample)))

    def _on_output_resumed(self, ev: L.OutputResumed) -> None:
        if self.extensions:
            self._emit(self.proto.output_resumed(ev.kind, ev.text))

    def _on_speech_stopped(self, ev: L.UserSpeechStopped) -> None:
        item = self._user_item or self.proto.new_item_id()
        if self.voice.turn_detection:
            self._emit(self.proto.speech_stopped(_ms(ev.last_voiced_sample), item))
        self._emit(self.proto.committed(item))
        self._add_item(self.proto.user_item(item, transcript=None))
        self._user_item = item
        self._last_voiced = ev.last_voiced_sample
        self._speech_start = ev.first_voiced_sample

    def _on_transcript(self, ev: L.TranscriptFinal) -> None:
        if self._user_item is not None:
            seconds = max(0, (self._last_voiced or 0) - self._speech_start) / ASR_RATE
            self._emit(self.proto.transcription_completed(self._user_item, ev.text, seconds))
            self._item_done(self.proto.user_item(self._user_item, transcript=ev.text))
            if not self.voice.create_response and ev.text.strip():  # answered when the client sends response.create
                self._typed.append(ev.text.strip())

    def _on_response_started(self, ev: L.ResponseStarted) -> None:
        r = self._move("started")
        r.audio = ev.audio
        created = self.proto.response_created(r.metadata, r.modalities)
        r.id, r.item_id = created.response_id, self.proto.new_item_id()
        r.last_voiced = self._last_voiced if self._user_item is not None else None  # (a spoken turn's)
        self._user_item = None
        self._responses[r.item_id] = r
        while len(self._responses) > MAX_RESPONSES:
            self._responses.pop(next(iter(self._responses)))
        self._emit(created)

    def _on_phrase(self, ev: L.PhraseStarted) -> None:
        if self.responding:
            r = self.current
            index = self._message(r)
            delta = ev.text if ev.index == 0 else " " + ev.text
            if not r.audio:  # text only: the phrase is the text
                self._emit(self.proto.text_delta(r.id, r.item_id, delta, index))
                return
            r.playout.begin_phrase(ev.text)  # the audio sent from now on is this phrase's
            self._emit(self.proto.transcript_delta(r.id, r.item_id, delta, index))

    def _on_idle_timeout(self, ev: L.IdleTimeout) -> None:
        """``idle_timeout_ms`` passed with no speech: the silent audio becomes an (empty) user item, then the prompt."""
        item = self.proto.new_item_id()
        self._emit(self.proto.timeout_triggered(_ms(ev.start_sample), _ms(ev.end_sample), item))
        self._emit(self.proto.committed(item))
        self._add_item(self.proto.user_item(item, transcript=""), done=True)

    def _on_function_call(self, ev: L.FunctionCallDelta) -> None:
        r, p = self.current, ev.piece
        if not self.responding:
            return
        call = r.calls.get(p.call_id)
        if call is None:
            call = r.calls[p.call_id] = Call(self.proto.new_item_id(), len(r.outputs), p.name)
            r.outputs.append(("call", p.call_id))
            item = self.proto.function_call_item(call.item_id, p.call_id, p.name, "", "in_progress")
            self._emit(self.proto.output_item_added(r.id, item, call.output_index))
            self._add_item(item)
        if p.delta:
            call.arguments += p.delta
            self._emit(self.proto.arguments_delta(r.id, call.item_id, call.output_index, p.call_id, p.delta))
        if p.done:
            call.arguments, call.done = p.arguments, True
            self._emit(self.proto.arguments_done(r.id, call.item_id, call.output_index, p.call_id, p.name, p.arguments))
            item = self.proto.function_call_item(call.item_id, p.call_id, p.name, p.arguments, "completed")
            self._emit(self.proto.output_item_done(r.id, item, call.output_index))
            self._item_done(item)

    def _on_turn_ended(self, ev: L.TurnEnded) -> None:
        r = self.current if self.responding else None
        if r is None:
            if self.current is not None:  # requested, and no answer came of it
                self._move("ended")
        else:
            self._end_response(r, ev)
        if ev.report is not None:
            d = ev.report.to_dict()
            if self.metrics:
                self.metrics.turn(d)
            if r is not None:
                r.reported = d
            self._latency(r, d)

    def _end_response(self, r: Response, ev: L.TurnEnded) -> None:
        """The response's message, its items and ``response.done``, as the turn ended."""
        self._move("failed" if ev.error else "cancelled" if ev.cancelled else "completed")
        status = "completed" if r.state is _S.COMPLETED else "incomplete"
        if r.message_index is None and not r.calls:  # a response with nothing at all still has its (empty) message
            self._message(r)
        if r.message_index is not None:
            index = r.message_index
            if r.samples:
                tail = self.voice.flush_output()
                if not ev.cancelled:
                    self._audio(r, tail)
                self._emit(self.proto.audio_done(r.id, r.item_id, index))
            done = self.proto.transcript_done if r.audio else self.proto.text_done
            self._emit(done(r.id, r.item_id, ev.spoken, index))
            self._emit(self.proto.content_part_done(r.id, r.item_id, ev.spoken, index, text=not r.audio))
            item = self.proto.assistant_item(r.item_id, ev.spoken, status, text=not r.audio)
            self._emit(self.proto.output_item_done(r.id, item, index))
            self._item_done(item)
        output = []
        for kind, key in r.outputs:
            if kind == "message":
                output.append(self.proto.assistant_item(r.item_id, ev.spoken, status, text=not r.audio))
            else:
                c = r.calls[key]
                output.append(self.proto.function_call_item(c.item_id, key, c.name, c.arguments, "completed" if c.done else "incomplete"))
        if ev.error:
            self._error(E.ProtocolError("llm_backend_failed", ev.error, type="server_error"))
        self._emit(self.proto.response_done(r.id, r.item_id, ev.spoken, cancelled=ev.cancelled, reason=ev.reason or "client_cancelled",
                                            metadata=r.metadata, usage=self.voice.usage(), output=output, error=ev.error,
                                            modalities=r.modalities))

    # -- items, audio, latency -------------------------------------------------------------------

    def _add_item(self, item: dict, done: bool = False) -> None:
        """``conversation.item.added`` for a new item (after the newest kept), and ``.done`` at once when ``done``."""
        previous = next(reversed(self._items), None)
        self._items[item["id"]] = (previous, item)
        while len(self._items) > MAX_ITEMS:
            self._items.pop(next(iter(self._items)))
        self._emit(self.proto.item_added(item, previous))
        if done:
            self._emit(self.proto.item_done(item, previous))

    def _item_done(self, item: dict) -> None:
        """``conversation.item.done`` for a kept item, now ``item``."""
        kept = self._items.get(item["id"])
        previous = kept[0] if kept is not None else next(reversed(self._items), None)
        if kept is not None:
            self._items[item["id"]] = (previous, item)
        self._emit(self.proto.item_done(item, previous))

    def _message(self, r: Response) -> int:
        """The response's assistant message item, added on its first audio or phrase (a response that only calls a
        tool has none), with its audio content part; returns its output index."""
        if r.message_index is None:
            r.message_index = len(r.outputs)
            r.outputs.append(("message", r.item_id))
            item = self.proto.assistant_item(r.item_id, None, "in_progress")
            self._emit(self.proto.output_item_added(r.id, item, r.message_index))
            self._add_item(item)
            self._emit(self.proto.content_part_added(r.id, r.item_id, r.message_index, text=not r.audio))
        return r.message_index

    def _audio(self, r: Response, pcm: np.ndarray) -> None:
        if not len(pcm):
            return
        index = self._message(r)
        if r.first_sample is None:
            r.first_sample = self._out_samples
        if r.playout.texts:  # (audio before the first phrase, an acknowledgement, holds no words)
            r.playout.play(self._out_samples, len(pcm))
        r.samples += len(pcm)
        self._out_samples += len(pcm)
        self._emit(AudioOut(r.id, r.item_id, index, pcm))

    def _latency(self, r: Response | None, report: dict) -> None:
        """``turn.latency`` (to a client that asked for our extensions), with the client's figure once it is known."""
        d = dict(report)
        if r is not None:
            d["response_id"], d["item_id"] = r.id, r.item_id
            if r.client is not None:
                v2v = report["latency_ms"].get("voice_to_voice_ms")
                d["client"] = dict(r.client, overhead_ms=None if v2v is None else round(r.client["voice_to_voice_ms"] - v2v, 1))
                if self.metrics and r.reported is report:
                    self.metrics.client_turn(r.client["voice_to_voice_ms"])
        if self.extensions:
            self._emit(self.proto.turn_latency(d))


def _ms(sample: int) -> int:
    """Input sample (ASR_RATE) -> ms since the session began, as the wire counts audio."""
    return sample * 1000 // ASR_RATE


#: every input the machine takes: each client event type, a message the codec refused, each loop event type
INPUTS: tuple[type, ...] = (*typing.get_args(E.ClientEvent), E.ProtocolError, *typing.get_args(L.LoopEvent))


def handler_table(cls: type, inputs: tuple[type, ...]) -> dict[type, Callable]:
    """The handlers of ``cls`` (its methods ``_on_*``) by the type their one parameter is annotated with.  Raises
    ``TypeError`` unless each of ``inputs`` has exactly one, each takes ``(self, ev: T) -> None``, and each T is one
    of ``inputs``."""
    table: dict[type, Callable] = {}
    for name, fn in vars(cls).items():
        if not name.startswith("_on_") or not inspect.isfunction(fn):
            continue
        params = list(inspect.signature(fn).parameters.values())
        hints = typing.get_type_hints(fn)
        if len(params) != 2 or params[1].kind is not params[1].POSITIONAL_OR_KEYWORD or hints.get("return", 0) is not type(None):
            raise TypeError(f"{cls.__name__}.{name} must be (self, ev: <input type>) -> None")
        kind = hints.get(params[1].name)
        if kind not in inputs:
            raise TypeError(f"{cls.__name__}.{name} handles {kind!r}, which is not an input")
        if kind in table:
            raise TypeError(f"{kind.__name__} has two handlers: {table[kind].__name__} and {name}")
        table[kind] = fn
    missing = [t.__name__ for t in inputs if t not in table]
    if missing:
        raise TypeError(f"{cls.__name__} has no handler for {missing}")
    return table


#: input type -> its one handler
HANDLERS: dict[type, Callable] = handler_table(RealtimeConversation, INPUTS)
