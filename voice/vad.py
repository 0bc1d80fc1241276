"""The endpointer: PCM16 in, speech_started / pause / speech_resumed / speech_stopped events out.

Owns the turn boundaries of the user's speech, on the audio clock (the sample index). It is a
sans-I/O core: ``feed(pcm)`` takes samples in chunks of any length, ``events()`` drains what they
produced. No threads, sleeps, clocks or I/O; the adapters own the timers and keep the audio (the
events carry sample indices into it).

How a decision is made:

1. ``webrtcvad`` classifies each fixed frame (10/20/30 ms at 8/16/32/48 kHz).
2. WebRTC's VAD stretches every speech burst by a built-in hangover ("overhang"): ``oh2`` frames
   after a run of more than 6 speech frames, ``oh1`` after a shorter one (``kOverHangMax1/2`` in
   vad_core.c; 90-100 / 60 ms in modes 2-3, 140-150 / 80-90 ms in modes 0-1). Left in, it makes
   every utterance end ~90 ms late, which delays the endpoint by as much, makes
   ``voice_to_voice_ms`` (measured from the last voiced sample) look 90 ms better than it is,
   shortens every pause by 90 ms, and turns a one-frame click into a 90 ms "syllable". The
   endpointer trims it off each voiced run: ``oh1`` frames from a run too short to have had
   ``oh2`` (exact), ``oh2`` from a longer one (exact, unless a hidden gap let the run end with a
   short burst: then it trims up to ``oh2 - oh1`` frames, 30-40 ms, of voice, erring towards
   reporting more latency, never less). A frame's trimmed decision is known ``oh2`` frames
   later, or at once when the next frame is unvoiced: trimming delays the onset by ``oh2``
   frames and the endpoint not at all. ``trim_overhang=False`` turns it off.
3. A state machine smooths the eroded frames into events (one table, ``TRANSITIONS``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import webrtcvad

from voice.protocols import ASR_RATE
from voice.turns import IllegalTransition

#: The rates and frame lengths webrtcvad accepts.
VAD_RATES = (8000, 16000, 32000, 48000)
VAD_FRAME_MS = (10, 20, 30)

#: WebRTC's hangover in frames for 10/20/30 ms frames, by mode, as (after a run of at most
#: ``WEBRTC_MAX_SPEECH_FRAMES`` speech frames, after a longer one): ``kOverHangMax1/2{Q,LBR,AGG,VAG}``
#: and ``kMaxSpeechFrames`` in webrtc common_audio/vad/vad_core.c.
WEBRTC_OVERHANG = {
    0: ((8, 4, 3), (14, 7, 5)),
    1: ((8, 4, 3), (14, 7, 5)),
    2: ((6, 3, 2), (9, 5, 3)),
    3: ((6, 3, 2), (9, 5, 3)),
}
WEBRTC_MAX_SPEECH_FRAMES = 6
#: The band in which a word's unvoiced ending is looked for (``EndpointerConfig.tail_db``).
TAIL_BAND_HZ = 2500


@dataclass(frozen=True, slots=True)
class EndpointerConfig:
    """Endpointing knobs; durations in ms, rounded up to whole frames.

    Defaults and why (figures from espeak-ng sentences, clean and in white noise, at 16 kHz):
    - ``frame_ms=30``, ``aggressiveness=2``: no false start in 9 runs of pure white noise (mode
      2 at 10 ms frames: 1; modes 0-1: 3-5). 10 ms frames end a turn ~20 ms sooner (the endpoint
      is quantized to the frame) and mode 3 ~10 ms sooner, but mode 3 lost a lone "Yes".
    - ``start_ms=90`` at ``start_ratio=0.8``: about a syllable. Clicks and 5 ms bursts (one or
      two frames once the hangover is trimmed) never fill it. The start is reported about
      ``start_ms`` + the hangover (90 ms) after the voice begins, with ``first_voiced_sample``
      backdated; its timing only matters to barge-in.
    - ``pause_ms=150``: under a spoken comma (200-250 ms) so speculative ASR/LLM start there;
      a hand-made 200 ms gap gave a pause in 174 of 180 mixes (voices, gains, 25 dB noise).
      Stop consonants' closures sometimes give one too; a false pause only costs discarded work.
    - ``stop_ms=400``: longer than a comma or a hesitation; every ms of it is spent from the
      500 ms budget, which is why the work starts at the pause.
    - ``padding_ms=200``: context for the ASR around the voiced frames: soft onsets, and final
      fricatives, which webrtcvad (0-4 kHz band) misses ("lights" ends ~190 ms early).
    - ``trim_overhang=True``: see the module docstring.
    """

    rate: int = ASR_RATE
    frame_ms: int = 30
    aggressiveness: int = 2
    start_ms: int = 90
    start_ratio: float = 0.8
    pause_ms: int = 150
    stop_ms: int = 400
    padding_ms: int = 200
    trim_overhang: bool = True
    #: Energy veto on top of webrtcvad: a frame counts as voiced only if it is this many dB above
    #: the noise floor (None = off).  webrtcvad alone calls steady pink noise at ~27 dB SNR
    #: speech, worst right after silence.  The floor is the quietest frame of the last
    #: ``floor_window_ms`` (minimum statistics): speech always dips between words, noise does not.
    noise_gate_db: float | None = 9.0
    floor_window_ms: int = 1500
    #: Word endings webrtcvad misses (final fricatives and stop bursts: it listens to 0-4 kHz): before a pause is
    #: reached, frames whose power above ``TAIL_BAND_HZ`` is this many dB above that band's floor still count as
    #: the utterance's voice (not as an onset), for at most ``tail_ms`` after webrtcvad's last voiced frame
    #: (None = off).  Without it the last voiced sample of
    #: "...cost?" or "...address?" was found 190-300 ms early, and by how much depended on the noise: a faint hiss
    #: moved the endpoint by 150 ms against silence, and the same speech in -50 dBFS noise by 210 ms.
    tail_db: float | None = 10.0
    tail_ms: int = 300
    #: ... and at least this loud in that band (dBFS): a fan's or a hiss's own flicker is not a word's end, and the
    #: faintest release bursts (below -55 dBFS) are left out in silence as they must be in noise, so the endpoint
    #: does not move with the noise level.
    tail_min_dbfs: float = -55.0
    #: A hint before the pause (None = off): after this much energy silence (every frame at most ``noise_gate_db``
    #: over the floor and not a word's unvoiced ending) inside speech, ``EarlyPause``.  webrtcvad's own decision
    #: only shows the silence once its hangover has run out (90 ms in mode 2 with 30 ms frames), so a ``Pause``
    #: comes ~120 ms after the last voiced sample whatever ``pause_ms`` says; the hint lets speculative work
    #: start ~60 ms sooner.  Needs the noise gate.
    early_pause_ms: int | None = None

    def __post_init__(self) -> None:
        if self.rate not in VAD_RATES:
            raise ValueError(f"rate must be one of {VAD_RATES} Hz (webrtcvad), got {self.rate}")
        if self.frame_ms not in VAD_FRAME_MS:
            raise ValueError(f"frame_ms must be one of {VAD_FRAME_MS} (webrtcvad), got {self.frame_ms}")
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"aggressiveness must be 0, 1, 2 or 3, got {self.aggressiveness}")
        if not 0.0 < self.start_ratio <= 1.0:
            raise ValueError(f"start_ratio must be in (0, 1], got {self.start_ratio}")
        for name in ("start_ms", "pause_ms", "stop_ms"):
            if getattr(self, name) < self.frame_ms:
                raise ValueError(f"{name} must be at least frame_ms ({self.frame_ms}), got {getattr(self, name)}")
        if self.pause_ms >= self.stop_ms:
            raise ValueError(f"pause_ms ({self.pause_ms}) must be shorter than stop_ms ({self.stop_ms})")
        if self.padding_ms < 0:
            raise ValueError(f"padding_ms must be >= 0, got {self.padding_ms}")
        if self.noise_gate_db is not None and self.noise_gate_db < 0:
            raise ValueError(f"noise_gate_db must be >= 0 or None, got {self.noise_gate_db}")
        if self.early_pause_ms is not None and (self.early_pause_ms <= 0 or self.noise_gate_db is None):
            raise ValueError(f"early_pause_ms must be > 0 and needs noise_gate_db, got {self.early_pause_ms}")
        if self.tail_db is not None and (self.tail_db < 0 or self.tail_ms < 0):
            raise ValueError(f"tail_db and tail_ms must be >= 0 (tail_db None = off), got {self.tail_db}, {self.tail_ms}")

    @property
    def frame_samples(self) -> int:
        return self.rate * self.frame_ms // 1000

    def frames(self, ms: int) -> int:
        """``ms`` as a whole number of frames, rounded up (a threshold is never shortened)."""
        return math.ceil(ms / self.frame_ms)

    @property
    def overhang_frames(self) -> tuple[int, int]:
        """webrtcvad's hangover (after a short run, after a long one) in frames; (0, 0) if not trimmed."""
        if not self.trim_overhang:
            return (0, 0)
        short, long = WEBRTC_OVERHANG[self.aggressiveness]
        k = VAD_FRAME_MS.index(self.frame_ms)
        return (short[k], long[k])


