"""The voice loop's turn policy without engines: speculation, barge-in and the acknowledgement, driven by hand-made
endpointer events (``loop.on_vad``) on a virtual clock, with stand-ins for the transcriber, the LLM and the voice.

The stand-ins are not engines (the real ones are tested in test_voice_e2e.py): each returns scripted output and
charges a fixed compute time to the clock, so every event, span and report figure below is exact.  Also here: the
``Playout`` and ``InputBuffer`` parts the loop delegates to, the ``run_until`` driver, and the collaborator protocols
against the real classes.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest

from voice.audio import AudioChunk, chunks
from voice.clock import RealClock, VirtualClock
from voice.errors import LLMBackendError
from voice.loop import IDLE_PROMPT, Engines, LoopConfig, VoiceLoop, run_stream, run_until
from voice.loop_events import (
    BargeIn,
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
from voice.overlap import InterruptionConfig
from voice.playout import Playout
from voice.protocols import ASR_RATE, FunctionCallPiece, Transcript
from voice.turns import TurnState
from voice.vad import EarlyPause, EarlyResume, Pause, SpeechResumed, SpeechStarted, SpeechStopped

# -- stand-ins ---------------------------------------------------------------------------------------------------------


class StandInClock(VirtualClock):
    """A virtual clock on which work costs exactly what the stand-ins ``spend``, never the wall time it took."""

    @contextmanager
    def working(self):
        yield

    def spend(self, s: float) -> None:
        self.advance_to(self.now() + s)


class ScriptedTranscriber:
    """Stand-in ASR: the next scripted text for each utterance, 50 ms each; keeps the length of every utterance."""

    def __init__(self, clock: StandInClock, texts: list[str], cost_s: float = 0.05):
        self.clock, self.texts, self.cost_s = clock, list(texts), cost_s
        self.heard: list[int] = []  # samples of each utterance transcribed
        self.short: list[bool] = []  # each transcription asked to be short (a late turn)
        self.prompts: list[str | None] = []  # each transcription's prompt (None: the transcriber's own)

    def transcribe(self, audio: np.ndarray, *, speculative: bool = False, short: bool = False,
                   prompt: str | None = None) -> Transcript:
        self.clock.spend(self.cost_s)
        self.heard.append(len(audio))
        self.short.append(short)
        self.prompts.append(prompt)
        text = self.texts.pop(0)
        retry = text is None  # scripted: a degenerate speculative transcription
        return Transcript(text=text or "", audio_s=len(audio) / ASR_RATE, compute_ms=self.cost_s * 1000, retry=retry)


class ScriptedConversation:
    """Stand-in LLM: the scripted reply to each user text, word by word; 40 ms to the first word, 10 ms each after."""

    def __init__(self, clock: StandInClock, replies: dict[str, str]):
        self.clock, self.replies = clock, replies
        self.opened: list[str] = []
        self.closed_early: list[str] = []  # streams closed before their last word
        self.commits: list[tuple[str, str]] = []
        self.amended: list[str] = []
        self.prepared = 0

    def reply(self, user_text: str):
        self.opened.append(user_text)
        words = self.replies[user_text].split()
        done = False
        try:
            for i, w in enumerate(words):
                self.clock.spend(0.04 if i == 0 else 0.01)
                yield (" " if i else "") + w
            done = True
        finally:
            if not done:
                self.closed_early.append(user_text)

    def commit(self, user_text: str, spoken: str) -> None:
        self.commits.append((user_text, spoken))

    def amend_last(self, spoken: str) -> None:
        self.amended.append(spoken)

    def prepare(self) -> int:
        self.prepared += 1
        return 0

    def sim_elapsed_s(self) -> float | None:
        return None  # not on a simulated deployment


class SimulatedConversation(ScriptedConversation):
    """Stand-in LLM on a simulated deployment: costs nothing on the clock here, and reports ``first_s`` of simulated time
    to its first word and ``each_s`` for every word after."""

    def __init__(self, clock: StandInClock, replies: dict[str, str], first_s: float, each_s: float):
        super().__init__(clock, replies)
        self.first_s, self.each_s, self.words = first_s, each_s, 0

    def reply(self, user_text: str):
        self.opened.append(user_text)
        self.words = 0
        for i, w in enumerate(self.replies[user_text].split()):
            self.words = i + 1
            yield (" " if i else "") + w

    def sim_elapsed_s(self) -> float | None:
        return 0.0 if not self.words else self.first_s + (self.words - 1) * self.each_s


class ToneSynthesizer:
    """Stand-in voice at 1 kHz: one chunk per phrase, 250 ms of tone per word, 20 ms to make."""

    sample_rate = 1000

    def __init__(self, clock: StandInClock):
        self.clock = clock
        self.spoken: list[str] = []  # the phrases it was asked for

    def synthesize(self, text: str):
        self.spoken.append(text)
        self.clock.spend(0.02)
        yield np.full(250 * len(text.split()), 1000, np.int16)


class RecordingSink:
    def __init__(self):
        self.calls: list[tuple] = []

    def play(self, t: float, pcm: np.ndarray) -> None:
        self.calls.append(("play", round(t, 6), len(pcm)))

    def clear_after(self, t: float) -> None:
        self.calls.append(("clear_after", round(t, 6)))


# -- the scene: one question, spoken from 0.5 s to 1.5 s -----------------------------------------------------------

QUESTION = "What time do you open?"
ANSWER = "Sure. We open at nine."  # phrases "Sure." (250 ms of audio) and "We open at nine." (1 s)
FIRST, LAST = 8000, 23999  # voiced samples
STARTED = SpeechStarted(sample=9600, first_voiced_sample=FIRST)  # decided at 0.6 s
PAUSED = Pause(sample=25920, first_voiced_sample=FIRST, last_voiced_sample=LAST, start_pad=4800, end_pad=25920)  # 1.62 s
STOPPED = SpeechStopped(sample=30400, first_voiced_sample=FIRST, last_voiced_sample=LAST, start_pad=4800, end_pad=27200)  # 1.9 s


class Scene:
    """``mitigate``: the loop degrades turns forecast late (``voice.mitigation``); off unless a test is about it, since
    the scene's 400 ms end-of-turn silence alone forecasts most of its turns late."""

    def __init__(self, config: LoopConfig | None = None, texts=(QUESTION,), replies=None, asr_cost_s: float = 0.05,
                 ack_pcm: np.ndarray | None = None, mitigate: bool = False):
        config = config or LoopConfig()
        if not mitigate:
            config = replace(config, mitigation=None)
        self.clock = StandInClock()
        self.asr = ScriptedTranscriber(self.clock, list(texts), asr_cost_s)
        self.llm = ScriptedConversation(self.clock, replies or {QUESTION: ANSWER})
        self.sink = RecordingSink()
        self.events: list[LoopEvent] = []
        self.partials: list[str] = []
        self.tts = ToneSynthesizer(self.clock)
        engines = Engines(transcriber=self.asr, llm=self.llm, tts=self.tts, ack_pcm=ack_pcm)
        self.loop = VoiceLoop(engines, self.sink, self.clock, config or LoopConfig(), on_event=self.events.append,
                              on_partial=self.partials.append)

    def silence_until(self, sample: int) -> None:
        """Input (silent: the real endpointer hears nothing) in 20 ms chunks up to ``sample``, through the real driver."""
        n = sample - self.loop.input.end_sample
        assert n >= 0
        run_stream(self.loop, chunks(np.zeros(n, np.int16), ASR_RATE, 20), drain=False)

    def at(self, sample: int, ev) -> None:
        self.silence_until(sample)
        self.loop.on_vad(ev)

    def settle(self) -> None:
        """Let the loop do the work it has now (an adopted answer's phrases after its first audio)."""
        for _ in range(1000):
            if not self.loop.step():
                return
        raise AssertionError("the loop kept working")

    def kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


