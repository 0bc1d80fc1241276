"""When a turn will not make its budget: say so, and degrade in a fixed order.

Owns the forecast of a turn's voice-to-voice time and the steps taken when it is over the budget.  A sans-I/O
policy: the loop (``voice.loop``) tells it what each finished turn's critical path cost (``observe``) and asks, at
the points where it can still act (before the transcription, once the transcript is in, when the endpoint adopts
the answer), what the turn should give up (``plan``).  The steps, in the order they are taken as the forecast
overrun grows; a turn never takes a step without the ones before it:

1. ``short_first_phrase``: the first phrase is one word, not two (``PhraseConfig.max_first_words``): one LLM token
   and the shortest TTS call before the first audio; nothing of the answer is lost.
2. ``ack``: the acknowledgement sound ("Hmm,", 360 ms) plays if no answer audio came ``LoopConfig.ack_after_ms`` after
   the last voiced sample: the caller hears that they were heard.  The answer follows it, so the ack is only taken
   for a turn forecast to answer after the ack would be over anyway (it then costs the answer nothing).
3. ``short_asr_window``: Whisper reads a shorter window (``voice.asr.SHORT_WINDOW``): faster, slightly less accurate
   (a degenerate result is transcribed again on the usual window); only while the transcription is still to come.

The forecast is the time already passed since the last voiced sample plus the median cost of each stage still to
run, over the last ``window`` turns of this loop (before any, the critical path's bars: ASR 80 ms, first phrase 60
ms after the transcript, TTS first audio 40 ms).  A machine that got slower (another program took a core) shows in
the next turns' costs, and so in their forecasts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .latency import TurnReport, percentile

#: The steps, in the order they are taken.
ORDER = ("short_first_phrase", "ack", "short_asr_window")
#: What each stage costs before any turn was measured (ms): the critical path's bars (bench/turn.py).
DEFAULT_COSTS_MS = {"asr": 80.0, "first_phrase": 60.0, "tts": 40.0}


@dataclass(frozen=True, slots=True)
class MitigationConfig:
    """The forecast overrun (ms over the budget) from which each step of ``ORDER`` is taken."""

    short_first_phrase_over_ms: float = 0.0
    ack_over_ms: float = 100.0
    short_asr_window_over_ms: float = 200.0
    window: int = 8  # finished turns the stage costs are the median of

    def __post_init__(self) -> None:
        t = (self.short_first_phrase_over_ms, self.ack_over_ms, self.short_asr_window_over_ms)
        if list(t) != sorted(t):
            raise ValueError(f"the steps' thresholds must grow in the order {ORDER}, got {t}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    def thresholds(self) -> tuple[float, ...]:
        return self.short_first_phrase_over_ms, self.ack_over_ms, self.short_asr_window_over_ms


class Mitigation:
    """The stage costs of the last turns, and the steps a forecast calls for."""

    def __init__(self, config: MitigationConfig | None = None):
        self.cfg = config or MitigationConfig()
        self._costs = {k: deque(maxlen=self.cfg.window) for k in DEFAULT_COSTS_MS}

    def observe(self, report: TurnReport) -> None:
        """A finished turn's critical path: its transcription, first phrase after the transcript and TTS first audio."""
        s = report.stamps
        spans = {"asr": ("asr_start", "transcript"), "first_phrase": ("transcript", "first_phrase"),
                 "tts": ("first_phrase", "tts_first_audio")}
        for key, (a, b) in spans.items():
            if a in s and b in s and s[b] >= s[a]:
                self._costs[key].append((s[b] - s[a]) * 1000)

    def cost_ms(self, stage: str) -> float:
        """The median cost of ``stage`` (``asr``, ``first_phrase``, ``tts``) over the last turns, or its default."""
        got = percentile(self._costs[stage], 0.5)
        return DEFAULT_COSTS_MS[stage] if got is None else got

    def forecast_ms(self, elapsed_ms: float, to_run: tuple[str, ...]) -> float:
        """Voice-to-voice for a turn ``elapsed_ms`` past its last voiced sample with the stages ``to_run`` still ahead."""
        return elapsed_ms + sum(self.cost_ms(s) for s in to_run)

    def plan(self, forecast_ms: float, budget_ms: float, ack_end_ms: float | None = None) -> tuple[str, ...]:
        """The steps of ``ORDER`` a turn forecast at ``forecast_ms`` takes (a prefix of it; empty within the budget).
        ``ack_end_ms``: when the acknowledgement would end (after the last voiced sample); the ack, and so every step
        after it, needs the answer forecast later than that."""
        over = forecast_ms - budget_ms
        steps = []
        for step, t in zip(ORDER, self.cfg.thresholds()):
            if over <= t or step == "ack" and ack_end_ms is not None and forecast_ms <= ack_end_ms:
                break
            steps.append(step)
        return tuple(steps)
