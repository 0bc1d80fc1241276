"""Speech over the agent's answer, judged by evidence: a part of ``VoiceLoop`` (``voice.loop``, a mixin) and its policy.

People talk over a speaker without taking the turn: "uh-huh", "right", a cough, a door.  When the user's speech starts
while the answer plays (``TurnState.SPEAKING``), the loop does not stop the answer at once; it opens an ``Overlap``:

- the agent's voice pauses (``InterruptionConfig.mode = "pause"``: what was queued after now is taken back from the sink
  and kept) or goes on quieter (``"duck"``), so a real interruption is not talked over while it is judged;
- the overlapping audio is transcribed when the user goes quiet (the endpointer's ``Pause``), and while the user goes on,
  once ``min_speech_ms`` of it are there and then every ``check_ms``;
- ``judge`` decides: words that are not a backchannel (``min_words`` of them, one more while the user goes on) make it
  an interruption; only backchannel
  words, or no words at all (a cough, a knock), and the user quiet again: the answer resumes where it paused, and the
  history keeps all of it; sound that goes on past ``max_speech_ms`` (``max_backchannel_ms`` when its words are all
  backchannel) is an interruption whatever it says.  Decided within a bounded time: at the user's pause, or at the
  longest overlap.
- an interruption ends the answer as a barge-in (``UserSpeechStarted(barge_in=True)`` then ``TurnEnded`` with reason
  "turn_detected", what was heard up to the pause) and the overlapping speech is the user's next turn; a resumed answer
  records the overlap in its report (``TurnReport.overlaps``), and the backchannel is no turn.

``mode = "immediate"`` is the old rule (any speech start stops the answer).  An adapter whose output cannot be taken
back once sent (a Realtime client that buffers the audio itself) sets ``hold_output`` off: the judgement is the same,
the audio goes on at the client until it is decided, and only an interruption stops it (the adapter hears of the pause
through ``OutputPaused``/``OutputResumed`` and may duck or pause on its side).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from .loop_events import OutputPaused, OutputResumed, UserSpeechStarted
from .protocols import ASR_RATE
from .turns import TurnEvent, TurnState
from .vad import Pause, SpeechResumed, SpeechStarted, SpeechStopped, VadEvent

if TYPE_CHECKING:
    from .response import Response

#: A listener's words that do not take the turn (single words, or these pairs), in any case, with any punctuation.
BACKCHANNELS = frozenset({
    "uh-huh", "uh", "huh", "uhhuh", "mm-hmm", "mmhmm", "mhm", "mm", "hmm", "hm", "um", "ah", "oh", "aha", "ok", "okay",
    "yeah", "yep", "yup", "yes", "ya", "right", "sure", "alright", "cool", "nice", "wow", "gotcha", "i see", "got it",
    "all right", "uh huh", "mm hmm", "oh okay", "i know", "of course",
})
_PAIRS = frozenset(b for b in BACKCHANNELS if " " in b)
#: a hum or a vowel sound however Whisper spells it ("mm-m", "m-h-m", "mmhmm", "uh-uh", "uh-oh", "ah-ha"): no word
_SYLLABLE = r"(?:[mhn]+|uh|um|ah|oh|ooh|ha|huh|eh)"
_VOCAL = re.compile(rf"{_SYLLABLE}(?:-{_SYLLABLE})*")
#: Whisper's initial prompt for speech over the answer: a listener's words are the likely ones there (without it a hum is
#: heard as "in the", a "yeah" cut short as "here"; words of content still come through: "Stop.", "Hold on.", "What?")
LISTENER_PROMPT = "Uh-huh. Yeah. Okay. Right. Mm-hmm."
_NON_SPEECH = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")  # Whisper's "(coughing)", "[BLANK_AUDIO]", "*knock*"


class Mode(Enum):
    PAUSE = "pause"
    DUCK = "duck"
    IMMEDIATE = "immediate"


@dataclass(frozen=True, slots=True)
class InterruptionConfig:
    """How speech over the answer is judged (defaults as LiveKit Agents': 0.5 s of speech, or one word of content)."""

    mode: Mode = Mode.PAUSE
    min_words: int = 1  # words that are not a backchannel which make an interruption
    min_speech_ms: int = 500  # the overlap is first transcribed this long after its first voiced sample, if still going
    check_ms: int = 250  # ... and again this often while it goes on
    max_speech_ms: int = 1000  # sound this long with no words is an interruption (a long cough is not likely)
    max_backchannel_ms: int = 2000  # ... and with only backchannel words ("yeah yeah okay right ...")
    duck_gain: float = 0.3  # ``Mode.DUCK``: the voice's level while judged
    hold_output: bool = True  # the sink can take back what it was given (False: a client that buffers the audio)

    def __post_init__(self):
        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode(self.mode))
        if self.min_words < 1 or self.check_ms <= 0 or not 0 < self.min_speech_ms <= self.max_speech_ms <= self.max_backchannel_ms:
            raise ValueError("interruption: need min_words >= 1, check_ms > 0, 0 < min_speech_ms <= max_speech_ms <= "
                             f"max_backchannel_ms; got {self}")
        if not 0.0 <= self.duck_gain <= 1.0:
            raise ValueError(f"interruption: duck_gain must be within 0..1, got {self.duck_gain}")