def _approx(x):
    return pytest.approx(x, abs=1e-9)


# -- speculation -------------------------------------------------------------------------------------------------------


def test_speculation_holds_its_audio_until_the_endpoint_adopts_it():
    s = Scene()
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)  # a speculative answer starts ...
    s.silence_until(STOPPED.sample)
    # the utterance so far with 200 ms before it, filled out to 200 ms after it with what was heard since its voice
    assert s.asr.heard == [LAST + 3200 - (FIRST - 3200)]
    assert s.partials == [QUESTION] and s.llm.opened == [QUESTION]
    assert s.sink.calls == []  # ... and is ready, but held back
    assert s.kinds() == ["UserSpeechStarted"]
    assert s.tts.spoken == ["Sure."]  # it stopped at its first audio: the rest waits for the endpoint
    s.loop.on_vad(STOPPED)  # the same last voiced sample: adopted, its audio plays at once
    assert s.events[1:] == [
        UserSpeechStopped(first_voiced_sample=FIRST, last_voiced_sample=LAST, endpoint_sample=STOPPED.sample),
        TranscriptFinal(text=QUESTION),
        ResponseStarted(),
        PhraseStarted(index=0, text="Sure.", start_s=_approx(1.9)),
    ]
    assert s.sink.calls == [("play", 1.9, 250)]
    s.settle()  # ... and the rest of the answer is made once it is the turn's answer
    assert s.events[-1] == PhraseStarted(index=1, text="We open at nine.", start_s=_approx(2.15))
    s.loop.finish()
    assert s.sink.calls[:2] == [("play", 1.9, 250), ("play", 2.15, 1000)]
    end = s.events[-1]
    assert isinstance(end, TurnEnded) and len(s.events) == 7
    assert (end.transcript, end.spoken, end.reason, end.cancelled) == (QUESTION, ANSWER, None, False)
    r = end.report
    assert s.loop.reports == [r] and r.mitigations == ("speculative",) and not r.barge_in
    assert r.stamps == {"speech_start": _approx(0.5), "last_voiced": _approx(LAST / ASR_RATE), "endpoint": _approx(1.9),
                        "pause": _approx(1.62), "asr_start": _approx(1.62),
                        "transcript": _approx(1.67), "first_token": _approx(1.71), "first_phrase": _approx(1.72),
                        "tts_first_audio": _approx(1.74), "answer_audio": _approx(1.9), "first_audio": _approx(1.9),
                        "done": _approx(3.16)}  # played out at 3.15 s, seen at the next 20 ms of input
    lat = r.latency_ms
    assert lat["asr_ms"] == _approx(-230.0) and lat["hold_ms"] == _approx(160.0)
    assert lat["voice_to_voice_ms"] == _approx(400.0625) and r.within_budget
    assert s.llm.commits == [(QUESTION, ANSWER)] and s.llm.closed_early == []
    assert s.llm.prepared == 1  # the next turn's context, prefilled while idle
    assert s.loop.turns.state is TurnState.LISTENING


def test_resumed_speech_drops_the_speculation_and_a_later_pause_speculates_again():
    s = Scene(texts=("What time", QUESTION), replies={"What time": "Any time.", QUESTION: ANSWER})
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)
    s.silence_until(27200)  # 1.7 s: transcribed, the LLM's first word on its way
    s.loop.on_vad(SpeechResumed(sample=27200))
    assert s.llm.closed_early == ["What time"]
    last = 35199  # the voice goes on to 2.2 s
    s.at(38720, Pause(sample=38720, first_voiced_sample=FIRST, last_voiced_sample=last, start_pad=4800, end_pad=38720))
    s.at(43200, SpeechStopped(sample=43200, first_voiced_sample=FIRST, last_voiced_sample=last, start_pad=4800, end_pad=38400))
    s.loop.finish()
    assert s.partials == ["What time", QUESTION]
    assert s.asr.heard == [LAST + 3200 - 4800, last + 3200 - 4800]
    assert s.kinds() == ["UserSpeechStarted", "UserSpeechStopped", "TranscriptFinal", "ResponseStarted", "PhraseStarted",
                         "PhraseStarted", "TurnEnded"]
    assert s.events[2] == TranscriptFinal(text=QUESTION)
    assert [c[1] for c in s.sink.calls] == [_approx(2.7), _approx(2.95)]  # nothing of the dropped answer played
    (r,) = s.loop.reports
    assert r.transcript == QUESTION and r.reply == ANSWER and r.mitigations == ("speculative",)
    assert s.llm.commits == [(QUESTION, ANSWER)]