# Events. ``sample`` is the decision point: the number of samples fed when the event became known.
# Voiced bounds are inclusive sample indices; ``[start_pad, end_pad)`` is the slice of the caller's
# audio to transcribe (voiced span +- padding_ms, clipped to [0, sample)).


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """Voice for ``start_ms`` (``start_ratio`` of its frames): a turn begins, or a barge-in.
    ``first_voiced_sample`` starts the group of voiced frames (gaps under ``pause_ms``) that led
    to it, so a short first syllable is not cut off."""

    sample: int
    first_voiced_sample: int


@dataclass(frozen=True, slots=True)
class _Span:
    """The fields of the events that bound an utterance (not an event itself)."""

    sample: int
    first_voiced_sample: int
    last_voiced_sample: int
    start_pad: int
    end_pad: int


@dataclass(frozen=True, slots=True)
class Pause(_Span):
    """Silence inside speech for ``pause_ms``: the cue for speculative work. One per gap."""


@dataclass(frozen=True, slots=True)
class SpeechResumed:
    """Voice came back after a ``Pause`` and before the stop: discard speculative work."""

    sample: int


@dataclass(frozen=True, slots=True)
class SpeechStopped(_Span):
    """Silence for ``stop_ms``: the end of the turn."""


@dataclass(frozen=True, slots=True)
class EarlyPause(_Span):
    """A hint, not a state: ``early_pause_ms`` of energy silence inside speech, before webrtcvad shows it.
    ``last_voiced_sample`` ends the last frame that stood out of the noise (the settled last voiced sample
    of a ``Pause`` that follows is never later).  At most one per gap; ``EarlyResume`` withdraws it."""


