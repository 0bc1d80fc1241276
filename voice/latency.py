"""Per-turn latency: raw timestamps on one clock, spans derived from them, the budget verdict,
and the summary over a session (ARCHITECTURE.md, "Latency: what is measured").

A ``TurnTrace`` is filled while a turn runs (``mark``); ``report()`` freezes it into a
``TurnReport`` whose ``*_ms`` figures are differences of the stored timestamps, so they
add up: ``endpoint + asr + first_phrase + tts_first_audio + hold = voice_to_voice``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Timestamps a turn records, in the order a turn normally passes them.
MARKS = (
    "speech_start",  # first voiced sample of the user (audio time)
    "last_voiced",  # last voiced sample of the user (audio time)
    "pause",  # the pause decided at which the answer's speculative work started (absent when it started at the endpoint)
    "endpoint",  # speech_stopped decided
    "asr_start",  # the final transcript's ASR started (at the pause when speculative, else at the endpoint)
    "transcript",  # final transcript available (earlier than endpoint when speculative)
    "turn_end_score",  # the end-of-turn score of that transcript known (voice.turn_end)
    "first_token",  # first generated token
    "first_phrase",  # first speakable phrase handed to TTS
    "tts_first_audio",  # first PCM chunk of the answer out of TTS
    "answer_audio",  # first sample of the answer played
    "answer_text",  # a text-only answer's first phrase handed out (no audio: its first text is the answer)
    "first_audio",  # first sample of any agent audio (an acknowledgement counts here)
    "done",  # last answer sample handed to the output, or the turn was cut
)

STAGES = ("endpoint_ms", "asr_ms", "llm_first_token_ms", "first_phrase_ms", "tts_first_audio_ms", "hold_ms",
          "voice_to_voice_ms", "first_audio_ms")
#: A text-only answer's (``LoopConfig.speak`` off, a Realtime ``output_modalities: ["text"]``): the user's last voiced
#: sample -> its first phrase handed out.  It has no ``tts_first_audio_ms``, ``hold_ms`` or ``voice_to_voice_ms``; this
#: figure is the one held against the budget instead.
TEXT_STAGES = ("voice_to_text_ms",)
#: The work itself, wherever it ran (at the pause or after the endpoint): the critical path from the start of the
#: final transcript's ASR to the answer's first audio out of TTS, and its ASR and end-of-turn scoring.
WORK = ("asr_run_ms", "turn_end_score_ms", "critical_path_ms")


@dataclass(slots=True)
class TurnTrace:
    turn: int
    budget_ms: float
    stamps: dict[str, float] = field(default_factory=dict)
    mitigations: list[str] = field(default_factory=list)
    transcript: str = ""
    reply: str = ""
    barge_in: bool = False
    end_of_turn: dict | None = None  # what ended the user's turn: score, rule, silence waited (voice.loop)
    forecast_ms: float | None = None  # voice-to-voice as forecast when a mitigation was last weighed (voice.mitigation)
    overlaps: tuple[dict, ...] = ()  # speech over the answer that was no turn (voice.overlap)

    def mark(self, name: str, t: float, overwrite: bool = False) -> None:
        if name not in MARKS:
            raise KeyError(f"unknown mark {name!r}")
        if overwrite or name not in self.stamps:
            self.stamps[name] = t

    def mitigate(self, what: str) -> None:
        if what not in self.mitigations:
            self.mitigations.append(what)

    def report(self, simulated: dict | None = None) -> TurnReport:
        return TurnReport(turn=self.turn, transcript=self.transcript, reply=self.reply, budget_ms=self.budget_ms,
                          stamps=dict(self.stamps), mitigations=tuple(self.mitigations), barge_in=self.barge_in,
                          simulated=simulated, end_of_turn=self.end_of_turn, forecast_ms=self.forecast_ms,
                          overlaps=self.overlaps)


#: Each figure of ``TurnReport.latency_ms`` (``STAGES`` and ``TEXT_STAGES``) -> the two marks it runs between.
LATENCY_SPANS = {
    "endpoint_ms": ("last_voiced", "endpoint"),
    "asr_ms": ("endpoint", "transcript"),
    "llm_first_token_ms": ("transcript", "first_token"),
    "first_phrase_ms": ("transcript", "first_phrase"),
    "tts_first_audio_ms": ("first_phrase", "tts_first_audio"),
    "hold_ms": ("tts_first_audio", "answer_audio"),
    "voice_to_voice_ms": ("last_voiced", "answer_audio"),
    "first_audio_ms": ("last_voiced", "first_audio"),
    "voice_to_text_ms": ("last_voiced", "answer_text"),
}
#: Each figure of ``TurnReport.work_ms`` (``WORK``) -> the two marks it runs between.
WORK_SPANS = {
    "asr_run_ms": ("asr_start", "transcript"),
    "turn_end_score_ms": ("transcript", "turn_end_score"),
    "critical_path_ms": ("asr_start", "tts_first_audio"),
}


def _span(stamps, a, b):
    if a in stamps and b in stamps:
        return (stamps[b] - stamps[a]) * 1000
    return None


def _spans(stamps, table: dict[str, tuple[str, str]]) -> dict[str, float | None]:
    return {name: _span(stamps, a, b) for name, (a, b) in table.items()}


def _rounded(figures: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (None if v is None else round(v, 1)) for k, v in figures.items()}


@dataclass(frozen=True, slots=True)
class TurnReport:
    turn: int
    transcript: str
    reply: str
    budget_ms: float
    stamps: dict
    mitigations: tuple[str, ...]
    barge_in: bool
    #: the same turn on the simulated deployment the decode core runs on (``wafer.deploy.simulated_turn``):
    #: deployment, llm_first_token_ms, first_phrase_ms, token_ms, voice_to_voice_ms, within_budget, overrun_ms
    simulated: dict | None = None
    #: what ended the user's turn: ``rule`` ("confident", "short", "unsure", "unfinished": the end-of-turn policy;
    #: "unscored": the policy's wait, no score in time; "silence": the plain silence; "manual": the client committed),
    #: ``silence_ms`` waited after the last voiced sample, and with a score ``p_end``, ``p_token``, ``source``,
    #: ``stop_ms``, ``eagerness``; None for a typed turn
    end_of_turn: dict | None = None
    #: voice-to-voice as forecast (ms) the last time the loop weighed degrading the turn (``voice.mitigation``); the
    #: steps taken are in ``mitigations``; None: never weighed (a typed turn, or mitigation off)
    forecast_ms: float | None = None
    #: speech over the answer judged no turn, in order: ``kind`` ("backchannel", "noise"), ``text``, ``speech_start_s``,
    #: ``paused_ms`` (how long the voice paused while it was judged); an interruption is ``barge_in`` instead
    overlaps: tuple[dict, ...] = ()

    @property
    def work_ms(self) -> dict[str, float | None]:
        return _spans(self.stamps, WORK_SPANS)

    @property
    def latency_ms(self) -> dict[str, float | None]:
        return _spans(self.stamps, LATENCY_SPANS)

    @property
    def voice_to_voice_ms(self) -> float | None:
        return self.latency_ms["voice_to_voice_ms"]

    @property
    def answer_ms(self) -> float | None:
        """The figure held against the budget: voice-to-voice, or for a text-only answer voice-to-text."""
        v = self.voice_to_voice_ms
        return _span(self.stamps, *LATENCY_SPANS["voice_to_text_ms"]) if v is None else v

    @property
    def within_budget(self) -> bool:
        v = self.answer_ms
        return v is not None and v <= self.budget_ms

    @property
    def overrun_ms(self) -> float:
        v = self.answer_ms
        return math.inf if v is None else max(0.0, v - self.budget_ms)

    @property
    def mitigation(self) -> str:
        return ",".join(self.mitigations) if self.mitigations else "none"

    def to_dict(self) -> dict:
        return {
            "turn": self.turn,
            "transcript": self.transcript,
            "reply": self.reply,
            "latency_ms": _rounded(self.latency_ms),
            "work_ms": _rounded(self.work_ms),
            "end_of_turn": self.end_of_turn,
            "budget_ms": self.budget_ms,
            "within_budget": self.within_budget,
            "overrun_ms": None if math.isinf(self.overrun_ms) else round(self.overrun_ms, 1),
            "mitigation": self.mitigation,
            "forecast_ms": None if self.forecast_ms is None else round(self.forecast_ms, 1),
            "barge_in": self.barge_in,
            "overlaps": list(self.overlaps),
            "simulated": self.simulated,
        }


def percentile(values, q: float) -> float | None:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    k = (len(vals) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def _p50_p95(values) -> dict:
    p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
    return {"p50": None if p50 is None else round(p50, 1), "p95": None if p95 is None else round(p95, 1)}


def summarize(reports: list[TurnReport]) -> dict:
    """p50/p95 of every stage and the budget hit rate over ``reports``."""
    out = {"turns": len(reports)}
    for stage in STAGES:
        out[stage] = _p50_p95([r.latency_ms[stage] for r in reports])
    for stage in TEXT_STAGES:  # (only with text-only answers)
        if any(r.latency_ms[stage] is not None for r in reports):
            out[stage] = _p50_p95([r.latency_ms[stage] for r in reports])
    for name in WORK:
        out[name] = _p50_p95([r.work_ms[name] for r in reports])
    rules = [r.end_of_turn["rule"] for r in reports if r.end_of_turn]
    out["end_of_turn_rules"] = {rule: rules.count(rule) for rule in sorted(set(rules))}
    taken = [m for r in reports for m in r.mitigations]
    out["mitigations"] = {m: taken.count(m) for m in dict.fromkeys(taken)}  # turns that took each, first seen first
    answered = [r for r in reports if r.answer_ms is not None]
    out["within_budget"] = sum(r.within_budget for r in reports)
    out["budget_hit_rate"] = round(out["within_budget"] / len(reports), 3) if reports else None
    out["answered"] = len(answered)
    sim = [r.simulated for r in reports if r.simulated]
    if sim:
        out["simulated"] = {"deployment": sim[-1]["deployment"], "turns": len(sim),
                            "within_budget": sum(1 for x in sim if x["within_budget"])}
        for key in ("llm_first_token_ms", "first_phrase_ms", "voice_to_voice_ms"):
            p50, p95 = percentile([x[key] for x in sim], 0.5), percentile([x[key] for x in sim], 0.95)
            out["simulated"][key] = {"p50": round(p50, 1), "p95": round(p95, 1)}
    return out
