"""Stationary noises for robustness tests, seeded and at an absolute level.

Every generator returns ``n`` float64 samples whose RMS is ``dbfs`` dBFS. Full scale is 1.0, so a full-scale sine
is -3 dBFS by this measure. Add the result to speech in -1..1 and convert with ``to_pcm16``. The same arguments
give the same samples (``numpy.random.default_rng(seed)``).

- ``white``: flat spectrum.
- ``pink``: 1/f power from 20 Hz up.
- ``hum``: mains hum, a 50 or 60 Hz fundamental with decaying harmonics (a transformer's or a ground loop's buzz).
- ``fan``: brown-ish noise (1/f² power, low-passed), with a weak blade-pass tone that wobbles in level.
"""

from __future__ import annotations

import numpy as np


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def level_dbfs(x: np.ndarray) -> float:
    """RMS in dBFS of float audio (full scale 1.0), or of int16 PCM (full scale 32768)."""
    x = np.asarray(x)
    scale = 32768.0 if x.dtype == np.int16 else 1.0
    return 20 * np.log10(rms(x / scale) + 1e-15)


def at_level(x: np.ndarray, dbfs: float) -> np.ndarray:
    return x / rms(x) * 10 ** (dbfs / 20)


def _shaped(n: int, rate: int, seed: int, gain) -> np.ndarray:
    """White Gaussian noise shaped in the frequency domain by ``gain(f)`` (an amplitude response)."""
    spec = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / rate)
    return np.fft.irfft(spec * gain(f), n)


def white(n: int, dbfs: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    return at_level(np.random.default_rng(seed).standard_normal(n), dbfs)


def pink(n: int, dbfs: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    return at_level(_shaped(n, rate, seed, lambda f: (f >= 20.0) / np.sqrt(np.maximum(f, 20.0))), dbfs)


#: Relative amplitudes of the hum's harmonics 1, 2, 3, ...: the odd ones strong (a saturated transformer core).
HUM_HARMONICS = (1.0, 0.35, 0.5, 0.15, 0.25, 0.08, 0.12)


def hum(n: int, dbfs: float, mains_hz: float = 50.0, seed: int = 0, rate: int = 16000) -> np.ndarray:
    """Mains hum: ``mains_hz`` and its harmonics (``HUM_HARMONICS``) with seeded phases, and a -30 dB hiss
    so that it is not a mathematically pure tone."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = sum(a * np.sin(2 * np.pi * mains_hz * k * t + rng.uniform(0, 2 * np.pi))
            for k, a in enumerate(HUM_HARMONICS, start=1) if mains_hz * k < rate / 2)
    x = at_level(x, 0.0)
    return at_level(x + at_level(rng.standard_normal(n), -30.0), dbfs)


def fan(n: int, dbfs: float, seed: int = 0, rate: int = 16000, blade_hz: float = 137.0) -> np.ndarray:
    """A fan: 1/f² ("brown") noise from 20 Hz, rolled off above 1 kHz, plus a blade-pass tone 15 dB under the noise
    whose level wobbles by +-30 % at 0.7 Hz."""
    def gain(f):
        return (f >= 20.0) / np.maximum(f, 20.0) / np.sqrt(1 + (f / 1000.0) ** 4)

    body = at_level(_shaped(n, rate, seed, gain), 0.0)
    t = np.arange(n) / rate
    phase = np.random.default_rng(seed + 1).uniform(0, 2 * np.pi)
    tone = at_level(np.sin(2 * np.pi * blade_hz * t + phase), -15.0) * (1 + 0.3 * np.sin(2 * np.pi * 0.7 * t))
    return at_level(body + tone, dbfs)


def to_pcm16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)
