"""The voice loop's input: audio at ``ASR_RATE`` addressed by its position in the stream, and the clock time of each sample.

``append(chunk)`` takes a chunk at any rate (one streaming resampler per input rate) and stores it at ``ASR_RATE``;
``utterance(first, last, padding_ms)`` cuts a turn's audio out again.  Memory stays bounded: the caller says from which
sample a turn in progress needs the audio (``keep_from``), and when the buffer is full only the last ``keep_s`` seconds
and what that turn needs are kept (positions stay those of the whole stream).  (Before, a buffer that filled up while any
turn was open doubled instead: in a 4-session soak, sessions that talk and listen in turn grew theirs to 256 s, 8 MB.)

Time: sample 0 is clock time 0 on a virtual clock.  Live input (``clock.realtime``) anchors sample 0 at the arrival of the
first chunk, and input that arrives faster than real time (a client sending a file at once) is re-anchored so that it ends
at its arrival: it cannot have been captured in the future.  ``audio_time`` adds the current resampler's filter delay back.

Manual turns (no turn detection): ``commit_sample`` is where the next committed utterance starts.
"""

from __future__ import annotations

import numpy as np

from .audio import AudioChunk, Resampler, to_float
from .protocols import ASR_RATE, Clock

#: input audio kept once no turn needs more (a turn's utterance and its padding, manual turns' uncommitted input: the
#: server caps both at --max-input-s, 30 s by default); older audio is dropped when the buffer would grow
KEEP_AUDIO_S = 40


class InputBuffer:
    def __init__(self, clock: Clock, keep_s: int = KEEP_AUDIO_S):
        self.clock = clock
        self.keep_s = keep_s
        self._resamplers: dict[int, Resampler] = {}
        self._audio = np.zeros(ASR_RATE * 8, np.int16)  # input from self.base_sample on, grown by doubling
        self.base_sample = 0  # the oldest sample still held
        self.end_sample = 0  # samples at ASR_RATE fed so far
        self.lag_samples = 0  # samples the latest input's resampler still owes
        self.origin_s: float | None = None  # clock time of sample 0 (None until the first chunk)
        self.commit_sample = 0  # manual turns: the input from here on is the next utterance

    # -- time ----------------------------------------------------------------------------------

    def audio_time(self, sample: int) -> float:
        """Clock time at which input sample ``sample`` was captured (the resampler's delay added back)."""
        return (self.origin_s or 0.0) + (sample + self.lag_samples) / ASR_RATE

    @property
    def input_time(self) -> float:
        """Clock time of the end of the input so far."""
        return self.audio_time(self.end_sample)

    # -- audio ---------------------------------------------------------------------------------

    def append(self, chunk: AudioChunk, keep_from: int | None) -> np.ndarray:
        """Store ``chunk`` (any rate) and return it at ``ASR_RATE``; ``keep_from``: the first sample a turn in progress
        may still need (None: no turn needs any), kept with the last ``keep_s`` seconds when room is needed."""
        clock = self.clock
        if self.origin_s is None:
            self.origin_s = clock.now() - len(chunk.pcm) / chunk.rate if clock.realtime else 0.0
        rs = self._resamplers.get(chunk.rate)
        if rs is None:
            rs = self._resamplers[chunk.rate] = Resampler(chunk.rate, ASR_RATE)
        pcm = rs(chunk.pcm)
        self.lag_samples = rs.lag
        self._store(pcm, keep_from)
        if clock.realtime and self.input_time > clock.now():
            self.origin_s -= self.input_time - clock.now()
        return pcm

    def _store(self, pcm: np.ndarray, keep_from: int | None) -> None:
        used = self.end_sample - self.base_sample
        if used + len(pcm) > len(self._audio):
            oldest = self.end_sample - self.keep_s * ASR_RATE
            if keep_from is not None:  # a turn in progress keeps all its audio, however long
                oldest = min(oldest, keep_from)
            drop = oldest - self.base_sample
            if drop > 0:
                self._audio[:used - drop] = self._audio[drop:used]
                self.base_sample += drop
                used -= drop
            if used + len(pcm) > len(self._audio):
                grown = np.zeros(max(2 * len(self._audio), used + len(pcm)), np.int16)
                grown[:used] = self._audio[:used]
                self._audio = grown
        self._audio[used:used + len(pcm)] = pcm
        self.end_sample += len(pcm)

    @property
    def capacity_samples(self) -> int:
        """Samples the buffer has room for (what bounds its memory)."""
        return len(self._audio)

    def utterance(self, first: int, last: int, padding_ms: int) -> np.ndarray:
        """The held samples from ``first - pad`` up to (not including) ``last + pad``, ``pad`` being ``padding_ms``,
        as float32 in [-1, 1).  (So without padding ``last`` itself is left out: kept as the loop always cut it.)"""
        pad = padding_ms * ASR_RATE // 1000
        a = max(self.base_sample, first - pad) - self.base_sample
        b = min(self.end_sample, last + pad) - self.base_sample
        return to_float(self._audio[a:b])

    # -- manual turns ----------------------------------------------------------------------------

    @property
    def uncommitted_s(self) -> float:
        """Seconds of input since the last commit."""
        return (self.end_sample - self.commit_sample) / ASR_RATE

    def take_uncommitted(self) -> tuple[int, int] | None:
        """The input since the last commit as (first, last) sample, now committed; None when there is none."""
        if self.end_sample <= self.commit_sample:
            return None
        first, last = self.commit_sample, self.end_sample - 1
        self.commit_sample = self.end_sample
        return first, last

    def mark_committed(self) -> None:
        """The input so far is used up (an automatic turn ended, or it was cleared): the next commit starts after it."""
        self.commit_sample = self.end_sample
