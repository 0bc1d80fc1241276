"""The turn state machine (sans-I/O): listening -> thinking -> speaking -> listening.

One transition table; an event with no entry for the current state raises ``IllegalTransition``, the exception of
every state machine in ``voice`` (the endpointer's too).
"""

from __future__ import annotations

from enum import Enum


class TurnState(Enum):
    LISTENING = "listening"
    THINKING = "thinking"  # the user's turn ended; no answer audio yet
    SPEAKING = "speaking"  # answer audio is playing or queued


class TurnEvent(Enum):
    SPEECH_STARTED = "speech_started"
    SPEECH_STOPPED = "speech_stopped"
    ANSWER_AUDIO = "answer_audio"  # first answer sample scheduled
    NO_ANSWER = "no_answer"  # nothing to say (empty transcript)
    ANSWER_DONE = "answer_done"  # all answer audio played
    BARGE_IN = "barge_in"  # the user spoke over the answer


class IllegalTransition(RuntimeError):
    """A state machine got an event its transition table has no entry for in its current state (a bug in its caller)."""


TRANSITIONS: dict[TurnState, dict[TurnEvent, TurnState]] = {
    TurnState.LISTENING: {
        TurnEvent.SPEECH_STARTED: TurnState.LISTENING,
        TurnEvent.SPEECH_STOPPED: TurnState.THINKING,
    },
    TurnState.THINKING: {
        TurnEvent.ANSWER_AUDIO: TurnState.SPEAKING,
        TurnEvent.NO_ANSWER: TurnState.LISTENING,
        TurnEvent.BARGE_IN: TurnState.LISTENING,  # the user went on before we answered
    },
    TurnState.SPEAKING: {
        TurnEvent.ANSWER_DONE: TurnState.LISTENING,
        TurnEvent.BARGE_IN: TurnState.LISTENING,
    },
}


class TurnMachine:
    def __init__(self):
        self.state = TurnState.LISTENING

    def fire(self, event: TurnEvent) -> TurnState:
        nxt = TRANSITIONS[self.state].get(event)
        if nxt is None:
            raise IllegalTransition(f"{event.value} is not allowed while {self.state.value}")
        self.state = nxt
        return nxt

    def can(self, event: TurnEvent) -> bool:
        return event in TRANSITIONS[self.state]