def test_a_stop_at_another_last_voiced_sample_answers_afresh():
    s = Scene(texts=("What time", QUESTION), replies={"What time": "Any time.", QUESTION: ANSWER})
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)
    later = replace_stop(last=26000)
    s.at(later.sample, later)
    s.loop.finish()
    assert s.asr.heard == [LAST + 3200 - 4800, 26000 + 3200 - 4800]  # the speculation, then the whole utterance padded
    (r,) = s.loop.reports
    assert r.transcript == QUESTION and r.mitigations == () and r.latency_ms["asr_ms"] == _approx(50.0)
    assert r.stamps["answer_audio"] > r.stamps["endpoint"]


def replace_stop(last: int) -> SpeechStopped:
    return SpeechStopped(sample=last + 6401, first_voiced_sample=FIRST, last_voiced_sample=last, start_pad=4800,
                         end_pad=last + 3201)


def early(last: int, sample: int) -> EarlyPause:
    return EarlyPause(sample=sample, first_voiced_sample=FIRST, last_voiced_sample=last, start_pad=4800, end_pad=sample)


def test_an_early_pause_starts_the_work_and_the_pause_keeps_it():
    s = Scene()
    s.at(STARTED.sample, STARTED)
    s.at(24960, early(LAST, 24960))  # 60 ms after the voice, before webrtcvad's hangover lets the pause through
    s.at(PAUSED.sample, PAUSED)  # the same last voiced sample: the work goes on, nothing is transcribed again
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    assert s.asr.heard == [LAST + 3200 - 4800] and s.llm.opened == [QUESTION]
    (r,) = s.loop.reports
    assert r.mitigations == ("speculative",) and r.reply == ANSWER
    assert r.stamps["pause"] == _approx(1.56) and r.stamps["asr_start"] == _approx(1.56)
    assert r.stamps["tts_first_audio"] == _approx(1.68)  # 60 ms sooner than from the pause (1.74)


def test_an_early_resume_parks_the_work_and_a_later_pause_drops_it():
    s = Scene(texts=("What", QUESTION), replies={"What": "Yes, any time.", QUESTION: ANSWER})
    s.at(STARTED.sample, STARTED)
    s.at(16960, early(16000, 16960))
    s.silence_until(18400)  # 1.15 s: transcribed, the answer's first word out
    s.loop.on_vad(EarlyResume(sample=18400))  # the voice (or the noise) again: the work waits
    s.silence_until(PAUSED.sample)
    assert s.llm.opened == ["What"] and s.llm.closed_early == []
    s.loop.on_vad(PAUSED)  # the pause is at a later voiced sample than the work heard: it starts afresh
    assert s.llm.closed_early == ["What"]  # closed mid-answer: it had waited since its first word
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    assert len(s.asr.heard) == 2
    (r,) = s.loop.reports
    assert r.transcript == QUESTION and r.reply == ANSWER and r.mitigations == ("speculative",)
    assert [c[1] for c in s.sink.calls] == [_approx(1.9), _approx(2.15)]  # nothing of the dropped answer played


def test_an_early_resume_then_the_pause_at_the_same_voice_goes_on_with_the_work():
    s = Scene()
    s.at(STARTED.sample, STARTED)
    s.at(24960, early(LAST, 24960))
    s.silence_until(25120)
    s.loop.on_vad(EarlyResume(sample=25120))  # a flicker of noise: parked ...
    s.at(PAUSED.sample, PAUSED)  # ... and the pause says the voice ended where the work heard it: it goes on
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    assert len(s.asr.heard) == 1 and s.llm.closed_early == []
    (r,) = s.loop.reports
    assert r.reply == ANSWER and r.mitigations == ("speculative",) and r.stamps["asr_start"] == _approx(1.56)


def test_a_pause_past_what_the_early_work_heard_starts_afresh():
    s = Scene(texts=("What time", QUESTION), replies={"What time": "Any time.", QUESTION: ANSWER})
    s.at(STARTED.sample, STARTED)
    s.at(20960, early(20000, 20960))  # heard up to 1.31 s; the voice in fact went on to 1.5 s
    s.at(PAUSED.sample, PAUSED)
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    assert s.asr.heard == [20000 + 3200 - 4800, LAST + 3200 - 4800]
    (r,) = s.loop.reports
    assert r.transcript == QUESTION and r.mitigations == ("speculative",) and r.stamps["pause"] == _approx(1.62)


def test_a_degenerate_speculative_transcript_is_not_used_and_the_endpoint_transcribes_afresh():
    s = Scene(texts=(None, QUESTION))  # at the pause: degenerate, not retried there
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)
    s.silence_until(STOPPED.sample)
    assert s.partials == [] and s.llm.opened == []  # nothing was answered from it
    s.loop.on_vad(STOPPED)
    s.loop.finish()
    assert len(s.asr.heard) == 2
    (r,) = s.loop.reports
    assert r.transcript == QUESTION and r.reply == ANSWER and r.mitigations == ()
    assert r.latency_ms["asr_ms"] == _approx(50.0)  # transcribed after the endpoint


def test_without_speculation_a_pause_starts_nothing():
    s = Scene(LoopConfig(speculative=False))
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)
    s.silence_until(STOPPED.sample)
    assert s.asr.heard == [] and not s.loop.has_work()
    s.loop.on_vad(STOPPED)
    s.loop.finish()
    assert s.asr.heard == [LAST + 3200 - 4800]
    (r,) = s.loop.reports
    assert r.mitigations == () and r.stamps["transcript"] == _approx(1.95)


