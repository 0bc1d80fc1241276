"""A response's work and its output: a part of ``VoiceLoop`` (``voice.loop``, a mixin).

``_start`` makes a response (``voice.response``) and its work, a generator that ``VoiceLoop.step`` advances one piece
at a time: the transcription (a speculative one hears the rest of its padding as the background heard so far), the
end-of-turn score at a pause (``voice.speculation``), then the reply: LLM pieces -> phrases (``PhraseChunker``) -> TTS
chunks, at most ``LoopConfig.max_sentences`` sentences.  A tool call goes to the adapter, not to the voice.

Its output is held while it is speculative and released when the endpoint adopts it (``_release``): the transcript
goes to the adapter (``TranscriptFinal``, ``ResponseStarted``), each phrase's audio to the ``Playout`` and the sink
(``PhraseStarted`` just before its first audio), the first of it marks the answer's audio in the turn's trace.

A late turn gives up what ``voice.mitigation`` plans for it (``_mitigate``); each piece of work carries its deadline
(``_due``).  On a simulated deployment the reply's simulated times are kept, and with ``LoopConfig.pace`` a piece is
not used before them.

Uses the loop's ``cfg``, ``e``, ``clock``, ``input``, ``audio_time``, ``playout``, ``sink``, ``mitigation``, ``turns``,
``_trace``, ``on_partial`` and ``_emit``, and its end-of-turn policy (``_semantic``, ``_judge_turn_end``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .errors import LLMBackendError
from .loop_events import FunctionCallDelta, PhraseStarted, ResponseStarted, TranscriptFinal
from .phrases import PhraseChunker, PhraseConfig
from .protocols import ASR_RATE, FunctionCallPiece
from .response import Kind, Phase, Response, has_words
from .turns import TurnEvent, TurnMachine

if TYPE_CHECKING:
    from .input_buffer import InputBuffer
    from .latency import TurnTrace
    from .loop import Engines, LoopConfig
    from .mitigation import Mitigation
    from .playout import Playout
    from .protocols import Clock, Sink

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
#: What the loop says when the user has been silent for the idle timeout (a set phrase: no LLM call, no prompt to fit)
IDLE_PROMPT = "Are you still there?"


class ReplyPump:
    # the loop's state this part works on (``VoiceLoop.__init__``)
    cfg: LoopConfig
    e: Engines
    clock: Clock
    input: InputBuffer
    playout: Playout
    sink: Sink
    mitigation: Mitigation
    turns: TurnMachine
    _trace: TurnTrace | None
    on_partial: Callable[[str], None] | None

    def _start_text(self, kind: Kind, text: str, speak: bool | None = None) -> Response:
        """A response to no audio of its own (a typed turn, the conversation going on, the idle prompt); ``speak``: this
        response's own choice of audio or text only (None: ``LoopConfig.speak``)."""
        end = self.input.end_sample
        r = Response(first_voiced=end, last_voiced=end, phase=Phase.ANSWERING, kind=kind, speak=self.cfg.speak if speak is None else speak)
        r.gen = self._respond(r, None, text=text)
        return r

    def _start(self, first: int, last: int, speculative: bool, kind: Kind = Kind.ANSWER) -> Response:
        pad = self.cfg.padding_ms * ASR_RATE // 1000
        r = Response(first_voiced=first, last_voiced=last, phase=Phase.SPECULATING if speculative else Phase.ANSWERING, kind=kind,
                     heard_until=min(self.input.end_sample, last + pad), speak=self.cfg.speak)
        audio = self.input.utterance(first, last, self.cfg.padding_ms)
        missing = last + pad - r.heard_until
        if speculative and missing > 0:
            # at a pause the rest of the padding is not heard yet: the background heard since the last voiced sample,
            # repeated, so that Whisper hears the same kind of ending at an early pause as at a later one (audio cut
            # right after the voice, or digital silence after room noise, changes its punctuation)
            quiet = audio[len(audio) - max(0, r.heard_until - last - 1):]
            fill = np.resize(quiet, missing) if len(quiet) else np.zeros(missing, dtype=audio.dtype)
            audio = np.concatenate([audio, fill.astype(audio.dtype)])
        r.gen = self._respond(r, audio)
        return r

    def _mitigate(self, r: Response, ahead: tuple[str, ...]) -> list[str]:
        """Forecast ``r``'s voice-to-voice with the stages ``ahead`` still to run, and take the steps of
        ``voice.mitigation.ORDER`` it calls for (a step once taken stays); returns the steps taken so far."""
        if self.cfg.mitigation is None or r.kind is Kind.PROMPT or r.answered:
            return r.steps
        self.mitigation.cfg = self.cfg.mitigation  # (the settings in force: ``configure`` may have changed them)
        elapsed_ms = (self.clock.now() - self.audio_time(r.last_voiced)) * 1000
        if not r.speak:  # text only: no TTS ahead, and no acknowledgement sound to play
            ahead = tuple(s for s in ahead if s != "tts")
        r.forecast_ms = self.mitigation.forecast_ms(elapsed_ms, ahead)
        ack = self.e.ack_pcm if r.speak else None
        ack_end_ms = None if ack is None else self.cfg.ack_after_ms + len(ack) * 1000 / self.e.tts.sample_rate
        for step in self.mitigation.plan(r.forecast_ms, self.cfg.budget_ms, ack_end_ms):
            if step not in r.steps:
                r.steps.append(step)
        c = r.chunker
        if "short_first_phrase" in r.steps and c is not None and "short_first_phrase" not in r.used and c.at_start():
            c.config = PhraseConfig(min_first_words=1, max_first_words=1, max_words=c.config.max_words)
            r.used.append("short_first_phrase")
        return r.steps

    def _due(self, r: Response, now: float) -> float:
        """When ``r``'s next piece of work is due, on ``time.monotonic()`` (the compute shared with other sessions is
        served earliest deadline first, ``decode.batching.deadline``): before its first audio, the budget after the
        user's last voiced sample; once speaking, the moment the audio handed out so far runs out (text only: the budget
        still, as no audio runs out)."""
        local = self.playout.cursor if r.answered and r.speak else self.audio_time(r.last_voiced) + self.cfg.budget_ms / 1000
        return time.monotonic() + (local - now)

    def _respond(self, r: Response, audio: np.ndarray | None, text: str | None = None):
        """``r``'s work, one piece per ``next``: its transcript (of ``audio``, else the ``text`` typed), the end-of-turn
        score at a pause, then the reply."""
        if not self._transcribe(r, audio, text):
            return
        if r.speculative and self.on_partial and r.transcript:
            self.on_partial(r.transcript)
        if r.released:
            self._confirmed(r)
        yield
        if not (has_words(r.transcript) or not r.user_turn) or r.kind is Kind.TRANSCRIBE:
            return
        if r.speculative and self._semantic():
            self._judge_turn_end(r)
            yield
        yield from self._reply(r)
        self._await_judgement(r)

    def _transcribe(self, r: Response, audio: np.ndarray | None, text: str | None) -> bool:
        """``r``'s transcript; False when the transcription came out degenerate (``r`` failed)."""
        clock = self.clock
        if text is None:
            r.stamp("asr_start", clock.now())
            short = "short_asr_window" in self._mitigate(r, ("asr", "first_phrase", "tts"))
            if short:
                r.used.append("short_asr_window")
            with clock.working():  # (``short`` only when asked for: a transcriber without it still works)
                tr = self.e.transcriber.transcribe(audio, speculative=r.speculative, **({"short": True} if short else {}))
            if tr.retry:  # degenerate at a pause: no answer from it; the endpoint transcribes afresh
                r.advance(Phase.FAILED)
                return False
            r.transcript = tr.text.strip()
        else:
            r.transcript = text.strip()
        r.stamp("transcript", clock.now())
        return True

    def _reply(self, r: Response):
        """The answer: LLM pieces -> phrases -> TTS chunks (the set phrase for the idle prompt), at most
        ``LoopConfig.max_sentences`` sentences; a tool call goes to the adapter; a failing backend ends it."""
        clock = self.clock
        chunker = r.chunker = PhraseChunker()
        self._mitigate(r, ("first_phrase", "tts"))
        llm = self.e.llm
        sentences = 0
        start = clock.now()
        stream = None
        try:
            if r.kind is Kind.PROMPT:
                stream = (p for p in (IDLE_PROMPT,))
            else:
                stream = llm.reply(r.transcript if r.user_turn else None)
            while sentences < self.cfg.max_sentences:
                if self.cfg.pace and llm.sim_elapsed_s() is not None:  # on a simulated deployment
                    piece = next(stream, None)  # off the clock: the deployment's time is what it costs
                    r.due_s = start + llm.sim_elapsed_s()  # (now including the piece's own passes)
                    while clock.now() < r.due_s:
                        yield  # step() passes this answer by until its simulated time has come
                    r.due_s = None
                else:
                    with clock.working():
                        piece = next(stream, None)
                if piece is None:
                    break
                if isinstance(piece, FunctionCallPiece):  # a tool call (a backend's): to the adapter, not to the voice
                    r.called = True
                    r.calls.append(piece)
                    if r.released:
                        self._flush_calls(r)
                    continue
                r.stamp("first_token", clock.now())
                self._sim_stamp(r, "first_token")
                chunker.feed(piece)
                for ph in chunker.drain():
                    yield from self._speak(r, ph.text)
                    sentences += bool(_SENTENCE_END.search(ph.text))
                yield
            if sentences < self.cfg.max_sentences:
                for ph in chunker.flush():
                    yield from self._speak(r, ph.text)
        except LLMBackendError as e:  # the backend is gone or failed: the turn ends with what was said
            r.error = str(e)
        finally:
            if stream is not None:
                stream.close()

    def _flush_calls(self, r: Response) -> None:
        for piece in r.calls:
            self._emit(FunctionCallDelta(piece))
        r.calls.clear()

    def _speak(self, r: Response, text: str):
        clock = self.clock
        index = len(r.phrases)
        r.phrases.append(text)
        r.stamp("first_phrase", clock.now())
        self._sim_stamp(r, "first_phrase")
        if not r.speak:  # text only: the phrase is handed out as it is (or held with the speculative answer), never synthesized
            if r.released:
                self._play(r, index, None)
            else:
                r.held.append((index, None))
            yield
            return
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

    def _sim_stamp(self, r: Response, name: str) -> None:
        if name not in r.sim:
            t = self.e.llm.sim_elapsed_s()
            if t is not None:
                r.sim[name] = t

    def _confirmed(self, r: Response) -> None:
        """``r`` is the answer and its transcript is known: tell the adapter."""
        if r.user_turn:
            self._emit(TranscriptFinal(text=r.transcript))
        if (has_words(r.transcript) or not r.user_turn) and r.kind is not Kind.TRANSCRIBE:
            self._emit(ResponseStarted(audio=r.speak))

    def _release(self, r: Response) -> None:
        """The endpoint confirmed ``r``: its held audio may play now."""
        if r.transcript is not None:
            self._confirmed(r)
        for index, pcm in r.held:
            self._play(r, index, pcm)
        r.held.clear()
        self._flush_calls(r)

    def _play(self, r: Response, index: int, pcm: np.ndarray | None) -> None:
        """Phrase ``index``'s audio ``pcm`` to the sink, the phrases up to it announced first; ``pcm`` None: a text-only
        answer's phrase, handed out now with no audio (its first one is the answer's ``answer_text`` stamp)."""
        if self._overlap_holds(r, index, pcm):  # speech over the answer is being judged: kept until then
            return
        first = not r.answered
        announced = []
        while r.announced <= index:
            announced.append((r.announced, r.phrases[r.announced]))
            if pcm is not None:
                self.playout.begin_phrase(r.phrases[r.announced])
            r.announced += 1
        if pcm is None:
            t = self.clock.now()
            for i, text in announced:
                self._emit(PhraseStarted(index=i, text=text, start_s=t))
            if first:
                self._trace.mark("answer_text", t)
                self.turns.fire(TurnEvent.ANSWER_AUDIO)  # (the answer is out: speech over it now is a barge-in)
            return
        t = self.playout.play(self.clock.now(), len(pcm) / self.e.tts.sample_rate)
        for i, text in announced:
            self._emit(PhraseStarted(index=i, text=text, start_s=t))
        self.sink.play(t, pcm)
        self._overlap_played(t, pcm)
        if first:
            self._trace.mark("answer_audio", t)
            self._trace.mark("first_audio", t)
            self.turns.fire(TurnEvent.ANSWER_AUDIO)
