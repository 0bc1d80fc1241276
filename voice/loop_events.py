"""What the voice loop tells its adapter (``VoiceLoop(on_event=...)``): one frozen class per event, the ``LoopEvent``
union, and the loop's record of a barge-in.

In the order a spoken turn passes them: ``UserSpeechStarted``, ``UserSpeechStopped``, ``TranscriptFinal`` (of the answer
that is confirmed), ``ResponseStarted`` (the transcript has words), ``PhraseStarted`` for each phrase (just before its first
audio goes to the sink), ``TurnEnded``.  ``*_sample`` fields are input samples at ``ASR_RATE`` since the loop began;
``*_s`` fields are times on the loop's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from .latency import TurnReport
from .protocols import FunctionCallPiece


@dataclass(frozen=True, slots=True)
class UserSpeechStarted:
    """The user began to speak; ``barge_in``: over the agent's answer, which is stopped right after this event (speech
    over a playing answer is judged first, ``voice.overlap``: this comes when it was judged an interruption)."""

    first_voiced_sample: int
    barge_in: bool


@dataclass(frozen=True, slots=True)
class UserSpeechStopped:
    """The user's turn ended: voice from ``first_voiced_sample`` to ``last_voiced_sample`` (inclusive), decided when the
    input reached ``endpoint_sample`` (a manual commit: the end of the input committed)."""

    first_voiced_sample: int
    last_voiced_sample: int
    endpoint_sample: int


@dataclass(frozen=True, slots=True)
class TranscriptFinal:
    """The transcript of the turn being answered (also one without words, which gets no answer)."""

    text: str


@dataclass(frozen=True, slots=True)
class ResponseStarted:
    """An answer to the turn begins; ``audio``: it is spoken (False: text only, ``LoopConfig.speak``: its phrases come as
    ``PhraseStarted`` with no audio)."""

    audio: bool = True


@dataclass(frozen=True, slots=True)
class PhraseStarted:
    """Phrase ``index`` of the answer, just before its first audio (starting at ``start_s``) goes to the sink; of a text-only
    answer, as it is handed out (``start_s``: then)."""

    index: int
    text: str
    start_s: float


@dataclass(frozen=True, slots=True)
class FunctionCallDelta:
    """A piece of a tool call the answer makes (an OpenAI-compatible backend's), once the answer is confirmed; the
    call's last piece has ``piece.done`` set."""

    piece: FunctionCallPiece


@dataclass(frozen=True, slots=True)
class IdleTimeout:
    """Nobody spoke from ``start_sample`` (the last answer's end) to ``end_sample`` (``LoopConfig.idle_timeout_ms``): a
    response prompting the user follows."""

    start_sample: int
    end_sample: int


@dataclass(frozen=True, slots=True)
class OutputPaused:
    """The user's speech started over the answer (from ``first_voiced_sample``): the voice paused at ``at_s`` (``ducked``:
    went on quieter) while the loop judges it (``voice.overlap``); ``OutputResumed`` or an interruption
    (``UserSpeechStarted(barge_in=True)``, then ``TurnEnded``) follows."""

    first_voiced_sample: int
    at_s: float
    ducked: bool = False


@dataclass(frozen=True, slots=True)
class OutputResumed:
    """The speech over the answer was no turn (``kind``: "backchannel" or "noise"; ``text``: what it said): the answer goes
    on from where it paused."""

    at_s: float
    kind: str
    text: str = ""


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The turn is over.  ``spoken``: what the user heard of the answer ("" for a turn without words); ``reason``: None
    when the answer played out (or there was none), else why it was stopped ("turn_detected" for a barge-in,
    "client_cancelled" (a cancel or a truncate), "failed" when the LLM backend failed: ``error`` says how); ``report``: None
    for a turn without words; ``called``: the answer called a tool."""

    transcript: str
    spoken: str
    reason: str | None
    report: TurnReport | None
    error: str | None = None
    called: bool = False

    @property
    def cancelled(self) -> bool:
        return self.reason is not None and self.reason != "failed"


LoopEvent = (UserSpeechStarted | UserSpeechStopped | TranscriptFinal | ResponseStarted | PhraseStarted | FunctionCallDelta
             | IdleTimeout | OutputPaused | OutputResumed | TurnEnded)


@dataclass(frozen=True, slots=True)
class BargeIn:
    """The user spoke over an answer: their first voiced sample's time, when the endpointer knew it was speech (audio
    time), and when the answer was stopped (clock time)."""

    speech_s: float
    detected_s: float
    stopped_s: float