def test_each_piece_of_work_carries_its_deadline_for_the_shared_compute(monkeypatch):
    """Before the first audio a turn's work is due at the budget after the last voiced sample; once it speaks, when its
    audio runs out; the next turn's prefill, a second after it starts: behind any turn in its budget, never starved
    (``decode.batching``: shared compute is served earliest first)."""
    import math
    import time

    from decode.batching import current_deadline
    from voice.loop import PREPARE_SLACK_S

    s = Scene(LoopConfig(speculative=False))
    # time.monotonic follows the scene's stand-in clock for the test: the loop sets the deadlines on it, and the slack
    # the stand-ins see is then exact, however long this machine takes between the two
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0 + s.clock.now())
    seen: list[tuple[str, float, float]] = []  # (what, clock time, seconds from then to its deadline)

    def note(what):
        seen.append((what, s.clock.now(), current_deadline() - time.monotonic()))

    transcribe, prepare = s.asr.transcribe, s.llm.prepare
    synth = s.loop.e.tts.synthesize
    s.asr.transcribe = lambda audio, speculative=False, short=False: (note("asr"), transcribe(audio, speculative=speculative))[1]
    s.llm.prepare = lambda: (note("prepare"), prepare())[1]

    def synthesize(text):
        note(f"tts {text}")
        yield from synth(text)

    s.loop.e.tts.synthesize = synthesize
    s.at(STARTED.sample, STARTED)
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    due = LAST / ASR_RATE + 0.5  # the budget after the last voiced sample
    by = {what: (t, slack) for what, t, slack in seen}
    assert set(by) == {"asr", "tts Sure.", "tts We open at nine.", "prepare"}
    for what in ("asr", "tts Sure."):
        t, slack = by[what]
        assert slack == pytest.approx(due - t, abs=1e-6), what
    t, slack = by["tts We open at nine."]
    first_audio = s.sink.calls[0][1]
    assert slack == pytest.approx(first_audio + 0.25 - t, abs=1e-6)  # "Sure." plays for 250 ms
    assert by["prepare"][1] == pytest.approx(PREPARE_SLACK_S, abs=1e-6)  # after any turn in its budget
    assert current_deadline() == -math.inf  # nothing left in force on the driver's thread


# -- barge-in ----------------------------------------------------------------------------------------------------------


def _answering_scene(config: LoopConfig | None = None) -> Scene:
    """The answer plays from 1.9 s: "Sure." to 2.15 s, "We open at nine." to 3.15 s."""
    s = Scene(config, texts=(QUESTION, "Stop."), replies={QUESTION: ANSWER, "Stop.": "Okay."})
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)
    s.at(STOPPED.sample, STOPPED)
    s.settle()  # the adopted answer's second phrase made
    return s


def test_speech_over_the_answer_stops_it_at_once_in_immediate_mode_and_keeps_what_was_heard():
    s = _answering_scene(LoopConfig(interruption=InterruptionConfig(mode="immediate")))
    n = len(s.events)
    s.at(42400, SpeechStarted(sample=42400, first_voiced_sample=40000))  # 2.65 s: half of "We open at nine." played
    first, second = s.events[n:]
    assert first == UserSpeechStarted(first_voiced_sample=40000, barge_in=True)
    assert isinstance(second, TurnEnded)
    assert (second.spoken, second.reason, second.cancelled) == ("Sure. We open", "turn_detected", True)
    assert second.report.barge_in and second.report.reply == "Sure. We open"
    assert second.report.stamps["done"] == _approx(2.65)
    assert s.sink.calls[-1] == ("clear_after", 2.65)
    assert s.loop.barge_ins == [BargeIn(speech_s=2.5, detected_s=2.65, stopped_s=2.65)]
    assert s.llm.commits == [(QUESTION, "Sure. We open")]  # the history keeps only what was heard
    # the interruption is the next turn
    assert s.loop.answering is False and s.loop.turns.state is TurnState.LISTENING
    s.at(48000, SpeechStopped(sample=48000, first_voiced_sample=40000, last_voiced_sample=43199, start_pad=36800,
                              end_pad=46400))
    s.loop.finish()
    assert [r.transcript for r in s.loop.reports] == [QUESTION, "Stop."]
    assert s.loop.reports[1].stamps["speech_start"] == _approx(2.5) and not s.loop.reports[1].barge_in


def test_with_barge_in_off_speech_over_the_answer_is_ignored():
    s = _answering_scene(LoopConfig(barge_in=False))
    n = len(s.events)
    s.at(42400, SpeechStarted(sample=42400, first_voiced_sample=40000))
    s.at(48000, SpeechStopped(sample=48000, first_voiced_sample=40000, last_voiced_sample=43199, start_pad=36800,
                              end_pad=46400))
    assert s.kinds()[n:] == []  # 3.0 s: the answer plays on; the speech over it made no turn
    s.loop.finish()
    assert s.kinds()[n:] == ["TurnEnded"]
    end = s.events[-1]
    assert (end.spoken, end.reason) == (ANSWER, None) and end.report.stamps["done"] == _approx(3.16)
    assert len(s.loop.reports) == 1 and s.loop.barge_ins == [] and s.asr.heard == [LAST + 3200 - 4800]
    assert not any(c[0] == "clear_after" for c in s.sink.calls)


def test_cancel_keeps_what_was_heard_and_amend_reaches_the_conversation():
    s = _answering_scene()
    s.silence_until(40000)  # 2.5 s
    assert s.loop.cancel()
    end = s.events[-1]
    assert (end.spoken, end.reason) == ("Sure. We", "client_cancelled")  # 0.35 s of 1 s played: 1 of 4 words
    assert end.report.mitigations == ("speculative", "cancelled") and not end.report.barge_in
    assert not s.loop.cancel()  # nothing left to cancel
    s.loop.amend_reply("Sure.")
    assert s.llm.amended == ["Sure."]


# -- acknowledgement ---------------------------------------------------------------------------------------------------

ACK = np.full(100, 7, np.int16)  # 100 ms at the voice's 1 kHz


def test_a_late_answer_is_covered_by_the_acknowledgement_which_is_not_the_answer():
    s = Scene(LoopConfig(ack=True, ack_after_ms=500, speculative=False), asr_cost_s=0.3, ack_pcm=ACK)
    s.at(STARTED.sample, STARTED)
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    # the transcription ends at 2.2 s, past last voiced + 500 ms: the ack plays then, the answer after it
    assert s.sink.calls == [("play", 2.2, 100), ("play", 2.3, 250), ("play", 2.55, 1000)]
    assert s.kinds() == ["UserSpeechStarted", "UserSpeechStopped", "TranscriptFinal", "ResponseStarted", "PhraseStarted",
                         "PhraseStarted", "TurnEnded"]
    (r,) = s.loop.reports
    assert r.mitigations == ("ack",) and r.reply == ANSWER
    assert r.stamps["first_audio"] == _approx(2.2) and r.stamps["answer_audio"] == _approx(2.3)
    assert r.latency_ms["first_audio_ms"] == _approx(700.0625) and r.voice_to_voice_ms == _approx(800.0625)
    assert not r.within_budget  # the ack does not count as the answer


