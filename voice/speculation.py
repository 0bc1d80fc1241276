"""The end of the user's turn, worked ahead of the endpoint: a part of ``VoiceLoop`` (``voice.loop``, a mixin).

At a pause (the endpointer's ``EarlyPause``, then its ``Pause``) the loop starts a speculative response (``_spec``):
it transcribes the utterance so far and starts answering, its output held (``voice.response``).  An ``EarlyResume``
parks it; the ``Pause`` lets it go on when it heard every voiced sample, else starts afresh; resumed speech drops it.
At the endpoint (``SpeechStopped``) it is adopted when it heard the same voice, else the turn is answered afresh.

With a semantic end of turn (``LoopConfig.end_of_turn`` and the engines' scorer) the speculative transcript is scored
and the policy picks the silence that closes the turn; the endpointer gets it after the piece of work
(``_apply_stop``), and the report says what ended the turn (``_end_of_turn_info``).

Uses the loop's ``cfg``, ``e``, ``clock``, ``vad``, ``_trace``, ``_task``, ``_spec``, ``_stop_ms`` and its reply pump
(``_start``, ``_release``, ``_mitigate``: ``voice.reply``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .latency import TurnTrace
from .response import Kind, Phase, Response
from .turn_end import scoring_context
from .vad import EarlyPause, Pause, SpeechStopped
from .vad import State as VadState

if TYPE_CHECKING:
    from .loop import Engines, LoopConfig
    from .protocols import Clock
    from .vad import Endpointer


class Speculation:
    # the loop's state this part works on (``VoiceLoop.__init__``)
    cfg: LoopConfig
    e: Engines
    clock: Clock
    vad: Endpointer
    _trace: TurnTrace | None
    _task: Response | None
    _spec: Response | None
    _stop_ms: int | None

    def _speculating(self) -> bool:
        """A pause now may start a speculative answer: the user's turn is open and not answered yet."""
        return self.cfg.speculative and self._trace is not None and self._task is None

    def _speculate(self, ev: EarlyPause | Pause) -> None:
        self._drop_spec()
        self._spec = self._start(ev.first_voiced_sample, ev.last_voiced_sample, speculative=True)

    def _early_pause(self, ev: EarlyPause, now: float) -> None:
        if not self._speculating():
            return
        if self._spec is not None and self._spec.heard_until > ev.last_voiced_sample:
            self._spec.resume()  # the work under way heard all of it
            return
        self._speculate(ev)
        self._spec.stamp("pause", now)

    def _pause(self, ev: Pause, now: float) -> None:
        if not self._speculating():
            return
        spec = self._spec
        if spec is not None and spec.heard_until > ev.last_voiced_sample:
            spec.last_voiced = ev.last_voiced_sample  # an early pause's work heard all of it: it stands
            spec.resume()
        else:
            self._speculate(ev)
        self._spec.stamp("pause", now)
        if self._semantic():  # until the score is in, wait as for an unsure turn (a slow ASR cuts no one off)
            ms, self._stop_ms = self._stop_ms, None  # ... unless it is in (work started at an early pause)
            self.vad.set_stop_ms(self.cfg.end_of_turn.waiting_ms if ms is None else ms)

    def _answer_turn(self, ev: SpeechStopped) -> None:
        """The endpoint: the speculative answer becomes the turn's answer when it heard the same voice (its held output
        plays at once), else the turn is answered afresh."""
        spec, self._spec = self._spec, None
        if not self.cfg.create_response:  # transcribed only: the adapter asks for the answer
            if spec is not None:
                spec.close()
            self._task = self._start(ev.first_voiced_sample, ev.last_voiced_sample, speculative=False, kind=Kind.TRANSCRIBE)
        elif spec is not None and spec.last_voiced == ev.last_voiced_sample and spec.phase is not Phase.FAILED:  # it was right
            self._trace.mitigate("speculative")
            self._task = spec
            spec.adopt()
            self._release(spec)
            if not spec.answered:  # what the endpoint's wait left of the budget
                ahead = ("asr",) * ("transcript" not in spec.stamps) + ("first_phrase",) * ("first_phrase" not in spec.stamps)
                self._mitigate(spec, ahead + ("tts",))
        else:
            if spec is not None:
                spec.close()
            self._task = self._start(ev.first_voiced_sample, ev.last_voiced_sample, speculative=False)

    def _drop_spec(self) -> None:
        self._stop_ms = None
        if self._spec is not None:
            self._spec.close()
            self._spec = None

    # -- the end-of-turn policy ----------------------------------------------------------------------------------------

    def _semantic(self) -> bool:
        """Turns end by the end-of-turn policy (else by the endpointer's plain silence)."""
        return self.cfg.speculative and self.cfg.end_of_turn is not None and self.e.turn_end is not None

    def _judge_turn_end(self, r: Response) -> None:
        """Score the speculative transcript (P(the turn is over)) and pick the silence that closes the turn; the
        endpointer gets it after the piece of work that has it (``_apply_stop``).  Where the decode core runs on a
        compute thread (the server) the score is computed there while the answer's first phrase, which needs no
        model, is voiced here: the turn's end and its first audio come together instead of one after the other."""
        with self.clock.working():
            r.scoring = self.e.turn_end.submit(scoring_context(self.e.llm), r.transcript)
        self._take_score(r)

    def _await_judgement(self, r: Response) -> None:
        """The score, waited for (the answer's work is done before it)."""
        if r.scoring is not None:
            with self.clock.working():
                r.scoring.exception()
            self._take_score(r)

    def _take_score(self, r: Response) -> bool:
        """Take in ``r``'s score once it is in; False while it is not."""
        if r.scoring is None or not r.scoring.done():
            return False
        score, r.scoring = r.scoring.result(), None
        r.stamp("turn_end_score", self.clock.now())
        decision = self.cfg.end_of_turn.decide(score, r.transcript)
        r.end_of_turn = {"p_end": round(score.p_end, 4), "p_token": round(score.p_token, 5), "source": score.source,
                         "rule": decision.rule, "stop_ms": decision.stop_ms, "eagerness": self.cfg.end_of_turn.eagerness}
        if r is self._spec:
            self._stop_ms = decision.stop_ms
        return True

    def _apply_stop(self) -> None:
        """Hand a pending end-of-turn decision to the endpointer, which may stop the turn at once (outside any
        response's generator: the stop adopts or drops the speculative answer)."""
        if self._spec is not None:
            self._take_score(self._spec)  # (a score computed aside)
        if self._stop_ms is None:
            return
        if self._spec is not None and self.vad.state is VadState.SPEECH:
            return  # decided at an early pause: it waits for the endpointer's own pause
        ms, self._stop_ms = self._stop_ms, None
        if self._spec is not None and self.vad.state is VadState.PAUSED:
            self.vad.set_stop_ms(ms)
            self._vad_events()

    def _end_of_turn_info(self, r: Response, tr: TurnTrace) -> dict | None:
        """What ended the user's turn: the end-of-turn score and rule when one decided it, else the plain silence."""
        if "last_voiced" not in tr.stamps or "endpoint" not in tr.stamps:  # a typed turn
            return None
        if r.end_of_turn is not None:
            info = dict(r.end_of_turn)
        elif self._semantic():  # no score in time (or no words to score): the policy's wait
            info = {"rule": "unscored", "stop_ms": self.cfg.end_of_turn.waiting_ms}
        else:
            info = {"rule": "silence", "stop_ms": self.cfg.endpointer.stop_ms}
        info["silence_ms"] = round((tr.stamps["endpoint"] - tr.stamps["last_voiced"]) * 1000, 1)
        return info
