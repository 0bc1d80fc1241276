"""Sound devices through sounddevice (PortAudio): the microphone as a ``QueueSource`` and the
speaker as a sink the loop plays into.  Thin I/O shells; the loop logic lives elsewhere."""

from __future__ import annotations

import threading

import numpy as np

from .audio import AudioError, QueueSource


def _sd():
    try:
        import sounddevice as sd
    except OSError as exc:  # PortAudio missing
        raise AudioError(f"sound devices unavailable ({exc}); install libportaudio2 (apt-get install libportaudio2)") from None
    return sd


class Microphone(QueueSource):
    """Default input device, mono PCM16 at ``rate``, in blocks of ``block_ms``."""

    def __init__(self, rate: int = 16000, block_ms: int = 20, device=None):
        super().__init__(rate)
        sd = _sd()
        self.overflows = 0

        def callback(indata, frames, time_info, status):
            if status.input_overflow:
                self.overflows += 1
            self.push(indata[:, 0].copy())

        try:
            self._stream = sd.InputStream(samplerate=rate, channels=1, dtype="int16", blocksize=rate * block_ms // 1000,
                                          callback=callback, device=device)
        except Exception as exc:  # PortAudioError and friends
            raise AudioError(f"cannot open the microphone: {exc}") from None

    def start(self):
        self._stream.start()
        return self

    def close(self):
        self._stream.stop()
        self._stream.close()


class Speaker:
    """Default output device; ``play`` queues PCM, ``clear_after`` drops what is not yet played."""

    def __init__(self, rate: int, device=None):
        sd = _sd()
        self.rate = rate
        self._buf = np.zeros(0, np.int16)
        self._lock = threading.Lock()
        self.played_samples = 0

        def callback(outdata, frames, time_info, status):
            with self._lock:
                n = min(frames, len(self._buf))
                outdata[:n, 0] = self._buf[:n]
                outdata[n:, 0] = 0
                self._buf = self._buf[n:]
                self.played_samples += n

        try:
            self._stream = sd.OutputStream(samplerate=rate, channels=1, dtype="int16", callback=callback, device=device,
                                           blocksize=rate // 50)
        except Exception as exc:
            raise AudioError(f"cannot open the speaker: {exc}") from None

    def start(self):
        self._stream.start()
        return self

    def play(self, t: float, pcm: np.ndarray) -> None:
        with self._lock:
            self._buf = np.concatenate([self._buf, pcm.astype(np.int16)])

    def clear_after(self, t: float) -> None:
        with self._lock:
            self._buf = self._buf[:0]

    def close(self):
        self._stream.stop()
        self._stream.close()