def test_no_acknowledgement_when_the_answer_comes_in_time():
    s = Scene(LoopConfig(ack=True, ack_after_ms=800, speculative=False), ack_pcm=ACK)
    s.at(STARTED.sample, STARTED)
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    assert s.sink.calls == [("play", 2.02, 250), ("play", 2.27, 1000)]  # answer audio 520 ms after the last voiced sample
    (r,) = s.loop.reports
    assert r.mitigations == () and r.stamps["first_audio"] == r.stamps["answer_audio"]


def test_a_turn_without_words_is_no_turn():
    s = Scene(texts=("  ",))
    s.at(STARTED.sample, STARTED)
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    assert s.kinds() == ["UserSpeechStarted", "UserSpeechStopped", "TranscriptFinal", "TurnEnded"]
    assert s.events[-1] == TurnEnded(transcript="", spoken="", reason=None, report=None)
    assert s.loop.reports == [] and s.loop.non_speech == 1 and s.llm.opened == [] and s.sink.calls == []


def test_every_event_is_a_loop_event():
    s = _answering_scene()
    s.loop.finish()
    assert s.events and all(isinstance(e, LoopEvent) for e in s.events)
    with pytest.raises(AttributeError):  # frozen
        s.events[0].barge_in = True


# -- Playout -----------------------------------------------------------------------------------------------------------


def test_playout_in_seconds_queues_after_the_cursor_and_cuts():
    p = Playout()
    p.begin_phrase("one two")
    assert p.play(1.0, 0.5) == 1.0
    assert p.schedule(1.2, 0.1) == 1.5  # (an acknowledgement: queued, no words)
    assert p.play(1.0, 0.5) == 1.6 and p.cursor == 2.1
    p.begin_phrase("three four five six")
    assert p.play(3.0, 1.0) == 3.0
    assert p.heard(0.9) == ""
    assert p.heard(1.3) == ""  # 0.3 of its 1.0 s of audio: int(2 * 0.3) = 0 words
    assert p.heard(1.8) == "one"  # 0.7 of it (the gap does not count)
    assert p.heard(2.1) == "one two"
    assert p.heard(3.5) == "one two three four"
    p.stop(3.5)
    assert p.cursor == 3.5
    assert p.heard(10.0) == "one two three four five six"  # what was queued is what it knows; the caller cuts at the stop
    p.next_answer()
    assert p.heard(10.0) == "" and p.cursor == 3.5
    with pytest.raises(ValueError):
        p.play(4.0, 1.0)


def test_playout_in_output_samples_as_the_server_counts():
    p = Playout()
    p.begin_phrase("Sure.")
    p.play(1000, 4800)  # output samples since the session began
    p.begin_phrase("We open at nine.")
    p.play(5800, 9600)
    p.play(15400, 9600)
    assert p.heard(5800) == "Sure."
    assert p.heard(5800 + 9600) == "Sure. We open"
    assert p.heard(5800 + 19000) == "Sure. We open at"
    assert p.heard(5800 + 19199) == "Sure. We open at nine."  # within 0.1 % of its end: whole
    assert p.heard(25000) == "Sure. We open at nine."


# -- run_until ---------------------------------------------------------------------------------------------------------


class CountingLoop:
    """Stand-in for a loop: ``work`` pieces of 30 ms each."""

    def __init__(self, work: int):
        self.clock = StandInClock()
        self.work = work
        self.steps = 0

    def has_work(self) -> bool:
        return self.work > 0

    def step(self) -> bool:
        self.steps += 1
        if self.work:
            self.work -= 1
            self.clock.spend(0.03)
            return True
        return False

    def wake_at(self) -> float | None:
        return None


def test_run_until_works_until_t_then_advances_the_clock():
    loop = CountingLoop(work=10)
    run_until(loop, 0.1)
    assert loop.steps == 4 and loop.clock.now() == _approx(0.12)  # the piece that crossed t is finished
    run_until(loop, 0.11)
    assert loop.steps == 4  # late already: input first
    loop.work = 1
    run_until(loop, 1.0)
    assert loop.steps == 5 and loop.clock.now() == 1.0  # no work left: the clock goes to t


def test_run_until_with_poll_reads_input_between_pieces_and_waits_in_it():
    loop = CountingLoop(work=2)
    calls = []
    run_until(loop, 0.5, poll=calls.append)
    assert calls == [0.0, 0.0, _approx(0.44)]  # after each piece, then the idle wait
    assert loop.steps == 3  # and one look at the time after the wait
    assert loop.clock.now() == _approx(0.06)  # a live driver's clock is not advanced


def test_the_real_clock_waits_in_run_until():
    loop = CountingLoop(work=0)
    loop.clock = RealClock()
    t = loop.clock.now() + 0.02
    run_until(loop, t)
    assert loop.clock.now() >= t


def test_chunking_does_not_change_the_turn():
    """The same scene fed in 20 ms chunks and in 7 ms chunks gives the same events (at 20 ms boundaries)."""
    results = []
    for chunk_ms in (20, 7):
        s = Scene()
        for sample, ev in ((STARTED.sample, STARTED), (PAUSED.sample, PAUSED), (STOPPED.sample, STOPPED)):
            n = sample - s.loop.input.end_sample
            run_stream(s.loop, chunks(np.zeros(n, np.int16), ASR_RATE, chunk_ms), drain=False)
            s.loop.on_vad(ev)
        s.loop.finish()
        results.append([type(e).__name__ for e in s.events] + [s.loop.reports[0].reply])
    assert results[0] == results[1]


def test_input_at_another_rate_is_timed_with_its_resampler_lag():
    s = Scene()
    s.loop.feed(AudioChunk(np.zeros(4410, np.int16), 44100, 0))
    lag = s.loop.input.lag_samples
    assert lag > 0 and s.loop.input.end_sample + lag == 1600
    assert s.loop.audio_time(0) == _approx(lag / ASR_RATE) and s.loop.input_time == _approx(0.1)


# -- the protocols, against the real classes (not instantiated) --------------------------------------------------------


