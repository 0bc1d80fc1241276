"""The voice loop: audio in, turns out, on one clock, cooperatively scheduled.

``VoiceLoop.feed(chunk)`` takes input audio (any rate), runs the endpointer and reacts to its events (``on_vad``);
``step()`` advances the current response by one small piece of work (a transcription, one LLM token, one TTS chunk), so
input keeps being read between pieces and a barge-in is seen within one piece.  Drivers alternate ``feed`` and
``run_until`` (one driver for a file, the mic demo and the server) against a ``RealClock`` or a ``VirtualClock``.

The loop is the turn policy; what it keeps is delegated: the input audio and its clock times to an ``InputBuffer``, the
play cursor and the words heard to a ``Playout``, the turn state to a ``TurnMachine``, the timestamps to a ``TurnTrace``,
each answer's phase to its ``Response`` (``voice.response``).  Its parts: the work ahead of the endpoint and the
end-of-turn policy (``voice.speculation``), a response's work and output (``voice.reply``), the drivers
(``voice.drivers``).  Its adapter follows a turn through ``on_event`` (``voice.loop_events``).

When the decode core runs on a simulated deployment, each turn also carries the LLM's simulated times (to its first
token and its first phrase) and, through ``Engines.project``, the ``simulated`` block of its report.  With
``LoopConfig.pace`` the answer follows the deployment's clock: a piece of the reply is not used before the reply's
start plus its simulated time (a slower target is waited for), and a virtual clock charges the LLM its simulated time
instead of this machine's (so a faster target's answer comes sooner).

The budget is worked against, not just measured: at a ``Pause`` the loop transcribes and starts answering speculatively
(audio held back until the endpoint confirms the turn, dropped if the user goes on), the phrase chunker releases a short
first clause, and an optional acknowledgement sound covers a late answer (reported as ``first_audio_ms``, never as the
answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from decode.batching import deadline

from .audio import AudioChunk
from .drivers import run_stream, run_until
from .input_buffer import InputBuffer
from .latency import TurnReport, TurnTrace
from .loop_config import LoopConfig
from .loop_events import BargeIn, IdleTimeout, LoopEvent, TurnEnded, UserSpeechStarted, UserSpeechStopped
from .mitigation import ORDER as MITIGATION_ORDER
from .mitigation import Mitigation
from .overlap import OverlapPolicy, Verdict
from .playout import Playout
from .protocols import ASR_RATE, Clock, Conversation, Sink, Synthesizer, Transcriber
from .reply import IDLE_PROMPT, ReplyPump
from .response import Kind, Response, has_words
from .speculation import Speculation
from .turn_end import TurnEndScorer
from .turns import TurnEvent, TurnMachine, TurnState
from .vad import EarlyPause, EarlyResume, Endpointer, EndpointerConfig, Pause, SpeechResumed, SpeechStarted, SpeechStopped, VadEvent
from .vad import State as VadState

__all__ = ["IDLE_PROMPT", "PREPARE_SLACK_S", "Engines", "LoopConfig", "VoiceLoop", "run_stream", "run_until"]

#: the idle prefill of the next turn is due this long after it starts (s): behind every turn in its budget
PREPARE_SLACK_S = 1.0
_SAMPLE_FIELDS = ("sample", "first_voiced_sample", "last_voiced_sample", "start_pad", "end_pad")  # of the VAD events


@dataclass
class Engines:
    transcriber: Transcriber
    llm: Conversation
    tts: Synthesizer
    ack_pcm: np.ndarray | None = None  # the acknowledgement sound at tts.sample_rate
    #: ``project(stamps, llm_sim, budget_ms) -> dict | None``: a turn's ``simulated`` block from its measured stamps and the
    #: LLM's simulated seconds (``first_token``, ``first_phrase``); the CLI wires ``wafer.deploy.simulated_turn`` here.
    project: Callable[[dict, dict, float], dict | None] | None = None
    #: P(the user's turn is over) from the text heard at a pause (``voice.turn_end``), on the conversation's generator;
    #: None: turns end on silence alone.
    turn_end: TurnEndScorer | None = None


class VoiceLoop(Speculation, ReplyPump, OverlapPolicy):
    def __init__(self, engines: Engines, sink: Sink, clock: Clock, config: LoopConfig | None = None,
                 on_report: Callable[[TurnReport], None] | None = None,
                 on_partial: Callable[[str], None] | None = None,
                 on_event: Callable[[LoopEvent], None] | None = None):
        self.e = engines
        self.sink = sink
        self.clock = clock
        self.cfg = config or LoopConfig()
        self.on_report = on_report
        self.on_partial = on_partial  # speculative transcripts, while the user may still go on
        self.on_event = on_event  # the adapter follows a turn (voice.loop_events)
        self.vad = Endpointer(self.cfg.endpointer)
        self._vad_offset = 0  # input sample at which the current endpointer started
        self._ignoring = False  # an utterance over the answer, with barge-in off
        if self.cfg.endpointer.rate != ASR_RATE:
            raise ValueError(f"the loop runs its endpointer at {ASR_RATE} Hz")
        self.turns = TurnMachine()
        self.input = InputBuffer(clock)
        self.playout = Playout()  # in seconds on the clock
        self.mitigation = Mitigation(self.cfg.mitigation)  # recent stage costs, and what a late turn gives up
        self.reports: list[TurnReport] = []
        self.barge_ins: list[BargeIn] = []
        self._trace: TurnTrace | None = None
        self._trace_first = 0  # the first voiced sample of the open trace's turn
        self._task: Response | None = None  # the answer to the user's turn
        self._spec: Response | None = None  # a speculative answer, until the endpoint adopts or drops it
        self._n_turns = 0
        self.file_offsets: list[float] = []  # filled by drivers that play files
        self.non_speech = 0  # "utterances" whose transcript had no words
        self._prepare = False  # idle work pending: prefill the next turn's context
        self._stop_ms: int | None = None  # an end-of-turn decision to hand to the endpointer after the piece of work
        self._idle_from = clock.now()  # the idle timeout counts from here (the last answer's end, or the last speech)
        self._overlap_init()  # speech over the answer, judged (voice.overlap)

    def _emit(self, event: LoopEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    # -- time ---------------------------------------------------------------------------------

    def audio_time(self, sample: int) -> float:
        """Clock time at which input sample ``sample`` (at ASR_RATE) was captured."""
        return self.input.audio_time(sample)

    @property
    def input_time(self) -> float:
        """Clock time of the end of the input fed so far."""
        return self.input.input_time

    @property
    def answering(self) -> bool:
        """An answer is being computed or played (its turn is not over)."""
        return self._task is not None

    @property
    def in_progress(self) -> bool:
        """An answer exists, even a speculative one started at a pause (engines cannot be swapped under it)."""
        return self._task is not None or self._spec is not None

    def set_engines(self, engines: Engines) -> None:
        """Swap the engines between turns (e.g. a new persona); the next turn's context is prefilled when idle."""
        if self._task is not None or self._spec is not None:
            raise RuntimeError("set_engines() while an answer is in progress")
        self.e = engines
        self._prepare = True

    def buffered_s(self) -> float:
        """Seconds of input the unanswered utterance holds so far (what a server's buffer limit caps)."""
        if not self.cfg.turn_detection:
            return self.input.uncommitted_s
        if self._trace is None or self._task is not None or self.vad.state is VadState.SILENCE:
            return 0.0
        start = self._trace.stamps.get("speech_start")
        return 0.0 if start is None else max(0.0, self.input_time - start)

    @property
    def speaking(self) -> bool:
        return self.turns.state is not TurnState.LISTENING

    # -- input --------------------------------------------------------------------------------

    def feed(self, chunk: AudioChunk) -> None:
        """Input audio; any rate, any length."""
        keep_from = None if self._trace is None else self._trace_first - ASR_RATE  # (a second before: any padding)
        pcm = self.input.append(chunk, keep_from=keep_from)
        self.vad.feed(pcm)
        self._vad_events()
        self._housekeeping()

    def _vad_events(self) -> None:
        for ev in self.vad.events():
            if self._vad_offset:  # the endpointer counts from its last restart
                ev = replace(ev, **{f.name: getattr(ev, f.name) + self._vad_offset for f in fields(ev) if f.name in _SAMPLE_FIELDS})
            self.on_vad(ev)

    def on_vad(self, ev: VadEvent) -> None:
        """React to one endpointer event (sample positions since the loop began).  ``feed`` hands over the endpointer's
        own events; a test or another detector may call it directly."""
        if not self.cfg.turn_detection:
            return
        now = self.clock.now()
        busy = self.turns.state is not TurnState.LISTENING or (self._task and not self._task.finished)
        if isinstance(ev, SpeechStarted) and busy and not self.cfg.barge_in:
            self._ignoring = True
        if self._ignoring:
            if isinstance(ev, SpeechStopped):
                self._ignoring = False
            return
        if self._overlap_event(ev, now):
            return
        match ev:
            case SpeechStarted():
                self._speech_started(ev, now, bool(busy))
            case EarlyPause():
                self._early_pause(ev, now)
            case Pause():
                self._pause(ev, now)
            case EarlyResume():
                if self._spec is not None:  # maybe the voice, maybe a flicker of the noise: the pause will tell
                    self._spec.park()
            case SpeechResumed():
                self._drop_spec()
            case SpeechStopped():
                self._speech_stopped(ev, now)

    def _speech_started(self, ev: SpeechStarted, now: float, busy: bool) -> None:
        self._idle_from = now
        if busy and self._overlap_opens(ev, now):  # over the answer: judged before it is stopped (voice.overlap)
            return
        self._emit(UserSpeechStarted(first_voiced_sample=ev.first_voiced_sample, barge_in=busy))  # before the answer is cut
        if busy:
            self._barge_in(ev, now)
        if self._trace is None:
            self._new_trace(ev.first_voiced_sample)
        self._trace.mark("speech_start", self.audio_time(ev.first_voiced_sample), overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STARTED)

    def _speech_stopped(self, ev: SpeechStopped, now: float) -> None:
        if self._trace is None:  # stopped without a start we saw (e.g. after a reset)
            return
        self._trace.mark("last_voiced", self.audio_time(ev.last_voiced_sample), overwrite=True)
        self._trace.mark("endpoint", max(now, self.audio_time(ev.sample)), overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STOPPED)
        self._emit(UserSpeechStopped(first_voiced_sample=ev.first_voiced_sample, last_voiced_sample=ev.last_voiced_sample,
                                     endpoint_sample=ev.sample))
        self.input.mark_committed()
        self._answer_turn(ev)

    # -- control (the server's client events) --------------------------------------------------

    def configure(self, config: LoopConfig) -> None:
        """New settings; a new endpointer config restarts the VAD (an utterance in progress is dropped)."""
        if config.endpointer != self.cfg.endpointer:
            if config.endpointer.rate != ASR_RATE:
                raise ValueError(f"the loop runs its endpointer at {ASR_RATE} Hz")
            self._restart_vad(config.endpointer)
        self.cfg = config

    def _restart_vad(self, ecfg: EndpointerConfig | None = None) -> None:
        self.vad = Endpointer(ecfg or self.cfg.endpointer)
        self._vad_offset = self.input.end_sample
        if self._overlap is not None:  # the speech over the answer is gone with the input: the answer goes on
            self._overlap_resumes(self._overlap, Verdict.NOISE, self.clock.now())
        self._ignoring = self._judged = False
        self._drop_spec()
        if self._task is None:
            self._trace = None

    def clear_input(self) -> None:
        """Forget the input not yet answered (``input_audio_buffer.clear``)."""
        self._restart_vad()
        self.input.mark_committed()

    def commit_input(self) -> bool:
        """End the user's turn now (manual turn detection): the input since the last commit is the
        utterance.  False when there is nothing to commit or an answer is still in progress."""
        if self._task is not None:
            return False
        span = self.input.take_uncommitted()
        if span is None:
            return False
        first, last = span
        self._drop_spec()
        self._restart_vad()
        now = self.clock.now()
        self._new_trace(first)
        self._trace.mark("speech_start", self.audio_time(first), overwrite=True)
        self._trace.mark("last_voiced", self.audio_time(last), overwrite=True)
        self._trace.mark("endpoint", max(now, self.audio_time(last)), overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STOPPED)
        self._emit(UserSpeechStopped(first_voiced_sample=first, last_voiced_sample=last, endpoint_sample=self.input.end_sample))
        self._task = self._start(first, last, speculative=False)
        self._task.end_of_turn = {"rule": "manual"}
        return True

    def respond_text(self, text: str | None, speak: bool | None = None) -> bool:
        """Answer a typed user message (``conversation.item.create`` + ``response.create``); the
        turn has no voice stages.  ``text`` None: no new user message, the LLM goes on from the
        conversation as it stands (after a tool's result); ``speak``: this answer's audio or text only (None:
        ``LoopConfig.speak``).  False while another answer is in progress."""
        if self._task is not None:
            return False
        self._drop_spec()
        self._new_trace(self.input.end_sample)  # a typed turn: no audio of its own
        self._trace.mark("endpoint", self.clock.now(), overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STOPPED)
        self._task = self._start_text(Kind.ANSWER if text is not None else Kind.CONTINUATION, text or "", speak)
        return True

    def cancel(self, reason: str = "client_cancelled") -> bool:
        """Stop the answer in progress (``response.cancel``), keeping what was heard."""
        if self._task is None or self._task.finished and not self.speaking:
            return False
        if not self._overlap_cancels(reason):  # (speech over the answer being judged: it is the next turn)
            self._interrupt(self.clock.now(), reason)
        return True

    def amend_reply(self, spoken: str) -> None:
        """The client says less of the last answer was heard (``conversation.item.truncate``)."""
        self.e.llm.amend_last(spoken)
        self._prepare = True

    def _new_trace(self, first_sample: int) -> None:
        """A new turn's trace; its audio starts at ``first_sample`` (later speech in the same turn comes after it)."""
        self._trace_first = first_sample
        self._n_turns += 1
        self._trace = TurnTrace(turn=self._n_turns, budget_ms=self.cfg.budget_ms)

    # -- work ---------------------------------------------------------------------------------

    def has_work(self) -> bool:
        now = self.clock.now()
        idle = self._idle_deadline()
        return (self._prepare_due() or self._overlap_wake() or any(r is not None and r.ready(now) for r in (self._task, self._spec))
                or idle is not None and now >= idle)

    def wake_at(self) -> float | None:
        """When a paced answer waiting for its simulated time may go on, or the idle timeout falls due (None: nothing
        waits)."""
        due = [r.due_s for r in (self._task, self._spec) if r is not None and not r.finished and r.due_s is not None]
        idle = self._idle_deadline()
        return min(due + ([] if idle is None else [idle]), default=None)

    def _idle_deadline(self) -> float | None:
        """When the user, silent since the last answer, is prompted (``LoopConfig.idle_timeout_ms``); None: not now."""
        if (self.cfg.idle_timeout_ms is None or not self.cfg.turn_detection or self._task is not None or self._spec is not None
                or self._trace is not None or self.vad.state is not VadState.SILENCE or self.turns.state is not TurnState.LISTENING):
            return None
        return max(self._idle_from, self.playout.cursor) + self.cfg.idle_timeout_ms / 1000

    def _idle_timeout(self) -> None:
        """Nobody spoke for the idle timeout: say so (``IdleTimeout``) and prompt the user with a set answer."""
        now = self.clock.now()
        end = self.input.end_sample
        start = max(0, end - int((now - max(self._idle_from, self.playout.cursor)) * ASR_RATE))
        self._emit(IdleTimeout(start_sample=start, end_sample=end))
        self._new_trace(end)
        self._trace.mark("endpoint", now, overwrite=True)
        self.turns.fire(TurnEvent.SPEECH_STOPPED)
        self._task = self._start_text(Kind.PROMPT, "")

    def _prepare_due(self) -> bool:
        return self._prepare and self.turns.state is TurnState.LISTENING and self.vad.state is VadState.SILENCE

    def step(self) -> bool:
        """Advance the current response (the confirmed one first) by one piece of work; when
        idle, prefill the context the next turn will start with.  Either way, look at the time
        (an acknowledgement due, an answer played out)."""
        now = self.clock.now()
        if self._overlap_step(now):  # speech over the answer waits for its verdict first
            self._housekeeping()
            return True
        for r in (self._task, self._spec):
            if r is not None and r.ready(now):
                try:
                    with deadline(self._due(r, now)):
                        next(r.gen)
                except StopIteration:
                    r.finish()
                self._apply_stop()
                self._housekeeping()
                return True
        idle = self._idle_deadline()
        if idle is not None and now >= idle:
            self._idle_timeout()
            return True
        if self._prepare_due():
            self._prepare = False
            # nobody waits for it: after the other sessions' turns, but not starved by them (this session's thread, and
            # so its input, waits for it)
            with self.clock.working(), deadline(time.monotonic() + PREPARE_SLACK_S):
                self.e.llm.prepare()
            return True
        self._housekeeping()
        return False

    # -- turn end, barge-in, acknowledgement ---------------------------------------------------

    def _housekeeping(self) -> None:
        r, tr = self._task, self._trace
        if r is None or tr is None:
            return
        now = self.clock.now()
        if (self.cfg.ack or "ack" in r.steps) and r.speak and not r.answered and "ack" not in tr.mitigations and self.e.ack_pcm is not None:
            lv = tr.stamps.get("last_voiced")
            if lv is not None and now >= lv + self.cfg.ack_after_ms / 1000:
                t = self.playout.schedule(now, len(self.e.ack_pcm) / self.e.tts.sample_rate)
                self.sink.play(t, self.e.ack_pcm)
                tr.mark("first_audio", t)
                tr.mitigate("ack")
        if r.finished and now >= self.playout.cursor and self._overlap is None:
            if not r.answered:
                self.turns.fire(TurnEvent.NO_ANSWER)
            else:
                self.turns.fire(TurnEvent.ANSWER_DONE)
            self._finish_turn(r, spoken=" ".join(r.phrases), cut_at=None)

    def _finish_turn(self, r: Response, spoken: str, cut_at: float | None, reason: str | None = None) -> None:
        self._idle_from = max(self.clock.now(), self.playout.cursor)
        transcript = r.transcript or ""  # (none: stopped before its transcription)
        tr = self._trace
        for k, v in r.stamps.items():
            tr.mark(k, v)
        tr.transcript = transcript
        tr.reply = spoken
        tr.end_of_turn = self._end_of_turn_info(r, tr)
        tr.forecast_ms = r.forecast_ms
        tr.overlaps = tuple(self._overlaps)
        self._overlap_reset()
        # the steps that changed the turn, in their fixed order after the others (speculative, cancelled)
        taken = set(r.used) | set(tr.mitigations)
        tr.mitigations = [m for m in tr.mitigations if m not in MITIGATION_ORDER] + [m for m in MITIGATION_ORDER if m in taken]
        tr.mark("done", cut_at if cut_at is not None else max(self.clock.now(), self.playout.cursor))
        self.playout.next_answer()
        self._task = None
        self._trace = None
        if r.kind is Kind.TRANSCRIBE and has_words(transcript):  # the answer comes when asked for (``respond_text``)
            self._emit(TurnEnded(transcript=transcript, spoken="", reason="transcribed", report=None))
            return
        if not (has_words(transcript) or not r.user_turn):  # a noise, a breath, a click: not a user turn
            self.non_speech += 1
            self._emit(TurnEnded(transcript=transcript, spoken="", reason=reason, report=None))
            return
        self.e.llm.commit(transcript if r.user_turn else None, spoken)
        if r.error is not None and reason is None:
            reason = "failed"
        self._prepare = True
        project = self.e.project
        report = tr.report(simulated=project(dict(tr.stamps), dict(r.sim), tr.budget_ms) if project and r.sim else None)
        if "last_voiced" in tr.stamps:  # typed turns have no voice-to-voice: kept out of the voice figures
            self.reports.append(report)
            self.mitigation.observe(report)
        self._emit(TurnEnded(transcript=transcript, spoken=spoken, reason=reason, report=report, error=r.error,
                             called=r.called))
        if self.on_report:
            self.on_report(report)

    def _barge_in(self, ev: SpeechStarted, now: float) -> None:
        """The user speaks over the answer: stop the audio, keep what was heard."""
        self._barge_in_record(ev.first_voiced_sample, ev.sample, now)
        self._interrupt(now, "turn_detected")

    def _barge_in_record(self, first_voiced: int, detected: int, stopped_s: float) -> None:
        self.barge_ins.append(BargeIn(speech_s=self.audio_time(first_voiced), detected_s=self.audio_time(detected), stopped_s=stopped_s))

    def _interrupt(self, now: float, reason: str) -> None:
        r = self._task
        self.sink.clear_after(now)
        self.playout.stop(now)
        heard = self.playout.heard(now) if r is None or r.speak else " ".join(r.phrases[:r.announced])  # (text: handed out)
        if r is not None:
            r.close()
        self._drop_spec()
        if self._trace is not None and r is not None:
            self._trace.barge_in = reason == "turn_detected"
            if reason != "turn_detected":
                self._trace.mitigate("cancelled")
            self.turns.fire(TurnEvent.BARGE_IN)
            self._finish_turn(r, spoken=heard, cut_at=now, reason=reason)
        elif self.turns.can(TurnEvent.BARGE_IN):
            self.turns.fire(TurnEvent.BARGE_IN)

    def close(self) -> None:
        """The loop is done for good (its session closed): the answers in progress are closed, and the loop lets go
        of its sink and callbacks, so nothing it holds points back at its owner (no cycle waits for the garbage
        collector) and the owner can release the engines."""
        for r in (self._task, self._spec):
            if r is not None:
                r.close()
        self._task = self._spec = None
        self._trace = None
        self.sink = _NO_SINK
        self.on_event = self.on_report = self.on_partial = None

    def finish(self, max_s: float = 30.0) -> None:
        """Input is over: complete the pending work and let the answer play out."""
        self.drain(max_s)
        if self._trace is not None and self._task is None:  # speech never stopped: close it
            self._trace = None

    def drain(self, max_s: float = 30.0, chunk_ms: int = 20) -> None:
        """Feed silence until the agent is done answering (or ``max_s`` of input passed)."""
        n = ASR_RATE * chunk_ms // 1000
        silence = np.zeros(n, np.int16)
        end = self.input_time + max_s
        while (self.has_work() or self.speaking or self._task is not None or self.vad.state is not VadState.SILENCE) \
                and self.input_time < end:
            run_until(self, self.input_time + n / ASR_RATE)
            self.feed(AudioChunk(silence, ASR_RATE, 0))


class _NoSink:
    """A closed loop's sink: nothing plays."""

    def play(self, t: float, pcm: np.ndarray) -> None:
        pass

    def clear_after(self, t: float) -> None:
        pass


_NO_SINK = _NoSink()

