"""The voice loop's settings (``LoopConfig``) and how a client's turn-detection settings map onto them.

The loop runs its own endpointer (``voice.vad``); a client that speaks the Realtime API describes turn detection
as ``server_vad`` with a threshold, a silence duration and a prefix padding.  ``LoopConfig.with_turn_detection``
is that mapping, kept here beside the settings it changes, with its bounds named.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .mitigation import MitigationConfig
from .overlap import InterruptionConfig
from .turn_end import TurnEndPolicy
from .vad import EndpointerConfig

#: The longest end-of-turn silence a client may ask for (ms): past it a turn would feel abandoned.
MAX_STOP_MS = 2000
#: The end-of-turn silence stays this far above the pause at which speculation starts (ms).
STOP_OVER_PAUSE_MS = 30
#: The most audio kept before the first voiced sample for the ASR (ms).
MAX_PADDING_MS = 1000


@dataclass(frozen=True, slots=True)
class LoopConfig:
    budget_ms: float = 500.0
    speculative: bool = True  # transcribe and start answering at a pause
    ack: bool = False  # play a short acknowledgement when the answer is late (every turn; else as a mitigation)
    #: a turn forecast over the budget degrades in a fixed order (``voice.mitigation``); None: never
    mitigation: MitigationConfig | None = field(default_factory=MitigationConfig)
    ack_after_ms: float = 400.0  # ... if no answer audio this long after the last voiced sample
    max_sentences: int = 2  # spoken-style answers: stop after this many sentences
    padding_ms: int = 200  # audio kept around the utterance for the ASR
    #: The loop pauses earlier than the endpointer's own default (150 ms): the speculative work and the end-of-turn
    #: score start there, and a confident end closes when both are done (~90 + 60 ASR + 15 score ms of silence), so
    #: every ms of the pause is a ms of endpoint; a false pause (a stop consonant's closure) costs one discarded
    #: transcription, on a CPU that is idle while the user speaks.
    #: The speculative work starts sooner still, at the endpointer's ``EarlyPause`` (90 ms of energy silence), before
    #: webrtcvad's hangover lets the ``Pause`` through (~120 ms); the ``Pause`` keeps it when it heard every voiced
    #: sample.
    endpointer: EndpointerConfig = field(default_factory=lambda: EndpointerConfig(pause_ms=90, early_pause_ms=90))
    turn_detection: bool = True  # False: turns end only by ``commit_input()`` (the VAD still runs, for bounds)
    barge_in: bool = True  # speech over the answer interrupts it (False: speech while speaking is ignored)
    #: how speech over a playing answer is judged before it interrupts (``voice.overlap``: pause, decide on the words)
    interruption: InterruptionConfig = field(default_factory=InterruptionConfig)
    #: a detected turn is answered (False: it is only transcribed; the adapter asks for the answer, as a Realtime
    #: client does with ``create_response: false`` and ``response.create``)
    create_response: bool = True
    #: with turn detection, this long (ms) without a turn after the last answer finished playing (or since the loop
    #: began) makes the loop prompt the user (``IDLE_PROMPT``), as a Realtime ``idle_timeout_ms`` does; None: never
    idle_timeout_ms: int | None = None
    #: the answer is spoken (TTS, audio to the sink); False: text only (a Realtime ``output_modalities: ["text"]``): its
    #: phrases are cut and announced (``PhraseStarted``) as text when handed out, nothing is synthesized or played, and
    #: the turn's answer stamp is its first phrase handed out (``answer_text``, ``voice_to_text_ms``)
    speak: bool = True
    pace: bool = False  # the answer follows the simulated deployment's clock (see the module docstring)
    #: Semantic end of turn (``voice.turn_end``): at each pause the speculative transcript is scored and the policy picks
    #: the silence that closes the turn (a confident end sooner, an unfinished one later); None: ``endpointer.stop_ms``
    #: alone, as ``server_vad``.  Needs ``speculative`` and the engines' ``turn_end`` scorer.
    end_of_turn: TurnEndPolicy | None = field(default_factory=TurnEndPolicy)

    def with_turn_detection(self, *, threshold: float, silence_duration_ms: int, prefix_padding_ms: int,
                            interrupt_response: bool, create_response: bool = True,
                            idle_timeout_ms: int | None = None) -> LoopConfig:
        """The settings for a client's ``server_vad`` turn detection: the threshold (0..1) picks webrtcvad's
        aggressiveness (0..3), the silence duration the end-of-turn silence (kept above the pause, at most
        ``MAX_STOP_MS``), the prefix padding the audio kept before speech for the ASR."""
        ep = replace(self.endpointer, aggressiveness=min(3, int(threshold * 4)),
                     stop_ms=min(MAX_STOP_MS, max(self.endpointer.pause_ms + STOP_OVER_PAUSE_MS, silence_duration_ms)))
        return replace(self, turn_detection=True, barge_in=interrupt_response, endpointer=ep, create_response=create_response,
                       padding_ms=min(MAX_PADDING_MS, prefix_padding_ms), end_of_turn=None, idle_timeout_ms=idle_timeout_ms)

    def with_semantic_turn_detection(self, *, eagerness: str, interrupt_response: bool,
                                     create_response: bool = True) -> LoopConfig:
        """The settings for a client's ``semantic_vad``: the end-of-turn policy at ``eagerness`` (low, medium, high,
        auto), on the loop's own endpointer settings."""
        return replace(self, turn_detection=True, barge_in=interrupt_response, end_of_turn=TurnEndPolicy.named(eagerness),
                       create_response=create_response, idle_timeout_ms=None,
                       endpointer=replace(self.endpointer, stop_ms=LoopConfig().endpointer.stop_ms))

    def manual(self) -> LoopConfig:
        """Turns end only when the client commits its input."""
        return replace(self, turn_detection=False)