@pytest.mark.parametrize("protocol_name, cls_path", [
    ("Conversation", "voice.llm:LLMConversation"),
    ("Clock", "voice.clock:RealClock"),
    ("Clock", "voice.clock:VirtualClock"),
    ("Sink", "voice.audio:BufferSink"),
    ("Sink", "voice.audio:TeeSink"),
    ("Sink", "voice.devices:Speaker"),
    ("Sink", "server.session:RealtimeSession"),
])
def test_the_real_collaborators_have_the_protocols_methods(protocol_name, cls_path):
    import importlib

    import voice.protocols as protocols

    proto = getattr(protocols, protocol_name)
    mod, name = cls_path.split(":")
    cls = getattr(importlib.import_module(mod), name)
    members = [m for m in dir(proto) if not m.startswith("_")] + [m for m in proto.__annotations__]
    for m in members:
        assert hasattr(cls, m) or m in getattr(cls, "__annotations__", {}), (cls_path, m)
        want = getattr(proto, m, None)
        if callable(want):
            got = inspect.signature(getattr(cls, m))
            assert list(got.parameters) == list(inspect.signature(want).parameters), (cls_path, m)


# -- the simulated deployment: its stamps, the report's block, pacing ------------------------------------------------------


def _simulated_scene(pace: bool) -> Scene:
    s = Scene(LoopConfig(pace=pace, speculative=False))
    s.llm = SimulatedConversation(s.clock, {QUESTION: ANSWER}, first_s=0.3, each_s=0.1)
    s.loop.e.llm = s.llm
    s.loop.e.project = lambda stamps, llm, budget_ms: {"llm": llm, "budget_ms": budget_ms, "endpoint": stamps["endpoint"]}
    s.at(STARTED.sample, STARTED)
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    return s


def test_the_llms_simulated_times_reach_the_report_through_project():
    s = _simulated_scene(pace=False)
    r = s.loop.reports[0]
    # the chunker hands "Sure." over when the next word arrives: the second word's simulated time
    assert r.simulated == {"llm": {"first_token": _approx(0.3), "first_phrase": _approx(0.4)}, "budget_ms": 500.0,
                           "endpoint": _approx(1.9)}
    assert r.stamps["first_token"] == _approx(r.stamps["transcript"])  # unpaced: no wait (the stand-in costs nothing here)
    assert r.to_dict()["simulated"] == r.simulated
    assert Scene().loop.e.project is None  # no deployment, no block


def test_pace_holds_each_piece_until_its_simulated_time():
    s = _simulated_scene(pace=True)
    r = s.loop.reports[0]
    t0 = r.stamps["transcript"]
    assert r.stamps["first_token"] == _approx(t0 + 0.3) and r.stamps["first_phrase"] == _approx(t0 + 0.4)
    assert r.stamps["answer_audio"] == _approx(t0 + 0.4 + 0.02)  # the tone stand-in's 20 ms
    assert s.sink.calls[0] == ("play", round(t0 + 0.42, 6), 250)
    assert r.reply == ANSWER


def test_a_paced_wait_is_idle_time_for_the_driver():
    """While a paced answer waits, the loop has no work (input goes on being read) and says when it will."""
    s = Scene(LoopConfig(pace=True, speculative=False))
    s.llm = SimulatedConversation(s.clock, {QUESTION: ANSWER}, first_s=0.3, each_s=0.1)
    s.loop.e.llm = s.llm
    s.at(STARTED.sample, STARTED)
    s.loop.on_vad(STOPPED)
    while s.loop.has_work():
        s.loop.step()
    due = s.loop.wake_at()
    assert due == _approx(s.clock.now() + 0.3) and s.sink.calls == []
    run_until(s.loop, due + 0.001)
    assert s.loop.wake_at() == _approx(due + 0.1)  # the next word's time


# -- tools, a failing backend and the idle timeout (the loop's side; the wire's is in tests/server) -------------------


class CallingConversation(ScriptedConversation):
    """Stand-in backend LLM: calls ``get_weather`` for the question (in two pieces), answers from the result after it
    (``reply(None)``), and fails mid-answer for "Fail?"."""

    def reply(self, user_text):
        self.opened.append(user_text)
        self.clock.spend(0.04)
        if user_text == "Fail?":
            yield "Well, the"
            raise LLMBackendError("the LLM backend at http://127.0.0.1:1/v1 stopped mid-answer: reset")
        if user_text is None:
            yield "It is sunny."
            return
        yield FunctionCallPiece("call_1", "get_weather", '{"city": ', '{"city": ', False)
        yield FunctionCallPiece("call_1", "get_weather", '"Paris"}', '{"city": "Paris"}', False)
        yield FunctionCallPiece("call_1", "get_weather", "", '{"city": "Paris"}', True)


def test_a_tool_call_reaches_the_adapter_once_released_and_the_answer_goes_on_after_its_result():
    s = Scene()
    s.llm = CallingConversation(s.clock, {})
    s.loop.e = replace(s.loop.e, llm=s.llm)
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)  # the speculative reply calls the tool: held back like audio
    s.silence_until(STOPPED.sample)
    assert not [e for e in s.events if isinstance(e, FunctionCallDelta)]
    s.loop.on_vad(STOPPED)
    s.loop.finish()
    calls = [e.piece for e in s.events if isinstance(e, FunctionCallDelta)]
    assert [p.delta for p in calls] == ['{"city": ', '"Paris"}', ""] and calls[-1].done
    assert s.kinds().index("ResponseStarted") < s.kinds().index("FunctionCallDelta")
    end = s.events[-1]
    assert isinstance(end, TurnEnded) and end.called and end.spoken == "" and end.reason is None
    assert s.loop.respond_text(None)  # the client sent the tool's result, then response.create
    s.loop.finish()
    end = s.events[-1]
    assert end.spoken == "It is sunny." and s.llm.opened == [QUESTION, None]
    assert s.llm.commits == [(QUESTION, ""), (None, "It is sunny.")]
    assert "TranscriptFinal" not in s.kinds()[s.kinds().index("TurnEnded"):]  # a continuation has no transcript


def test_a_backend_failing_mid_answer_ends_the_turn_with_its_error():
    s = Scene()
    s.loop.e = replace(s.loop.e, llm=CallingConversation(s.clock, {}))
    assert s.loop.respond_text("Fail?")
    s.loop.finish()
    end = s.events[-1]
    assert isinstance(end, TurnEnded) and end.reason == "failed" and not end.cancelled
    assert end.spoken == "Well," and "stopped mid-answer" in end.error
    assert s.loop.respond_text(None)  # the loop goes on
    s.loop.finish()
    assert s.events[-1].spoken == "It is sunny."