def words(text: str) -> list[str]:
    """The spoken words of a transcript, lower case, bracketed non-speech dropped ("Uh-huh." -> ["uh-huh"])."""
    text = _NON_SPEECH.sub(" ", text or "").lower()
    return re.findall(r"[a-z0-9]+(?:['-][a-z0-9]+)*", text)


def content_words(text: str) -> list[str]:
    """The words of ``text`` that are not a backchannel (pairs such as "got it" count as one backchannel)."""
    ws, out, i = words(text), [], 0
    while i < len(ws):
        if i + 1 < len(ws) and f"{ws[i]} {ws[i + 1]}" in _PAIRS:
            i += 2
            continue
        if ws[i] not in BACKCHANNELS and not _VOCAL.fullmatch(ws[i]):
            out.append(ws[i])
        i += 1
    return out


class Verdict(Enum):
    WAIT = "wait"
    INTERRUPT = "interruption"
    BACKCHANNEL = "backchannel"
    NOISE = "noise"


def judge(text: str | None, speech_ms: float, quiet: bool, cfg: InterruptionConfig) -> Verdict:
    """The decision on an overlap from its transcript so far (None: not transcribed yet), how long it has sounded, and
    whether the user is quiet now."""
    # while the user goes on, the words heard so far are a part cut anywhere ("yeah" heard at 0.5 s as "here"): one
    # word more is asked of them than of a whole one
    if text is not None and len(content_words(text)) >= cfg.min_words + (not quiet):
        return Verdict.INTERRUPT
    said = bool(text is not None and words(text))
    if speech_ms >= (cfg.max_backchannel_ms if said else cfg.max_speech_ms):
        return Verdict.INTERRUPT
    if quiet and text is not None:
        return Verdict.BACKCHANNEL if said else Verdict.NOISE
    return Verdict.WAIT


@dataclass(slots=True)
class Overlap:
    """One stretch of user speech over the answer, from its first voiced sample, being judged."""

    first_voiced: int
    detected: int  # the sample at which the endpointer said speech
    paused_at: float  # clock time the voice paused (or ducked)
    held: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (phrase, pcm) taken back from the sink
    waiting: list[tuple[int, np.ndarray]] = field(default_factory=list)  # the answer's audio made while judged
    last_voiced: int | None = None  # at the user's pause
    quiet: bool = False  # the user paused (a ``Pause``, or stopped)
    stopped: SpeechStopped | None = None
    pause: Pause | None = None
    text: str | None = None  # the last transcript of the overlap
    next_check: int = 0  # input sample at which it is transcribed again while it goes on
    checked: int = -1  # the input end at the last transcription