@dataclass(frozen=True, slots=True)
class EarlyResume:
    """Frames stood out of the noise again (``EARLY_RESUME_FRAMES`` in a row) after an ``EarlyPause``, before any
    ``Pause``: the hint is void."""

    sample: int


VadEvent = SpeechStarted | Pause | SpeechResumed | SpeechStopped | EarlyPause | EarlyResume
#: Events that leave the state as it is.
HINTS = (EarlyPause, EarlyResume)
#: Frames in a row that stand out of the noise before an ``EarlyPause`` is withdrawn: one frame of a noise's
#: flicker is not the voice coming back (in -40 dBFS noise single frames withdrew the hint, and the ``Pause``
#: that followed at the same last voiced sample had to start the work again).
EARLY_RESUME_FRAMES = 2


class State(IntEnum):
    SILENCE = 0
    SPEECH = 1
    PAUSED = 2


#: The endpointer's only state machine. ``SPEECH`` has no ``SpeechStopped`` entry: ``pause_ms <
#: stop_ms`` (validated), so every stop comes after a pause.
TRANSITIONS: dict[State, dict[type, State]] = {
    State.SILENCE: {SpeechStarted: State.SPEECH},
    State.SPEECH: {Pause: State.PAUSED},
    State.PAUSED: {SpeechResumed: State.SPEECH, SpeechStopped: State.SILENCE},
}


def next_state(state: State, event: VadEvent) -> State:
    """The state after ``event`` in ``state``; raises ``IllegalTransition`` if the table has no entry."""
    try:
        return TRANSITIONS[state][type(event)]
    except KeyError:
        raise IllegalTransition(f"{type(event).__name__} is not allowed in state {state.name}") from None


