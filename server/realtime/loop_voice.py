"""``LoopVoice``: the ``Voice`` a session's ``RealtimeConversation`` asks (``server.realtime.machine``), on the session's
``VoiceLoop`` and the server's shared engines.

It is where client events touch the engines: ``session.update``'s instructions (checked against the context, then a
new persona's engines, swapped in at once or at the next turn boundary), turn detection, output rate and tools;
``response.create``'s prompt, instructions and tool choice; commits, clears, cancels and truncations; the input audio
(8 kHz input, G.711 or PCM, widened to 16 kHz by ``voice.g711.BandWidener`` for the endpointer and Whisper) and its
flow control (audio arriving faster than real time is dropped, an utterance over the limit cleared).  Unlike the rest
of the package it runs engines and reads the monotonic clock; the session thread owns it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from voice.audio import AudioChunk, Resampler
from voice.g711 import RATE as PHONE_RATE
from voice.g711 import BandWidener
from voice.llm import Persona
from voice.loop import VoiceLoop

from .config import SessionConfig
from .events import InputAudioAppend, ProtocolError, SessionUpdate

#: audio may run this far past ``max_input_s`` ahead of the clock before it is dropped, so that one over-long
#: utterance sent at once meets the utterance limit (cleared, its own error) first
AHEAD_GRACE_S = 1.0
#: tokens kept free for a user turn (its message, the facts and the chat markup) when instructions are checked
TURN_RESERVE_TOKENS = 256
#: instructions longer than this many characters a token of the room left are refused before they are read: no text
#: averages so many (English ~4), and reading them (the facts split and embedded) would cost seconds for nothing
CHARS_PER_TOKEN_BOUND = 8


class LoopVoice:
    """``start(loop)`` once the loop runs; ``close()`` frees the engines."""

    def __init__(self, shared, config: SessionConfig, max_input_s: float, *, monotonic: Callable[[], float] = time.monotonic):
        self.shared = shared
        self.config = config  # the configuration in force (its tools)
        self.max_input_s = max_input_s  # the longest utterance, and how far input may run ahead of the clock
        self.monotonic = monotonic
        self.loop: VoiceLoop | None = None
        self.deferred = None  # engines for new instructions, swapped in at the next turn boundary
        self._default_persona = shared.base.llm.persona
        self._out_rs: Resampler | None = None
        self._audio_origin: float | None = None  # monotonic time the input audio taken would have started at, in real time
        self._audio_s = 0.0  # input audio taken, in seconds
        self._ahead_reported = False  # an "arriving faster than real time" episode was reported
        self._widener: BandWidener | None = None  # 8 kHz input (G.711, a phone call) to 16 kHz, its upper band filled

    def start(self, loop: VoiceLoop) -> None:
        self.loop = loop
        loop.e.llm.prepare()  # the persona's KV prefix (copied from the shared one, so usually nothing to do)
        self._out_rs = Resampler(self.shared.sample_rate, self.config.output_rate)

    def close(self) -> None:
        """Free the KV caches and scratch now (the loop's, and deferred engines')."""
        loop, self.loop = self.loop, None
        if loop is not None:
            loop.close()
            for engines in (loop.e, self.deferred):
                if engines is not None:
                    engines.llm.close()
                    if engines.turn_end is not None:
                        engines.turn_end.generator.close()
        self.deferred = None

    def boundary(self) -> None:
        """At a turn boundary (no answer, not even a speculative one): deferred engines go in."""
        if self.deferred is not None and not self.loop.in_progress:
            self._swap(self.deferred)

    # -- what the machine asks -------------------------------------------------------------------

    @property
    def answering(self) -> bool:
        return self.loop.answering

    @property
    def turn_detection(self) -> bool:
        return bool(self.loop.cfg.turn_detection)

    @property
    def create_response(self) -> bool:
        return bool(self.loop.cfg.create_response)

    @property
    def calls_tools(self) -> bool:
        return self.loop.e.llm.calls_tools

    def update(self, ev: SessionUpdate) -> ProtocolError | None:
        cfg, loop = ev.config, self.loop
        if "instructions" in ev.changed:
            llm = loop.e.llm
            room = llm.n_ctx - llm.max_tokens
            if len(cfg.instructions) > CHARS_PER_TOKEN_BOUND * room:
                return ProtocolError(
                    "context_length_exceeded", f"session.update: the instructions are {len(cfg.instructions):,} characters, "
                    f"far over the {room} tokens the {llm.n_ctx}-token context leaves beside the answer; the session is "
                    "unchanged", ev.event_id, "session.instructions")
            persona = self._default_persona if cfg.instructions.strip() in ("", self._default_persona.system) \
                else Persona.from_instructions(cfg.instructions)
            need = llm.opening_tokens(persona) + TURN_RESERVE_TOKENS
            if need > room:
                return ProtocolError(
                    "context_length_exceeded", f"session.update: the instructions take {need - TURN_RESERVE_TOKENS} tokens and "
                    f"a turn needs {TURN_RESERVE_TOKENS} more, over the {room} the {llm.n_ctx}-token context leaves "
                    "beside the answer; the session is unchanged", ev.event_id, "session.instructions")
            if persona != llm.persona:
                engines = self.shared.with_persona(loop.e, persona)
                if not loop.in_progress:
                    self._swap(engines)
                else:  # at the turn boundary: never under an open (or speculative) answer
                    self.deferred = engines
        if "turn_detection" in ev.changed:
            td = cfg.turn_detection
            if td is None:
                lc = loop.cfg.manual()
            elif td.type == "semantic_vad":
                lc = loop.cfg.with_semantic_turn_detection(eagerness=td.eagerness, interrupt_response=td.interrupt_response,
                                                           create_response=td.create_response)
            else:
                lc = loop.cfg.with_turn_detection(threshold=td.threshold, silence_duration_ms=td.silence_duration_ms,
                                                  prefix_padding_ms=td.prefix_padding_ms, interrupt_response=td.interrupt_response,
                                                  create_response=td.create_response, idle_timeout_ms=td.idle_timeout_ms)
            loop.configure(lc)
        if "output_modalities" in ev.changed:  # ["text"]: the answers are text only, never synthesized
            loop.configure(replace(loop.cfg, speak="audio" in cfg.output_modalities))
        if "output_rate" in ev.changed:
            self._out_rs = Resampler(self.shared.sample_rate, cfg.output_rate)
        self.config = cfg
        self._set_tools(loop.e.llm)
        return None

    def feed(self, ev: InputAudioAppend) -> list[ProtocolError]:
        if not len(ev.samples):
            return []
        now = self.monotonic()
        if self._audio_origin is None or now - self._audio_origin > self._audio_s:
            self._audio_origin = now - self._audio_s  # behind the clock (a pause in sending) earns no credit for a burst
        ahead = self._audio_s + len(ev.samples) / ev.rate - (now - self._audio_origin)
        if ahead > self.max_input_s + AHEAD_GRACE_S:  # a client sending faster than real time, past the backlog we take
            if self._ahead_reported:
                return []
            self._ahead_reported = True
            return [ProtocolError("input_audio_buffer_overflow", f"audio is arriving faster than real time: {ahead:.1f} s ahead "
                                  f"of the clock, over the {self.max_input_s:g} s limit; audio is dropped until the clock "
                                  "catches up", ev.event_id)]
        if ahead <= self.max_input_s / 2:  # the episode is over once the clock has well caught up (not at its edge,
            self._ahead_reported = False  # where a client still sending too fast would get an error every other chunk)
        self._audio_s += len(ev.samples) / ev.rate
        samples, rate = ev.samples, ev.rate
        if rate == PHONE_RATE:  # the telephone band: to the endpointer's and Whisper's 16 kHz, the band above 4 kHz filled
            if self._widener is None:
                self._widener = BandWidener()
            samples, rate = self._widener(samples), 2 * rate
        self.loop.feed(AudioChunk(samples, rate, 0))
        if self.loop.buffered_s() > self.max_input_s:
            self.loop.clear_input()
            return [ProtocolError("input_audio_buffer_overflow", f"the utterance is longer than {self.max_input_s:g} s; "
                                  "the input buffer was cleared", ev.event_id)]
        return []

    def commit_input(self) -> bool:
        return self.loop.commit_input()

    def clear_input(self) -> None:
        self.loop.clear_input()

    def add_function_output(self, call_id: str, output: str) -> None:
        self.loop.e.llm.add_function_output(call_id, output)

    def prompt_tokens(self, text: str, instructions: str | None) -> tuple[int, int]:
        llm = self.loop.e.llm
        llm.instructions = instructions
        need = llm.prompt_tokens(text) + llm.max_tokens
        llm.instructions = None
        return need, llm.n_ctx

    def respond(self, text: str | None, instructions: str | None, tool_choice: str | dict | None, audio: bool) -> bool:
        llm = self.loop.e.llm
        llm.instructions = instructions  # (the next reply's only)
        if tool_choice is not None:
            self._set_tools(llm, tool_choice)
        if self.loop.respond_text(text, speak=audio):
            return True
        llm.instructions = None
        return False

    def cancel(self, reason: str) -> bool:
        return self.loop.cancel(reason)

    def amend_reply(self, heard: str) -> None:
        self.loop.amend_reply(heard)

    def flush_output(self) -> np.ndarray:
        return self._out_rs.flush()

    def usage(self) -> dict | None:
        usage = self.loop.e.llm.last_usage
        return None if usage is None else usage.to_realtime()

    def since_voiced_ms(self, sample: int) -> float:
        return (self.loop.clock.now() - self.loop.audio_time(sample)) * 1000

    def reports(self) -> list:
        return self.loop.reports if self.loop is not None else []

    # -- the session's output audio --------------------------------------------------------------

    def output(self, pcm: np.ndarray) -> np.ndarray | None:
        """The loop's ``pcm`` at the session's output rate; None for an acknowledgement sound (a client would take it
        for the answer's first audio)."""
        return None if pcm is self.loop.e.ack_pcm else self._out_rs(pcm)

    # -- engines ---------------------------------------------------------------------------------

    def _swap(self, engines) -> None:
        self.loop.set_engines(engines)
        self.deferred = None
        self._set_tools(engines.llm)

    def _set_tools(self, llm, choice=None) -> None:
        """The session's tools (and ``choice``, else its tool_choice) to an LLM that calls tools."""
        if llm.calls_tools:
            from voice.openai_llm import chat_tool, chat_tool_choice

            llm.tools = tuple(chat_tool(t) for t in self.config.tools)
            llm.tool_choice = chat_tool_choice(choice or self.config.tool_choice)
