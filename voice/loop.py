"""The voice loop: audio in, turns out, on one clock, cooperatively scheduled.

``VoiceLoop.feed(chunk)`` takes input audio (any rate), runs the endpointer and reacts
to its events; ``step()`` advances the current response by one small piece of work
(a transcription, one LLM token, one TTS chunk), so input keeps being read between
pieces and a barge-in is seen within one piece.  Drivers (``run_stream``, the mic
demo, the server) alternate ``feed`` and ``step`` against a ``RealClock`` or a
``VirtualClock``.

The budget is worked against, not just measured: at a ``Pause`` the loop transcribes
and starts answering speculatively (audio held back until the endpoint confirms the
turn, dropped if the user goes on), the phrase chunker releases a short first clause,
and an optional acknowledgement sound covers a late answer (reported as
``first_audio_ms``, never as the answer).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace

import numpy as np

from .audio import AudioChunk, Resampler, to_float
from .latency import TurnReport, TurnTrace
from .phrases import PhraseChunker
from .protocols import ASR_RATE, Synthesizer, Transcriber
from .turns import TurnEvent, TurnMachine, TurnState
from .vad import Endpointer, EndpointerConfig, Pause, SpeechResumed, SpeechStarted, SpeechStopped
from .vad import State as VadState

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
_KEEP_AUDIO_S = 120  # input audio kept for transcription


@dataclass(frozen=True, slots=True)
class LoopConfig:
    budget_ms: float = 500.0
    speculative: bool = True  # transcribe and start answering at a pause
    ack: bool = False  # play a short acknowledgement when the answer is late
    ack_after_ms: float = 400.0  # ... if no answer audio this long after the last voiced sample
    max_sentences: int = 2  # spoken-style answers: stop after this many sentences
    padding_ms: int = 200  # audio kept around the utterance for the ASR
    #: The loop pauses earlier than the endpointer's own default (150 ms): speculative work that
    #: starts 30 ms sooner is 30 ms of budget; a false pause costs one discarded transcription.
    endpointer: EndpointerConfig = field(default_factory=lambda: EndpointerConfig(pause_ms=120))
    turn_detection: bool = True  # False: turns end only by ``commit_input()`` (the VAD still runs, for bounds)
    barge_in: bool = True  # speech over the answer interrupts it (False: speech while speaking is ignored)


@dataclass
class Engines:
    transcriber: Transcriber
    llm: object  # voice.llm.LLMConversation (TokenStream + commit)
    tts: Synthesizer
    ack_pcm: np.ndarray | None = None  # the acknowledgement sound at tts.sample_rate


@dataclass
class _Response:
    """One answer in progress (speculative until the endpoint adopts it)."""

    first_voiced: int
    last_voiced: int
    speculative: bool
    stamps: dict = field(default_factory=dict)
    transcript: str = ""
    transcribed: bool = False
    announced: int = 0  # phrases announced through on_event("phrase")
    phrases: list[str] = field(default_factory=list)
    spans: list[tuple[int, float, float]] = field(default_factory=list)  # (phrase index, start s, end s)
    held: list[tuple[int, np.ndarray]] = field(default_factory=list)
    released: bool = False
    answered: bool = False
    finished: bool = False
    gen: Iterator | None = None

    def stamp(self, name: str, t: float) -> None:
        self.stamps.setdefault(name, t)


class VoiceLoop:
    def __init__(self, engines: Engines, sink, clock, config: LoopConfig | None = None,
                 on_report: Callable[[TurnReport], None] | None = None,
                 on_partial: Callable[[str], None] | None = None,
                 on_event: Callable[[str, dict], None] | None = None):
        self.e = engines
        self.sink = sink
        self.clock = clock
        self.cfg = config or LoopConfig()
        self.on_report = on_report
        self.on_partial = on_partial  # speculative transcripts, while the user may still go on
        #: Adapters (the server) follow a turn through ``on_event(kind, info)``: "speech_started"
        #: {sample}, "speech_stopped" {first_voiced, last_voiced, sample}, "transcript" {text} (final, for the
        #: confirmed answer), "response_started" {}, "phrase" {index, text} (just before its first
        #: audio), "turn_end" {transcript, spoken, cancelled, reason, report}.  Samples are input
        #: samples at ASR_RATE since the session began.
        self.on_event = on_event
        self.vad = Endpointer(self.cfg.endpointer)
        self._vad_offset = 0  # input sample at which the current endpointer started
        self._ignoring = False  # an utterance over the answer, with barge-in off
        if self.cfg.endpointer.rate != ASR_RATE:
            raise ValueError(f"the loop runs its endpointer at {ASR_RATE} Hz")
        self.turns = TurnMachine()
        self.reports: list[TurnReport] = []
        self.barge_ins: list[dict] = []
        self._resamplers: dict[int, Resampler] = {}
        self._audio = np.zeros(ASR_RATE * 8, np.int16)  # input at ASR_RATE from sample self._base on, grown by doubling
        self._base = 0
        self._pos = 0  # samples at ASR_RATE fed so far
        self._origin: float | None = None  # clock time of input sample 0
        self._lag = 0  # samples the current input resampler still owes
        self._trace: TurnTrace | None = None
        self._task: _Response | None = None
        self._spec: _Response | None = None
        self._play_cursor = 0.0  # when the output is free again
        self._ack_played = False
        self._n_turns = 0
        self.file_offsets: list[float] = []  # filled by drivers that play files
        self.non_speech = 0  # "utterances" whose transcript had no words
        self._prepare = False  # idle work pending: prefill the next turn's context
        self._commit_base = 0  # manual turns: input from here on is the next utterance

    def _emit(self, kind: str, **info) -> None:
        if self.on_event is not None:
            self.on_event(kind, info)

    # -- time ---------------------------------------------------------------------------------

    def audio_time(self, sample: int) -> float:
        """Clock time at which input sample ``sample`` (at ASR_RATE) was captured; a resampler's
        filter delay is added back."""
        return (self._origin or 0.0) + (sample + self._lag) / ASR_RATE

    @property
    def input_time(self) -> float:
        """Clock time of the end of the input fed so far."""
        return (self._origin or 0.0) + (self._pos + self._lag) / ASR_RATE

    @property
    def answering(self) -> bool:
        """An answer is being computed or played (its turn is not over)."""
        return self._task is not None

    def set_engines(self, engines: Engines) -> None:
        """Swap the engines between turns (e.g. a new persona); the next turn's context is prefilled when idle."""
        if self._task is not None or self._spec is not None:
            raise RuntimeError("set_engines() while an answer is in progress")
        self.e = engines
        self._prepare = True

    def buffered_s(self) -> float:
        """Seconds of input the unanswered utterance holds so far (what a server's buffer limit caps)."""
        if not self.cfg.turn_detection:
            return (self._pos - self._commit_base) / ASR_RATE
        if self._trace is None or self._task is not None or self.vad.state is VadState.SILENCE:
            return 0.0
        start = self._trace.stamps.get("speech_start")
        return 0.0 if start is None else max(0.0, self.input_time - start)

    @property
    def speaking(self) -> bool:
        return self.turns.state is not TurnState.LISTENING

    # -- input --------------------------------------------------------------------------------

    def feed(self, chunk: AudioChunk) -> None:
        """Input audio; any rate, any length."""
        if self._origin is None:
            self._origin = self.clock.now() - len(chunk.pcm) / chunk.rate if self.clock.realtime else 0.0
        rs = self._resamplers.get(chunk.rate)
        if rs is None:
            rs = self._resamplers[chunk.rate] = Resampler(chunk.rate, ASR_RATE)
        pcm = rs(chunk.pcm)
        self._lag = rs.lag
        self._store(pcm)
        if self.clock.realtime and self.audio_time(self._pos) > self.clock.now():
            # Input that arrives faster than real time (a client sending a file at once) cannot have
            # been captured in the future: anchor its end at its arrival.
            self._origin -= self.audio_time(self._pos) - self.clock.now()
        self.vad.feed(pcm)
        for ev in self.vad.events():
            if self._vad_offset:
                ev = replace(ev, **{f.name: getattr(ev, f.name) + self._vad_offset for f in fields(ev)
                                    if f.name in ("sample", "first_voiced_sample", "last_voiced_sample", "start_pad", "end_pad")})
            self._on_vad(ev)
        self._housekeeping()

    # -- control (the server's client events) --------------------------------------------------

    def configure(self, config: LoopConfig) -> None:
        """New settings; a new endpointer config restarts the VAD (an utterance in progress is dropped)."""
        if config.endpointer != self.cfg.endpointer:
            if config.endpointer.rate != ASR_RATE:
                raise ValueError(f"the loop runs its endpointer at {ASR_RATE} Hz")
            self._restart_vad(config.endpointer)
        self.cfg = config

    def _restart_vad(self, ecfg: EndpointerConfig | None = None) -> None:
        self.vad = Endpointer(ecfg or self.cfg.endpointer)
        self._vad_offset = self._pos
        self._ignoring = False
        self._drop_spec()
        if self._task is None:
            self._trace = None

    def clear_input(self) -> None:
        """Forget the input not yet answered (``input_audio_buffer.clear``)."""
        self._restart_vad()
        self._commit_base = self._pos

    def commit_input(self) -> bool:
        """End the user's turn now (manual turn detection): the input since the last commit is the
        utterance.  False when there is nothing to commit or an answer is still in progress."""
        if self._task is not None or self._pos <= self._commit_base:
            return False
        first, last = self._commit_base, self._pos - 1
        self._commit_base = self._pos
        self._drop_spec()
        self._restart_vad()
        now = self.clock.now()
        self._new_trace()
        self._trace.mark("speech_start", self.audio_time(first), overwrite=True)
        self._trace.mark("last_voiced", self.audio_time(last), overwrite=True)
        self._trace.mark("endpoint", max(now, self.audio_time(last)), overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STOPPED)
        self._emit("speech_stopped", first_voiced=first, last_voiced=last, sample=self._pos)
        self._task = self._start(first, last, speculative=False)
        return True

    def respond_text(self, text: str) -> bool:
        """Answer a typed user message (``conversation.item.create`` + ``response.create``); the
        turn has no voice stages.  False while another answer is in progress."""
        if self._task is not None:
            return False
        self._drop_spec()
        self._new_trace()
        self._trace.mark("endpoint", self.clock.now(), overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STOPPED)
        r = _Response(first_voiced=self._pos, last_voiced=self._pos, speculative=False, released=True)
        r.gen = self._respond(r, None, text=text)
        self._task = r
        return True

    def cancel(self, reason: str = "client_cancelled") -> bool:
        """Stop the answer in progress (``response.cancel``), keeping what was heard."""
        if self._task is None or self._task.finished and not self.speaking:
            return False
        self._interrupt(self.clock.now(), reason)
        return True

    def amend_reply(self, spoken: str) -> None:
        """The client says less of the last answer was heard (``conversation.item.truncate``)."""
        amend = getattr(self.e.llm, "amend_last", None)
        if amend is not None:
            amend(spoken)
            self._prepare = True

    def _new_trace(self) -> None:
        self._n_turns += 1
        self._trace = TurnTrace(turn=self._n_turns, budget_ms=self.cfg.budget_ms)
        self._ack_played = False

    def _store(self, pcm: np.ndarray) -> None:
        """Append input audio; keep the last ``_KEEP_AUDIO_S`` seconds once no turn needs more."""
        used = self._pos - self._base
        if used + len(pcm) > len(self._audio):
            keep = _KEEP_AUDIO_S * ASR_RATE
            if used > 2 * keep and self._trace is None:
                self._audio[:keep] = self._audio[used - keep:used]
                self._base += used - keep
                used = keep
            if used + len(pcm) > len(self._audio):
                grown = np.zeros(max(2 * len(self._audio), used + len(pcm)), np.int16)
                grown[:used] = self._audio[:used]
                self._audio = grown
        self._audio[used:used + len(pcm)] = pcm
        self._pos += len(pcm)

    def _utterance(self, first: int, last: int) -> np.ndarray:
        pad = self.cfg.padding_ms * ASR_RATE // 1000
        a = max(self._base, first - pad) - self._base
        b = min(self._pos, last + pad) - self._base
        return to_float(self._audio[a:b])

    def _on_vad(self, ev) -> None:
        now = self.clock.now()
        if not self.cfg.turn_detection:
            return
        busy = self.turns.state is not TurnState.LISTENING or (self._task and not self._task.finished)
        if isinstance(ev, SpeechStarted) and busy and not self.cfg.barge_in:
            self._ignoring = True
        if self._ignoring:
            if isinstance(ev, SpeechStopped):
                self._ignoring = False
            return
        if isinstance(ev, SpeechStarted):
            self._emit("speech_started", sample=ev.first_voiced_sample, barge_in=bool(busy))  # before the answer is cut
            if busy:
                self._barge_in(ev, now)
            if self._trace is None:
                self._new_trace()
            self._trace.mark("speech_start", self.audio_time(ev.first_voiced_sample), overwrite=True)
            self.turns.fire(TurnEvent.SPEECH_STARTED)
        elif isinstance(ev, Pause):
            if self.cfg.speculative and self._trace is not None and self._task is None:
                self._spec = self._start(ev.first_voiced_sample, ev.last_voiced_sample, speculative=True)
        elif isinstance(ev, SpeechResumed):
            self._drop_spec()
        elif isinstance(ev, SpeechStopped):
            if self._trace is None:  # stopped without a start we saw (e.g. after a reset)
                return
            self._trace.mark("last_voiced", self.audio_time(ev.last_voiced_sample), overwrite=True)
            self._trace.mark("endpoint", max(now, self.audio_time(ev.sample)), overwrite=True)
            self.turns.fire(TurnEvent.SPEECH_STOPPED)
            self._emit("speech_stopped", first_voiced=ev.first_voiced_sample, last_voiced=ev.last_voiced_sample, sample=ev.sample)
            self._commit_base = self._pos
            spec = self._spec
            self._spec = None
            if spec is not None and spec.last_voiced == ev.last_voiced_sample:
                self._trace.mitigate("speculative")
                self._task = spec
                spec.speculative = False
                self._release(spec)
            else:
                if spec is not None:
                    self._close(spec)
                self._task = self._start(ev.first_voiced_sample, ev.last_voiced_sample, speculative=False)

    # -- responses ----------------------------------------------------------------------------

    def _start(self, first: int, last: int, speculative: bool) -> _Response:
        r = _Response(first_voiced=first, last_voiced=last, speculative=speculative, released=not speculative)
        r.gen = self._respond(r, self._utterance(first, last))
        return r

    def _drop_spec(self) -> None:
        if self._spec is not None:
            self._close(self._spec)
            self._spec = None

    @staticmethod
    def _close(r: _Response) -> None:
        if r.gen is not None:
            r.gen.close()
        r.finished = True

    def has_work(self) -> bool:
        return self._prepare_due() or any(r is not None and not r.finished for r in (self._task, self._spec))

    def _prepare_due(self) -> bool:
        return self._prepare and self.turns.state is TurnState.LISTENING and self.vad.state is VadState.SILENCE

    def step(self) -> bool:
        """Advance the current response (the confirmed one first) by one piece of work; when
        idle, prefill the context the next turn will start with."""
        for r in (self._task, self._spec):
            if r is not None and not r.finished:
                try:
                    next(r.gen)
                except StopIteration:
                    r.finished = True
                self._housekeeping()
                return True
        if self._prepare_due():
            self._prepare = False
            with self.clock.working():
                self.e.llm.prepare()
            return True
        self._housekeeping()
        return False

    def _respond(self, r: _Response, audio: np.ndarray | None, text: str | None = None):
        clock = self.clock
        if text is None:
            with clock.working():
                tr = self.e.transcriber.transcribe(audio)
            r.transcript = tr.text.strip()
        else:
            r.transcript = text.strip()
        r.transcribed = True
        r.stamp("transcript", clock.now())
        if r.speculative and self.on_partial and r.transcript:
            self.on_partial(r.transcript)
        if r.released:
            self._confirmed(r)
        yield
        if not _has_words(r.transcript):
            return
        chunker = PhraseChunker()
        stream = self.e.llm.reply(r.transcript)
        sentences = 0
        try:
            while sentences < self.cfg.max_sentences:
                with clock.working():
                    piece = next(stream, None)
                if piece is None:
                    break
                r.stamp("first_token", clock.now())
                chunker.feed(piece)
                for ph in chunker.drain():
                    yield from self._speak(r, ph.text)
                    sentences += bool(_SENTENCE_END.search(ph.text))
                yield
            if sentences < self.cfg.max_sentences:
                for ph in chunker.flush():
                    yield from self._speak(r, ph.text)
        finally:
            stream.close()

    def _speak(self, r: _Response, text: str):
        clock = self.clock
        index = len(r.phrases)
        r.phrases.append(text)
        r.stamp("first_phrase", clock.now())
        synth = self.e.tts.synthesize(text)
        try:
            while True:
                with clock.working():
                    pcm = next(synth, None)
                if pcm is None:
                    break
                r.stamp("tts_first_audio", clock.now())
                if r.released:
                    self._play(r, index, pcm)
                else:
                    r.held.append((index, pcm))
                yield
        finally:
            synth.close()

    def _confirmed(self, r: _Response) -> None:
        """``r`` is the answer and its transcript is known: tell the adapter."""
        self._emit("transcript", text=r.transcript)
        if _has_words(r.transcript):
            self._emit("response_started")

    def _release(self, r: _Response) -> None:
        """The endpoint confirmed ``r``: its held audio may play now."""
        r.released = True
        if r.transcribed:
            self._confirmed(r)
        for index, pcm in r.held:
            self._play(r, index, pcm)
        r.held.clear()

    def _play(self, r: _Response, index: int, pcm: np.ndarray) -> None:
        rate = self.e.tts.sample_rate
        t = max(self.clock.now(), self._play_cursor)
        while r.announced <= index:
            self._emit("phrase", index=r.announced, text=r.phrases[r.announced])
            r.announced += 1
        self.sink.play(t, pcm)
        self._play_cursor = t + len(pcm) / rate
        r.spans.append((index, t, self._play_cursor))
        if not r.answered:
            r.answered = True
            self._trace.mark("answer_audio", t)
            self._trace.mark("first_audio", t)
            self.turns.fire(TurnEvent.ANSWER_AUDIO)

    # -- turn end, barge-in, acknowledgement ---------------------------------------------------

    def _housekeeping(self) -> None:
        r, tr = self._task, self._trace
        if r is None or tr is None:
            return
        now = self.clock.now()
        if self.cfg.ack and not r.answered and not self._ack_played and self.e.ack_pcm is not None:
            lv = tr.stamps.get("last_voiced")
            if lv is not None and now >= lv + self.cfg.ack_after_ms / 1000:
                t = max(now, self._play_cursor)
                self.sink.play(t, self.e.ack_pcm)
                self._play_cursor = t + len(self.e.ack_pcm) / self.e.tts.sample_rate
                tr.mark("first_audio", t)
                tr.mitigate("ack")
                self._ack_played = True
        if r.finished and now >= self._play_cursor:
            if not r.answered:
                self.turns.fire(TurnEvent.NO_ANSWER)
            else:
                self.turns.fire(TurnEvent.ANSWER_DONE)
            self._finish_turn(r, spoken=" ".join(r.phrases), cut_at=None)

    def _finish_turn(self, r: _Response, spoken: str, cut_at: float | None, reason: str | None = None) -> None:
        tr = self._trace
        for k, v in r.stamps.items():
            tr.mark(k, v)
        tr.transcript = r.transcript
        tr.reply = spoken
        tr.mark("done", cut_at if cut_at is not None else max(self.clock.now(), self._play_cursor))
        self._task = None
        self._trace = None
        if not _has_words(r.transcript):  # a noise, a breath, a click: not a user turn
            self.non_speech += 1
            self._emit("turn_end", transcript=r.transcript, spoken="", cancelled=reason is not None, reason=reason, report=None)
            return
        self.e.llm.commit(r.transcript, spoken)
        self._prepare = True
        report = tr.report()
        if "last_voiced" in tr.stamps:  # typed turns have no voice-to-voice: kept out of the voice figures
            self.reports.append(report)
        self._emit("turn_end", transcript=r.transcript, spoken=spoken, cancelled=reason is not None, reason=reason, report=report)
        if self.on_report:
            self.on_report(report)

    def _barge_in(self, ev: SpeechStarted, now: float) -> None:
        """The user speaks over the answer: stop the audio, keep what was heard."""
        self.barge_ins.append({"speech_at": self.audio_time(ev.first_voiced_sample),
                               "detected_at": self.audio_time(ev.sample), "stopped_at": now})
        self._interrupt(now, "turn_detected")

    def _interrupt(self, now: float, reason: str) -> None:
        r = self._task
        self.sink.clear_after(now)
        self._play_cursor = min(self._play_cursor, now)
        heard = []
        if r is not None:
            for index, text in enumerate(r.phrases):
                spans = [(a, b) for i, a, b in r.spans if i == index]
                if not spans:
                    continue
                total = sum(b - a for a, b in spans)
                played = sum(max(0.0, min(b, now) - a) for a, b in spans)
                heard.append(_prefix_words(text, played / total if total > 0 else 0.0))
            self._close(r)
        self._drop_spec()
        if self._trace is not None and r is not None:
            self._trace.barge_in = reason == "turn_detected"
            if reason != "turn_detected":
                self._trace.mitigate("cancelled")
            self.turns.fire(TurnEvent.BARGE_IN)
            self._finish_turn(r, spoken=" ".join(h for h in heard if h), cut_at=now, reason=reason)
        elif self.turns.can(TurnEvent.BARGE_IN):
            self.turns.fire(TurnEvent.BARGE_IN)

    def finish(self, max_s: float = 30.0) -> None:
        """Input is over: complete the pending work and let the answer play out."""
        self.drain(max_s)
        if self._trace is not None and self._task is None:  # speech never stopped: close it
            self._trace = None

    def drain(self, max_s: float = 30.0, chunk_ms: int = 20) -> None:
        """Feed silence until the agent is done answering (or ``max_s`` of input passed)."""
        n = ASR_RATE * chunk_ms // 1000
        silence = np.zeros(n, np.int16)
        end = self.input_time + max_s
        while (self.has_work() or self.speaking or self._task is not None or self.vad.state is not VadState.SILENCE) \
                and self.input_time < end:
            feed_silence(self, silence, n)


def feed_silence(loop: VoiceLoop, silence: np.ndarray, n: int) -> None:
    t = loop.input_time + n / ASR_RATE
    while loop.clock.now() < t and loop.has_work():
        loop.step()
    loop.clock.advance_to(t)
    loop.feed(AudioChunk(silence, ASR_RATE, 0))


def run_stream(loop: VoiceLoop, chunks, drain: bool = True) -> None:
    """Drive ``loop`` with input chunks arriving at their audio time on ``loop.clock``:
    work fills the time between chunks; a chunk that arrives during work waits for it."""
    for chunk in chunks:
        t = loop.input_time + len(chunk.pcm) / chunk.rate
        while loop.clock.now() < t and loop.has_work():
            loop.step()
        loop.clock.advance_to(t)
        loop.feed(chunk)
    if drain:
        loop.drain()


def _has_words(text: str) -> bool:
    return bool(re.search(r"\w", text or ""))


def _prefix_words(text: str, fraction: float) -> str:
    if fraction >= 0.999:
        return text
    words = text.split()
    return " ".join(words[: int(len(words) * max(0.0, fraction))])