class Endpointer:
    """``feed(pcm)`` int16 mono at ``config.rate`` in chunks of any length; ``events()`` drains."""

    def __init__(self, config: EndpointerConfig | None = None) -> None:
        self.config = config or EndpointerConfig()
        c = self.config
        self._frame = c.frame_samples
        self._oh_short, self._oh_long = c.overhang_frames
        self._long_run = WEBRTC_MAX_SPEECH_FRAMES + 1 + self._oh_long  # shortest run that may end in oh_long
        self._start_frames = c.frames(c.start_ms)
        self._start_need = math.ceil(c.start_ratio * self._start_frames - 1e-9)
        self._pause_frames = c.frames(c.pause_ms)
        self._stop_frames = c.frames(c.stop_ms)
        self._stop_now = self._stop_frames  # the stop silence for the current pause (``set_stop_ms``)
        self._pad = c.rate * c.padding_ms // 1000
        self._tail_frames = c.frames(c.tail_ms) if c.tail_db is not None else 0
        self._early_frames = c.frames(c.early_pause_ms) if c.early_pause_ms is not None else 0
        self.reset()

    def reset(self) -> None:
        """Back to a fresh endpointer: sample indices restart at 0, undrained events are dropped."""
        self._vad = webrtcvad.Vad(self.config.aggressiveness)  # stateful (noise model, overhang)
        self._tail = np.zeros(0, dtype=np.int16)  # samples of the next, partial frame
        self._frames_in = 0  # frames classified so far
        self._run = 0  # length of the current run of webrtcvad-voiced frames
        self._window: deque[bool] = deque([False] * self._start_frames, maxlen=self._start_frames)
        self._state = State.SILENCE
        self._first_voiced = 0  # frame indices of the current utterance (or group of voiced frames)
        self._last_voiced = -self._stop_frames
        self._events: list[VadEvent] = []
        self._stop_now = self._stop_frames
        self._settled_last = -1  # the last frame whose trimmed decision is known
        self._energy: deque[float] = deque(maxlen=max(1, self.config.frames(self.config.floor_window_ms)))
        self._high: deque[float] = deque(maxlen=self._energy.maxlen)  # the same, above TAIL_BAND_HZ
        self._loud: deque[bool] = deque(maxlen=self._oh_long + 2)  # energy verdicts of frames not yet settled
        self._tailing: deque[bool] = deque(maxlen=self._oh_long + 2)  # ... and whether each may continue a word's end
        self._last_vad_voiced = -self._stop_frames  # the last frame webrtcvad itself called voiced (trimmed)
        self._last_audible = -1  # the last frame that stood out of the noise (or was a word's unvoiced ending)
        self._early = False  # an EarlyPause stands for the current gap
        self._audible_run = 0  # consecutive frames that stood out of the noise, up to the newest

    @property
    def state(self) -> State:
        return self._state

    def feed(self, pcm: np.ndarray) -> None:
        pcm = np.asarray(pcm)
        if pcm.dtype != np.int16 or pcm.ndim != 1:
            raise ValueError(f"feed() takes 1-D int16 PCM, got {pcm.dtype} with shape {pcm.shape}")
        buf = np.concatenate((self._tail, pcm)) if self._tail.size else pcm
        whole = buf.size - buf.size % self._frame
        data = buf[:whole].tobytes()
        step = self._frame * 2
        frames = buf[:whole].reshape(-1, self._frame).astype(np.float32)
        energy_db = 10 * np.log10(np.mean(frames * frames, axis=1) / (32768.0 * 32768.0) + 1e-12)
        high_db = self._high_band_db(frames)
        for i, k in enumerate(range(0, len(data), step)):
            self._gate(float(energy_db[i]), float(high_db[i]))
            self._classified(self._vad.is_speech(data[k : k + step], self.config.rate))
            if self._early_frames:
                self._early_hint()
        self._tail = buf[whole:].copy()

    def _high_band_db(self, frames: np.ndarray) -> np.ndarray:
        """Each frame's power above ``TAIL_BAND_HZ`` in dBFS (where fricatives are, and hum, fans and most room
        noise are not); frame by frame, so chunking changes nothing."""
        if not len(frames):
            return np.zeros(0)
        spec = np.fft.rfft(frames, axis=1)
        lo = int(TAIL_BAND_HZ * frames.shape[1] / self.config.rate)
        power = (np.abs(spec[:, lo:]) ** 2).sum(axis=1) * 2 / frames.shape[1] ** 2
        return 10 * np.log10(power / (32768.0 * 32768.0) + 1e-12)

    def _gate(self, energy_db: float, high_db: float) -> None:
        """Track the noise floors and record whether this frame stands out of them."""
        self._energy.append(energy_db)
        self._high.append(high_db)
        gate, tail = self.config.noise_gate_db, self.config.tail_db
        self._loud.append(gate is None or energy_db > min(self._energy) + gate)
        self._tailing.append(tail is not None and high_db > max(min(self._high) + tail, self.config.tail_min_dbfs))

    def _early_hint(self) -> None:
        """``EarlyPause`` / ``EarlyResume`` from the newest frame's energy verdict (after its webrtcvad decision)."""
        t = self._frames_in - 1
        audible = self._loud[-1] or self._tailing[-1]
        if audible:
            self._last_audible = t
        self._audible_run = self._audible_run + 1 if audible else 0
        if self._state is not State.SPEECH:
            self._early = False
            return
        if self._early and self._audible_run >= EARLY_RESUME_FRAMES:
            self._early = False
            self._emit(EarlyResume(sample=self._frames_in * self._frame))
        elif not audible and not self._early and t - self._last_audible >= self._early_frames:
            self._early = True
            sample = self._frames_in * self._frame
            self._emit(EarlyPause(sample=sample, **self._bounds(sample, max(self._last_voiced, self._last_audible))))

    def set_stop_ms(self, ms: int | None) -> None:
        """The silence that ends the turn at the current pause: the end-of-turn policy's decision
        (``voice.turn_end``); None restores ``config.stop_ms``.  It holds until the voice resumes or
        the turn stops.  Set while paused and already exceeded, the stop is emitted now (at the
        samples fed so far); set while not paused, it is ignored."""
        if self._state is not State.PAUSED:
            return
        self._stop_now = self._stop_frames if ms is None else self.config.frames(max(1, int(ms)))
        if self._settled_last - self._last_voiced >= self._stop_now and not any(self._window):
            sample = self._frames_in * self._frame
            self._emit(SpeechStopped(sample=sample, **self._bounds(sample)))

    @property
    def silence_ms(self) -> float:
        """Silence since the last voiced frame, as far as it is settled (ms; 0 while voiced)."""
        if self._state is State.SILENCE:
            return 0.0
        return max(0, self._settled_last - self._last_voiced) * self.config.frame_ms

    def events(self) -> list[VadEvent]:
        out, self._events = self._events, []
        return out

    def _classified(self, voiced: bool) -> None:
        """webrtcvad's decision for frame ``t``: trim the hangover, pass on the settled frames."""
        t = self._frames_in
        self._frames_in += 1
        decided_at = self._frames_in * self._frame
        if voiced:
            self._run += 1
            if self._run > self._oh_long:  # frames t-oh_long..t voiced: t-oh_long is voice
                self._settled(t - self._oh_long, True, decided_at)
        else:  # the run (if any) ended at t-1 with its hangover: settle its unsettled frames
            trim = self._oh_long if self._run >= self._long_run else self._oh_short
            for j in range(t - min(self._run, self._oh_long), t):
                self._settled(j, j < t - trim, decided_at)
            self._settled(t, False, decided_at)
            self._run = 0

    def _settled(self, j: int, voiced: bool, sample: int) -> None:
        """Trimmed decision for frame ``j``, known at ``sample``: drive the state machine."""
        self._settled_last = j
        back = self._frames_in - 1 - j  # frame j's energy verdict, counted from the newest
        voiced = voiced and (back >= len(self._loud) or self._loud[-1 - back])
        if voiced:
            self._last_vad_voiced = j
        elif (self._state is State.SPEECH and j - self._last_vad_voiced <= self._tail_frames
              and back < len(self._tailing) and self._tailing[-1 - back]):
            self._last_voiced = j  # a word's unvoiced ending: the utterance goes on (not an onset: the window is untouched)
            self._window.append(False)
            return
        self._window.append(voiced)
        onset = voiced and sum(self._window) >= self._start_need
        if self._state is State.SILENCE:
            if voiced:  # the utterance starts with the group of voiced frames that leads to the onset
                if j - self._last_voiced > self._pause_frames:
                    self._first_voiced = j
                self._last_voiced = j
            if onset:
                in_window = j - self._start_frames + 1 + self._window.index(True)
                self._first_voiced = min(self._first_voiced, in_window)
                self._emit(SpeechStarted(sample=sample, first_voiced_sample=self._first_voiced * self._frame))
        elif self._state is State.SPEECH:
            if voiced:
                self._last_voiced = j
            elif j - self._last_voiced >= self._pause_frames:
                self._emit(Pause(sample=sample, **self._bounds(sample)))
        elif onset:  # PAUSED, and the voice is back (as sure as for a start; a click is not)
            self._last_voiced = j
            self._emit(SpeechResumed(sample=sample))
        elif j - self._last_voiced >= self._stop_now and not any(self._window):
            # (a voiced frame in the window may be the voice coming back: wait for it to settle)
            self._emit(SpeechStopped(sample=sample, **self._bounds(sample)))

    def _bounds(self, sample: int, last_frame: int | None = None) -> dict[str, int]:
        first = self._first_voiced * self._frame
        last = ((self._last_voiced if last_frame is None else last_frame) + 1) * self._frame - 1
        return dict(
            first_voiced_sample=first,
            last_voiced_sample=last,
            start_pad=max(0, first - self._pad),
            end_pad=min(sample, last + 1 + self._pad),
        )

    def _emit(self, event: VadEvent) -> None:
        if isinstance(event, HINTS):
            self._events.append(event)
            return
        self._state = next_state(self._state, event)
        if not isinstance(event, Pause):  # a stop decided at one pause holds for that pause only
            self._stop_now = self._stop_frames
        self._events.append(event)