class OverlapPolicy:
    """The loop's part that judges speech over the answer (see the module docstring).  Uses the loop's ``cfg``, ``e``,
    ``clock``, ``input``, ``playout``, ``sink``, ``turns``, ``_task``, ``_trace``, ``_emit``, ``audio_time``,
    ``_interrupt``, ``_barge_in_record``, ``_new_trace``, ``_speech_started``, ``_pause``, ``_speech_stopped`` and
    ``_play``."""

    _overlap: Overlap | None
    _judged: bool  # an overlap was judged not a turn; the endpointer's utterance it was in is not over yet
    _queued: list[tuple[int, float, np.ndarray]]  # (phrase, start, pcm) handed to the sink, maybe not played yet

    def _overlap_init(self) -> None:
        self._overlap = None
        self._judged = False
        self._queued = []
        self._overlaps: list[dict] = []  # this answer's overlaps that were not interruptions

    # -- the loop's hooks ----------------------------------------------------------------------------

    def _overlap_opens(self, ev: SpeechStarted | SpeechResumed, now: float) -> bool:
        """Speech starts over the answer: open an overlap (True), or leave it to the immediate barge-in (False)."""
        icfg = self.cfg.interruption
        if icfg.mode is Mode.IMMEDIATE or self.turns.state is not TurnState.SPEAKING or self._task is None or not self._task.speak:
            return False  # (before the answer sounds, or a text answer: the user went on, a turn of theirs)
        first = ev.first_voiced_sample if isinstance(ev, SpeechStarted) else ev.sample
        ov = self._overlap = Overlap(first_voiced=first, detected=ev.sample, paused_at=now,
                                     next_check=first + icfg.min_speech_ms * ASR_RATE // 1000)
        self._judged = False
        if icfg.hold_output:
            self._take_back(ov, now)
        self._emit(OutputPaused(first_voiced_sample=first, at_s=now, ducked=icfg.mode is Mode.DUCK))
        return True

    def _overlap_event(self, ev: VadEvent, now: float) -> bool:
        """An endpointer event while an overlap is judged (or after one judged not a turn): True when it was taken here."""
        ov = self._overlap
        if ov is None:
            if not self._judged:
                return False
            if isinstance(ev, SpeechResumed):  # the user goes on after what was no turn: speech starts afresh
                self._judged = False
                busy = self.turns.state is not TurnState.LISTENING or (self._task is not None and not self._task.finished)
                self._speech_started(SpeechStarted(sample=ev.sample, first_voiced_sample=ev.sample), now, busy)
            elif isinstance(ev, SpeechStopped):
                self._judged = False  # the backchannel's utterance is over: it was no turn
            return True
        match ev:
            case Pause():
                ov.quiet, ov.pause, ov.last_voiced = True, ev, ev.last_voiced_sample
            case SpeechResumed():
                ov.quiet, ov.pause = False, None
            case SpeechStopped():
                ov.quiet, ov.stopped, ov.last_voiced = True, ev, ev.last_voiced_sample
        return True

    def _overlap_step(self, now: float) -> bool:
        """The overlap's next piece of work, if due: transcribe it and act on the verdict.  True when work was done."""
        ov = self._overlap
        if ov is None:
            return False
        icfg = self.cfg.interruption
        end = self.input.end_sample
        speech_ms = ((ov.last_voiced if ov.quiet else end) - ov.first_voiced) * 1000 / ASR_RATE
        due = (ov.quiet and ov.checked < (ov.last_voiced or 0)) or (not ov.quiet and end >= ov.next_check)
        if due:
            last = ov.last_voiced if ov.quiet else end - 1
            audio = self.input.utterance(ov.first_voiced, last, self.cfg.padding_ms)
            with self.clock.working():
                ov.text = self.e.transcriber.transcribe(audio, speculative=not ov.quiet, prompt=LISTENER_PROMPT).text.strip()
            ov.checked = last if ov.quiet else end
            if not ov.quiet:
                ov.next_check = end + icfg.check_ms * ASR_RATE // 1000
        verdict = judge(ov.text, speech_ms, ov.quiet, icfg)
        if verdict is Verdict.WAIT:
            return due
        if verdict is Verdict.INTERRUPT:
            self._overlap_interrupts(ov, self.clock.now())
        else:
            self._overlap_resumes(ov, verdict, self.clock.now())
        return True

    def _overlap_wake(self) -> bool:
        """Work is due on the overlap (``has_work``)."""
        ov = self._overlap
        if ov is None:
            return False
        if ov.quiet:
            return True  # transcribed at once, or decided on what it said
        end = self.input.end_sample
        speech_ms = (end - ov.first_voiced) * 1000 / ASR_RATE
        return end >= ov.next_check or judge(ov.text, speech_ms, False, self.cfg.interruption) is not Verdict.WAIT

    def _overlap_holds(self, r: Response, index: int, pcm: np.ndarray | None) -> bool:
        """``_play`` asks: keep this piece of the answer's audio until the overlap is judged (True), or play it."""
        ov = self._overlap
        if ov is None or pcm is None or not self.cfg.interruption.hold_output:
            return False
        ov.waiting.append((index, pcm))
        return True

    def _overlap_played(self, t: float, pcm: np.ndarray) -> None:
        """``_play`` tells: ``pcm`` of the answer's current phrase went to the sink at ``t``."""
        if not self.cfg.interruption.hold_output:
            return
        rate = self.e.tts.sample_rate
        now = self.clock.now()
        self._queued = [q for q in self._queued if q[1] + len(q[2]) / rate > now]
        self._queued.append((len(self.playout.texts) - 1, t, pcm))

    def _overlap_reset(self) -> None:
        """The answer is over (played out, cancelled, the input cleared): nothing is judged any more."""
        self._overlap = None
        self._judged = False
        self._queued = []
        self._overlaps = []

    # -- pause, resume, interrupt ----------------------------------------------------------------

    def _take_back(self, ov: Overlap, now: float) -> None:
        """The sink drops what would play after ``now``; the rest of each piece is kept to play on resume (ducked:
        played on now at ``duck_gain``)."""
        rate = self.e.tts.sample_rate
        for phrase, start, pcm in self._queued:
            cut = max(0, int(round((now - start) * rate)))
            if cut < len(pcm):
                ov.held.append((phrase, pcm[cut:]))
        self._queued = []
        self.sink.clear_after(now)
        self.playout.cut(now)
        if self.cfg.interruption.mode is Mode.DUCK:
            gain = self.cfg.interruption.duck_gain
            t = now
            for _, pcm in ov.held:
                self.sink.play(t, (pcm.astype(np.float32) * gain).astype(np.int16))
                t += len(pcm) / rate

    def _overlap_resumes(self, ov: Overlap, verdict: Verdict, now: float) -> None:
        """Not a turn: the answer goes on from where it paused (ducked: from where the quiet voice has got to)."""
        self._overlap = None
        self._judged = True
        icfg = self.cfg.interruption
        self._overlaps.append({"kind": verdict.value, "text": ov.text or "",
                               "speech_start_s": round(self.audio_time(ov.first_voiced), 3),
                               "paused_ms": round((now - ov.paused_at) * 1000, 1)})
        if icfg.hold_output:
            rate = self.e.tts.sample_rate
            skip = int(round((now - ov.paused_at) * rate)) if icfg.mode is Mode.DUCK else 0
            if icfg.mode is Mode.DUCK:
                self.sink.clear_after(now)
            for phrase, pcm in ov.held:
                if skip >= len(pcm):
                    skip -= len(pcm)
                    self.playout.replay(phrase, ov.paused_at, len(pcm) / rate)  # (heard, quietly)
                    continue
                if skip:
                    self.playout.replay(phrase, ov.paused_at, skip / rate)
                    pcm, skip = pcm[skip:], 0
                t = self.playout.replay(phrase, now, len(pcm) / rate)
                self.sink.play(t, pcm)
                self._queued.append((phrase, t, pcm))
            r = self._task
            for index, pcm in ov.waiting:
                self._play(r, index, pcm)
        self._emit(OutputResumed(at_s=now, kind=verdict.value, text=ov.text or ""))

    def _overlap_cancels(self, reason: str) -> bool:
        """The answer is cancelled (``cancel``) while speech over it is judged: it ends as an interruption would, for
        ``reason``, and the speech is the user's next turn (True); False: no overlap."""
        if self._overlap is None:
            return False
        self._overlap_interrupts(self._overlap, self.clock.now(), reason)
        return True

    def _overlap_interrupts(self, ov: Overlap, now: float, reason: str = "turn_detected") -> None:
        """A real interruption: the answer ends as a barge-in, heard up to the pause; the overlap is the user's turn."""
        self._overlap = None
        icfg = self.cfg.interruption
        stopped = ov.paused_at if icfg.mode is Mode.PAUSE and icfg.hold_output else now  # (ducked or sent: it sounded on)
        self._emit(UserSpeechStarted(first_voiced_sample=ov.first_voiced, barge_in=reason == "turn_detected"))
        if reason == "turn_detected":
            self._barge_in_record(ov.first_voiced, ov.detected, stopped)
        self._interrupt(stopped, reason)
        self._new_trace(ov.first_voiced)
        self._trace.mark("speech_start", self.audio_time(ov.first_voiced), overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STARTED)
        if ov.stopped is not None:
            self._speech_stopped(ov.stopped, now)
        elif ov.pause is not None:
            self._pause(ov.pause, now)