def test_idle_timeout_prompts_the_silent_user_once_per_answer():
    s = Scene(config=replace(LoopConfig(), idle_timeout_ms=5000))
    s.silence_until(ASR_RATE * 4)
    assert s.events == []
    s.silence_until(ASR_RATE * 6)
    idle = [e for e in s.events if isinstance(e, IdleTimeout)]
    assert len(idle) == 1 and idle[0].start_sample == 0 and abs(idle[0].end_sample - 5 * ASR_RATE) <= 320
    assert "ResponseStarted" in s.kinds() and s.llm.opened == []  # a set phrase, not the LLM's
    s.loop.finish()
    end = s.events[-1]
    assert end.spoken == IDLE_PROMPT and s.llm.commits == [(None, IDLE_PROMPT)]
    played_out = s.loop.playout.cursor
    s.silence_until(int((played_out + 4.5) * ASR_RATE))
    assert len([e for e in s.events if isinstance(e, IdleTimeout)]) == 1  # counts from the prompt's end
    s.silence_until(int((played_out + 5.2) * ASR_RATE))
    assert len([e for e in s.events if isinstance(e, IdleTimeout)]) == 2
    quiet = Scene()  # no idle timeout by default
    quiet.silence_until(ASR_RATE * 40)
    assert quiet.events == []


# -- a turn that cannot make its budget degrades in a fixed order (voice.mitigation) -------------------------------------

LONG_ANSWER = "We open at nine tomorrow."  # first phrase "We open" (two words at most), or "We" when it is cut short


def _late_scene(stop_after_ms: float, asr_cost_s: float = 0.05) -> Scene:
    """No speculation: the transcription starts at the stop, ``stop_after_ms`` after the last voiced sample."""
    s = Scene(LoopConfig(speculative=False), replies={QUESTION: LONG_ANSWER}, asr_cost_s=asr_cost_s, ack_pcm=ACK, mitigate=True)
    s.at(STARTED.sample, STARTED)
    last_s = (LAST + 1) / ASR_RATE
    stop = round((last_s + stop_after_ms / 1000) * ASR_RATE)
    s.at(stop, SpeechStopped(sample=stop, first_voiced_sample=FIRST, last_voiced_sample=LAST, start_pad=4800, end_pad=stop))
    s.loop.finish()
    return s


def _phrases(s: Scene) -> list[str]:
    return [e.text for e in s.events if isinstance(e, PhraseStarted)]


def test_a_turn_forecast_within_budget_gives_up_nothing():
    s = _late_scene(stop_after_ms=150)
    (r,) = s.loop.reports
    assert r.mitigations == () and _phrases(s) == ["We open", "at nine tomorrow."] and s.asr.short == [False]
    # forecast once the transcript is in: 150 ms waited + 50 of ASR + the default first phrase (60) and TTS (40)
    assert r.forecast_ms == pytest.approx(300, abs=1) and r.to_dict()["forecast_ms"] == pytest.approx(300, abs=1)


def test_a_little_late_turn_speaks_a_shorter_first_phrase_only():
    s = _late_scene(stop_after_ms=360)  # 360 + 80 + 60 + 40 = 540 forecast at the ASR: 40 over
    (r,) = s.loop.reports
    assert r.mitigations == ("short_first_phrase",) and s.asr.short == [False]
    assert _phrases(s) == ["We", "open at nine tomorrow."] and r.reply == LONG_ANSWER  # nothing of the answer lost
    assert s.sink.calls[0][0] == "play" and s.sink.calls[0][2] == 250  # one word of tone first, no acknowledgement


def test_a_late_turn_also_plays_the_acknowledgement_and_a_very_late_one_shortens_the_asr_window():
    s = _late_scene(stop_after_ms=450, asr_cost_s=0.2)  # 450 + 180 = 630 at the ASR: 130 over; then 650 + 100
    (r,) = s.loop.reports
    assert r.mitigations == ("short_first_phrase", "ack") and s.asr.short == [False]
    assert s.sink.calls[0] == ("play", pytest.approx(s.sink.calls[0][1]), len(ACK))  # "Hmm," first, then the answer
    assert r.stamps["first_audio"] < r.stamps["answer_audio"] and not r.within_budget
    s = _late_scene(stop_after_ms=600)  # 600 + 180 = 780 at the ASR: 280 over, every step
    (r,) = s.loop.reports
    assert r.mitigations == ("short_first_phrase", "ack", "short_asr_window") and s.asr.short == [True]
    assert r.forecast_ms > 500 and r.reply == LONG_ANSWER


def test_the_forecast_learns_what_the_stages_cost_on_this_machine():
    """The stages' costs are the last turns' (a slow transcriber makes the next turn's forecast late): the second of
    two identical turns, stopped 250 ms after the voice, is forecast with a 400 ms ASR and degrades before it runs."""
    s = Scene(LoopConfig(speculative=False), texts=(QUESTION, QUESTION), replies={QUESTION: LONG_ANSWER}, asr_cost_s=0.4,
              ack_pcm=ACK, mitigate=True)
    for offset in (0, 80000):  # the same question twice, 5 s apart
        started = replace(STARTED, sample=STARTED.sample + offset, first_voiced_sample=FIRST + offset)
        s.at(started.sample, started)
        stop = LAST + offset + round(0.25 * ASR_RATE)
        s.at(stop, SpeechStopped(sample=stop, first_voiced_sample=FIRST + offset, last_voiced_sample=LAST + offset,
                                 start_pad=4800, end_pad=stop))
        s.silence_until(stop + 3 * ASR_RATE)
    first, second = s.loop.reports
    assert s.loop.mitigation.cost_ms("asr") == pytest.approx(400)
    # at the ASR: 250 + 80 + 60 + 40 = 430 the first time; 250 + 400 + 40 + 20 = 710 the second (210 over: every step)
    assert s.asr.short == [False, True]
    assert "short_asr_window" not in first.mitigations and "short_asr_window" in second.mitigations


