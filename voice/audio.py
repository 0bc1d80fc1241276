"""Audio plumbing: WAV input at any rate and channel count, resampling, PCM conversions,
and the sources/sinks the voice loop reads from and writes to.

PCM travels as ``int16`` mono numpy arrays; a chunk's position in its stream is its
first sample's index (``AudioChunk.start``), so time is the sample index over the rate.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np


class AudioError(Exception):
    """An audio file or device that cannot be used, with the reason in one line."""


@dataclass(frozen=True, slots=True)
class AudioChunk:
    pcm: np.ndarray  # int16 mono
    rate: int
    start: int  # index of the first sample in its stream

    @property
    def end(self) -> int:
        return self.start + len(self.pcm)


def to_float(pcm: np.ndarray) -> np.ndarray:
    """int16 -> float32 in [-1, 1)."""
    return pcm.astype(np.float32) / 32768.0


def to_pcm16(x: np.ndarray) -> np.ndarray:
    """float -> int16 with clipping; int16 passes through."""
    if x.dtype == np.int16:
        return x
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Polyphase resampling of a mono signal (float or int16 in, same kind out)."""
    if src == dst or len(x) == 0:
        return x
    frac = Fraction(dst, src)
    from scipy.signal import resample_poly

    y = resample_poly(x.astype(np.float32), frac.numerator, frac.denominator)
    return to_pcm16(y / 32768.0) if x.dtype == np.int16 else y.astype(np.float32)


def read_wav(path) -> tuple[np.ndarray, int]:
    """A WAV (or any soundfile format) as int16 mono at its own rate; channels are averaged."""
    import soundfile as sf

    path = Path(path)
    if not path.exists():
        raise AudioError(f"audio file not found: {path}")
    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as exc:
        raise AudioError(f"cannot read audio {path.name}: {exc}") from None
    if data.shape[0] == 0:
        raise AudioError(f"audio file {path.name} has no samples")
    if not 4000 <= rate <= 192000:
        raise AudioError(f"audio file {path.name} has an unusable sample rate {rate} Hz")
    finite = np.isfinite(data)
    if not finite.all():
        bad = int(np.argmin(finite.all(axis=1)))
        raise AudioError(f"audio file {path.name} holds NaN or infinite samples (first at {bad / rate:.3f} s); "
                         "a float WAV's samples must be finite")
    return to_pcm16(data.mean(axis=1)), int(rate)


def write_wav(path, pcm: np.ndarray, rate: int) -> None:
    import soundfile as sf

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), to_pcm16(pcm), rate, subtype="PCM_16")


def chunks(pcm: np.ndarray, rate: int, chunk_ms: int = 20) -> Iterator[AudioChunk]:
    """Split a signal into chunks of ``chunk_ms`` (the last one may be shorter)."""
    n = max(1, rate * chunk_ms // 1000)
    for start in range(0, len(pcm), n):
        yield AudioChunk(pcm[start:start + n], rate, start)


class Resampler:
    """Streaming resampler for live input (soxr): chunk in, chunk out, no edge artefacts.

    The filter holds back a few milliseconds of output; ``lag`` is how many output
    samples are still owed for the input seen so far, so a caller can map output
    positions back to input time exactly.
    """

    def __init__(self, src: int, dst: int):
        self.src, self.dst = src, dst
        self._in = 0
        self._out = 0
        self._stream = None
        if src != dst:
            import soxr

            self._stream = soxr.ResampleStream(src, dst, 1, dtype="float32", quality="HQ")

    def __call__(self, chunk: np.ndarray) -> np.ndarray:
        self._in += len(chunk)
        if self._stream is None:
            self._out += len(chunk)
            return chunk
        y = self._stream.resample_chunk(chunk.astype(np.float32) / 32768.0)
        self._out += len(y)
        return to_pcm16(y)

    def flush(self) -> np.ndarray:
        """The output still held in the filter (end of a stream); the resampler starts afresh."""
        if self._stream is None:
            return np.zeros(0, np.int16)
        import soxr

        y = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream = soxr.ResampleStream(self.src, self.dst, 1, dtype="float32", quality="HQ")
        self._in = self._out = 0
        return to_pcm16(y)

    @property
    def lag(self) -> int:
        """Output samples owed for the input so far (the filter delay)."""
        return int(self._in * self.dst // self.src) - self._out


class BufferSink:
    """Collects the agent's output audio with the stream position (at ``rate``) where each
    piece would start playing; ``clear_after`` drops what was not yet heard (barge-in)."""

    def __init__(self, rate: int):
        self.rate = rate
        self.pieces: list[tuple[float, np.ndarray]] = []  # (start time in seconds, pcm)

    def play(self, t: float, pcm: np.ndarray) -> None:
        self.pieces.append((t, pcm))

    def clear_after(self, t: float) -> None:
        kept = []
        for start, pcm in self.pieces:
            if start >= t:
                continue
            n = min(len(pcm), int((t - start) * self.rate))
            kept.append((start, pcm[:n]))
        self.pieces = kept

    def render(self, duration_s: float | None = None) -> np.ndarray:
        """All pieces mixed onto one timeline (silence between them)."""
        end = max((s + len(p) / self.rate for s, p in self.pieces), default=0.0)
        total = int(math.ceil((duration_s if duration_s is not None else end) * self.rate))
        out = np.zeros(max(total, 0), np.int32)
        for s, p in self.pieces:
            i = int(round(s * self.rate))
            j = min(len(out), i + len(p))
            if j > i:
                out[i:j] += p[: j - i]
        return np.clip(out, -32768, 32767).astype(np.int16)


class TeeSink:
    """Plays into several sinks at once (e.g. a ``BufferSink`` for the record and a speaker); anything else it is asked
    for (``rate``, a device's ``start()``, ``close()``, ``latency``) is the first sink's."""

    def __init__(self, *sinks):
        self.sinks = sinks

    def __getattr__(self, name):
        if name == "sinks":  # (not set yet: no recursion)
            raise AttributeError(name)
        return getattr(self.sinks[0], name)

    def play(self, t: float, pcm: np.ndarray) -> None:
        for s in self.sinks:
            s.play(t, pcm)

    def clear_after(self, t: float) -> None:
        for s in self.sinks:
            s.clear_after(t)


class QueueSource:
    """PCM pushed from another thread (a device callback, a websocket), read as chunks."""

    def __init__(self, rate: int, maxsize: int = 500):
        self.rate = rate
        self._q: queue.Queue = queue.Queue(maxsize=maxsize)
        self._pos = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def push(self, pcm: np.ndarray) -> None:
        try:
            self._q.put_nowait(to_pcm16(np.asarray(pcm).reshape(-1)))
        except queue.Full:
            self.dropped += len(pcm)

    def get(self, timeout: float) -> AudioChunk | None:
        try:
            pcm = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._lock:
            chunk = AudioChunk(pcm, self.rate, self._pos)
            self._pos += len(pcm)
        return chunk
