"""One answer in progress, and its life as an explicit state machine (sans-I/O).

A ``Response`` is the work that answers one turn: transcribe, (score the end of turn), LLM tokens -> phrases -> TTS
chunks, run one piece at a time by the loop (``voice.loop``).  Its ``phase`` says where it stands; ``TRANSITIONS`` is
the one table of the moves allowed, and ``advance`` refuses any other (``IllegalTransition``, as ``voice.turns``).

A response started at a pause is speculative: its output is held back until the endpoint adopts it.

- ``SPECULATING``: working at a pause; its audio and tool calls are held.
- ``PARKED``: speculative, the pause withdrawn (``EarlyResume``): it waits for the endpointer's pause, which lets it go
  on (``SPECULATING``: the work heard all of the voice) or drops it.
- ``HELD``: speculative, its work done: the whole answer held until the endpoint adopts it.
- ``ANSWERING``: adopted (or never speculative: the endpoint, a commit, a typed turn): working, its output plays.
- ``DONE``: adopted, its work done; its audio may still be playing.
- ``FAILED``: its transcription came out degenerate (``Transcript.retry``): no answer from it.
- ``CLOSED``: dropped or stopped (the user went on, a barge-in, a cancel, the loop closed); nothing more runs.

The endpoint adopts a speculative response (``adopt``): ``SPECULATING`` or ``PARKED`` -> ``ANSWERING``, ``HELD`` ->
``DONE``.  ``finish`` ends the work (its generator ran out), ``close`` stops it from any phase (a second ``close`` does nothing).

What a response says about the turn rather than where it stands is data: its transcript (None until known), the
phrases announced to the adapter (none: nothing of it was heard yet), its tool calls, its error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from .phrases import PhraseChunker
from .turns import IllegalTransition


class Phase(Enum):
    SPECULATING = "speculating"
    PARKED = "parked"
    HELD = "held"
    ANSWERING = "answering"
    DONE = "done"
    FAILED = "failed"
    CLOSED = "closed"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.SPECULATING: frozenset({Phase.PARKED, Phase.HELD, Phase.FAILED, Phase.ANSWERING, Phase.CLOSED}),
    # (adopted while parked: the endpoint confirmed the turn, the pause it waited for is moot)
    Phase.PARKED: frozenset({Phase.SPECULATING, Phase.ANSWERING, Phase.CLOSED}),
    Phase.HELD: frozenset({Phase.DONE, Phase.CLOSED}),
    Phase.ANSWERING: frozenset({Phase.DONE, Phase.FAILED, Phase.CLOSED}),
    Phase.DONE: frozenset({Phase.CLOSED}),
    Phase.FAILED: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}

#: The phases whose output is held back (not adopted by the endpoint yet).
SPECULATIVE = frozenset({Phase.SPECULATING, Phase.PARKED, Phase.HELD})
#: The phases with no work left.
FINISHED = frozenset({Phase.HELD, Phase.DONE, Phase.FAILED, Phase.CLOSED})


class Kind(Enum):
    """What a response answers (fixed when it starts)."""

    ANSWER = "answer"  # the user's turn, spoken or typed: the LLM answers it
    TRANSCRIBE = "transcribe"  # a spoken turn, transcribed and not answered (``LoopConfig.create_response`` False)
    CONTINUATION = "continuation"  # no user turn: the LLM goes on from the conversation (after a tool's result)
    PROMPT = "prompt"  # no user turn: the loop's set phrase, not the LLM's (the idle prompt)


@dataclass(eq=False)
class Response:
    """One answer in progress: its ``phase`` and what it has made so far."""

    first_voiced: int
    last_voiced: int
    phase: Phase
    kind: Kind = Kind.ANSWER
    speak: bool = True  # spoken (TTS); False: text only, its phrases handed out as text (``LoopConfig.speak``)
    heard_until: int = 0  # the end (exclusive) of the audio it transcribes
    stamps: dict = field(default_factory=dict)
    transcript: str | None = None  # None until transcribed
    announced: int = 0  # phrases announced through PhraseStarted (the first one: its first audio went to the sink)
    phrases: list[str] = field(default_factory=list)
    held: list[tuple[int, np.ndarray]] = field(default_factory=list)  # audio made before the endpoint adopted it
    gen: Iterator | None = None  # its work, one piece per ``next``
    sim: dict = field(default_factory=dict)  # the LLM's simulated seconds from the reply's start: first_token, first_phrase
    due_s: float | None = None  # paced: the clock time before which its next piece may not be used
    end_of_turn: dict | None = None  # the end-of-turn score and decision made at its pause (for the report)
    calls: list = field(default_factory=list)  # tool-call pieces held until the answer is released
    called: bool = False  # the reply called a tool (a fact of the reply, reported with the turn)
    error: str | None = None  # the LLM backend failed (``LLMBackendError``): the turn ends with what was spoken
    steps: list[str] = field(default_factory=list)  # mitigation steps planned for it (``voice.mitigation.ORDER``)
    used: list[str] = field(default_factory=list)  # ... and those that changed what it did
    forecast_ms: float | None = None  # its voice-to-voice as last forecast
    chunker: PhraseChunker | None = None  # its reply's phrase chunker, once the reply started
    scoring: Future | None = None  # its end-of-turn score while it is computed aside (``voice.speculation``)

    def advance(self, to: Phase) -> None:
        """Move to phase ``to``; a move ``TRANSITIONS`` does not allow raises ``IllegalTransition``."""
        if to not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"a response may not go from {self.phase.value} to {to.value}")
        self.phase = to

    # -- the moves the loop makes -------------------------------------------------------------------------------------

    def park(self) -> None:
        """The pause was withdrawn: work that is under way waits (finished work has nothing to wait for)."""
        if self.phase is Phase.SPECULATING:
            self.advance(Phase.PARKED)

    def resume(self) -> None:
        """The endpointer's pause heard no more voice than the work did: it goes on."""
        if self.phase is Phase.PARKED:
            self.advance(Phase.SPECULATING)

    def adopt(self) -> None:
        """The endpoint confirmed the turn the speculation answers: its output may play."""
        self.advance(Phase.DONE if self.phase is Phase.HELD else Phase.ANSWERING)

    def finish(self) -> None:
        """Its work ran out (a failed transcription has already said so)."""
        if self.phase is not Phase.FAILED:
            self.advance(Phase.HELD if self.phase is Phase.SPECULATING else Phase.DONE)

    def close(self) -> None:
        """Stop its work for good (once: a closed response stays closed)."""
        if self.phase is Phase.CLOSED:
            return
        if self.gen is not None:
            self.gen.close()
        self.advance(Phase.CLOSED)

    # -- what the phase says ------------------------------------------------------------------------------------------

    @property
    def speculative(self) -> bool:
        return self.phase in SPECULATIVE

    @property
    def released(self) -> bool:
        """Adopted and not stopped: its audio plays as it comes."""
        return self.phase is Phase.ANSWERING or self.phase is Phase.DONE

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    @property
    def answered(self) -> bool:
        """Some of it went out: audio to the sink, or (text only) a phrase handed out."""
        return self.announced > 0

    @property
    def user_turn(self) -> bool:
        """It answers (or transcribes) a turn of the user's, not the conversation as it stands."""
        return self.kind is Kind.ANSWER or self.kind is Kind.TRANSCRIBE

    def stamp(self, name: str, t: float) -> None:
        self.stamps.setdefault(name, t)

    def ready(self, now: float) -> bool:
        """Work left that may be done now.  A speculative answer stops at its first audio until the endpoint adopts it:
        that is all the endpoint plays at once, and the rest would be lost with it if the user goes on (its work is
        the cores' that other sessions' turns wait for)."""
        if self.phase is Phase.SPECULATING:  # (while its score is computed aside it goes on: its next piece takes it in)
            return (not self.held or self.scoring is not None) and (self.due_s is None or now >= self.due_s)
        return self.phase is Phase.ANSWERING and (self.due_s is None or now >= self.due_s)


def has_words(text: str | None) -> bool:
    """The text says something (a noise, a breath, a click transcribes to none)."""
    return bool(re.search(r"\w", text or ""))