def test_mitigation_off_takes_no_step():
    s = Scene(LoopConfig(speculative=False, mitigation=None), replies={QUESTION: LONG_ANSWER}, ack_pcm=ACK, mitigate=True)
    s.at(STARTED.sample, STARTED)
    stop = LAST + ASR_RATE  # a second of silence
    s.at(stop, SpeechStopped(sample=stop, first_voiced_sample=FIRST, last_voiced_sample=LAST, start_pad=4800, end_pad=stop))
    s.loop.finish()
    (r,) = s.loop.reports
    assert r.mitigations == () and r.forecast_ms is None and _phrases(s)[0] == "We open" and s.asr.short == [False]


def test_the_steps_come_in_their_fixed_order_and_their_thresholds_must_too():
    from voice.mitigation import ORDER, Mitigation, MitigationConfig

    m = Mitigation()
    assert ORDER == ("short_first_phrase", "ack", "short_asr_window")
    assert [m.plan(f, 500) for f in (500, 501, 600, 601, 701)] == [(), ORDER[:1], ORDER[:1], ORDER[:2], ORDER]
    assert m.forecast_ms(100, ("asr", "first_phrase", "tts")) == 280  # the defaults before any turn
    # the acknowledgement (and what comes after it) only for an answer forecast after the ack would be over
    assert m.plan(750, 500, ack_end_ms=760) == ORDER[:1] and m.plan(761, 500, ack_end_ms=760) == ORDER
    with pytest.raises(ValueError, match="must grow"):
        MitigationConfig(ack_over_ms=300, short_asr_window_over_ms=200)


# -- text only (LoopConfig.speak off: a Realtime output_modalities ["text"]) ------------------------------------------


class CountingSynthesizer(ToneSynthesizer):
    """The stand-in voice, counting every synthesize() call."""

    def __init__(self, clock: StandInClock):
        super().__init__(clock)
        self.calls: list[str] = []

    def synthesize(self, text: str):
        self.calls.append(text)
        return super().synthesize(text)


def _counted(s: Scene) -> CountingSynthesizer:
    s.loop.e.tts = CountingSynthesizer(s.clock)
    return s.loop.e.tts


def test_a_text_only_turn_hands_its_phrases_out_unsynthesized_and_is_timed_to_its_first_text():
    """``speak`` off: the speculative answer's phrases are held, then handed out at the endpoint as ``PhraseStarted``
    with no audio; nothing is synthesized, no acknowledgement plays (though it is due), and the turn's answer is its first
    phrase handed out (``answer_text``, ``voice_to_text_ms``): voice-to-voice is not measured."""
    s = Scene(LoopConfig(speak=False, ack=True, ack_after_ms=100), ack_pcm=ACK)
    tts = _counted(s)
    s.at(STARTED.sample, STARTED)
    s.at(PAUSED.sample, PAUSED)
    s.silence_until(STOPPED.sample)
    assert s.kinds() == ["UserSpeechStarted"]  # ready, and held like audio
    s.loop.on_vad(STOPPED)
    assert s.events[1:] == [
        UserSpeechStopped(first_voiced_sample=FIRST, last_voiced_sample=LAST, endpoint_sample=STOPPED.sample),
        TranscriptFinal(text=QUESTION),
        ResponseStarted(audio=False),
        PhraseStarted(index=0, text="Sure.", start_s=_approx(1.9)),
    ]
    s.settle()  # the second phrase once the answer is adopted
    second = s.events[5]  # handed out as it is made, after the endpoint (the stand-in LLM's words cost time)
    assert (second.index, second.text) == (1, "We open at nine.") and second.start_s > 1.9
    s.loop.finish()
    end = s.events[-1]
    assert isinstance(end, TurnEnded) and (end.spoken, end.reason) == (ANSWER, None)
    assert tts.calls == [] and s.sink.calls == []  # no TTS work, no audio (not even the acknowledgement)
    r = end.report
    assert s.loop.reports == [r]
    assert {"tts_first_audio", "answer_audio", "first_audio"}.isdisjoint(r.stamps)
    assert r.stamps["first_phrase"] == _approx(1.72) and r.stamps["answer_text"] == _approx(1.9)
    lat = r.latency_ms
    assert lat["voice_to_voice_ms"] is None and lat["voice_to_text_ms"] == _approx(400.0625)
    assert r.answer_ms == lat["voice_to_text_ms"] and r.within_budget and r.to_dict()["latency_ms"]["voice_to_text_ms"] == 400.1
    assert s.llm.commits == [(QUESTION, ANSWER)] and s.loop.turns.state is TurnState.LISTENING


def test_a_spoken_turn_has_no_voice_to_text_figure():
    s = Scene()
    s.at(STARTED.sample, STARTED)
    s.at(STOPPED.sample, STOPPED)
    s.loop.finish()
    (r,) = s.loop.reports
    assert r.latency_ms["voice_to_text_ms"] is None and r.answer_ms == r.voice_to_voice_ms is not None


def test_a_response_may_be_text_only_in_a_spoken_loop_and_a_barge_in_keeps_what_was_handed_out():
    s = Scene(LoopConfig(speculative=False), replies={"Hours?": ANSWER, "Again?": ANSWER})
    tts = _counted(s)
    assert s.loop.respond_text("Hours?", speak=False)
    while not any(isinstance(e, PhraseStarted) for e in s.events):
        assert s.loop.step()
    assert s.events[-2:] == [ResponseStarted(audio=False), PhraseStarted(index=0, text="Sure.", start_s=_approx(s.clock.now()))]
    now = s.loop.input.end_sample
    s.loop.on_vad(SpeechStarted(sample=now, first_voiced_sample=now))  # the user speaks over the text still coming
    cut = [e for e in s.events if isinstance(e, TurnEnded)]
    assert [(e.spoken, e.reason) for e in cut] == [("Sure.", "turn_detected")] and s.llm.commits == [("Hours?", "Sure.")]
    s.loop.clear_input()
    assert tts.calls == [] and [c[0] for c in s.sink.calls] == ["clear_after"]  # nothing played
    assert s.loop.respond_text("Again?")  # the loop's own setting again: spoken
    s.loop.finish()
    assert ResponseStarted(audio=True) in s.events and tts.calls == ["Sure.", "We open at nine."] and s.sink.calls
