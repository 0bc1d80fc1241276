"""The endpointer in steady noise: recorded single utterances with white, pink, mains-hum and fan noise added.

The recordings are the clean single turns of samples/ (their speech marks are exact from construction) and the clean
``complete`` turns of samples/turntaking/. The endpointer has the voice loop's settings
(``LoopConfig().endpointer``: ``EndpointerConfig(pause_ms=90)``). It is fed in 20 ms chunks, as the loop feeds it.
Levels are absolute RMS in dBFS (``tests/noise.py``). The issue's bar spans -65 to -35 dBFS.

Asserted for each noise condition:
- noise alone never starts a turn;
- each utterance gives exactly one SpeechStarted and one SpeechStopped;
- the last voiced sample found is within ``LAST_EARLY_MS`` before / ``LAST_LATE_MS`` after the true one;
- up to -50 dBFS, the endpoint delay (SpeechStopped.sample - the true end) has its median within ``DELAY_TOL_MS``
  of the median without noise (the issue's bar), and each recording's within ``DELAY_EACH_MS`` of its own clean one.

Known limits, measured (2026-12-03), kept as strict xfails so that a fix shows: at -35 dBFS white/pink noise two
utterances split in two ("Hi, | what time ...", "Where are you | located?"): the weak ends and onsets around a
comma's pause drown, and the 250-300 ms gap reads as 400 ms of silence.  With loud noise (-35/-40 dBFS) a word's
faint ending (a final /st/, the nasal decay of "open") is below the noise in every band and is found up to
``LAST_EARLY_LOUD_MS`` early.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from noise import fan, hum, level_dbfs, pink, to_pcm16, white

from voice.audio import read_wav, resample
from voice.loop_config import LoopConfig
from voice.vad import Endpointer, SpeechStarted, SpeechStopped

RATE = 16000
CHUNK = RATE * 20 // 1000
SAMPLES = Path(__file__).resolve().parents[2] / "samples"

#: webrtcvad looks at 0-4 kHz only and misses final fricatives even in clean audio ("lights" ends ~190 ms early, see
#: ``EndpointerConfig``); a frame (30 ms) of quantization on top.
LAST_EARLY_MS = 200
#: ... and with noise at -40 dBFS or louder, where a word's faintest ending is below the noise (see the docstring).
LAST_EARLY_LOUD_MS = 320
#: The last voiced frame ends at most one frame after the true end; one more frame for noise next to it.
LAST_LATE_MS = 60
#: The issue's bar: at -50 dBFS the endpoint comes within 100 ms of where it comes without noise.
DELAY_TOL_MS = 100
#: One recording's endpoint may move more than the median's (a faint release burst heard in silence, not in noise).
DELAY_EACH_MS = 150
#: (condition, why) that fail today: strict xfails.
SPLIT_IN_LOUD_NOISE = {"white-35", "pink-35"}
#: Noise appended after each recording, so that the stop is decided inside the noise.
TAIL_S = 0.6

#: name -> (generator, dBFS, extra keyword arguments)
CONDITIONS = {
    "white-65": (white, -65.0, {}),
    "white-50": (white, -50.0, {}),
    "white-35": (white, -35.0, {}),
    "pink-65": (pink, -65.0, {}),
    "pink-50": (pink, -50.0, {}),
    "pink-35": (pink, -35.0, {}),
    "hum50-40": (hum, -40.0, {"mains_hz": 50.0}),
    "hum60-40": (hum, -40.0, {"mains_hz": 60.0}),
    "fan-40": (fan, -40.0, {}),
}
#: The conditions at which the endpoint delay must match the clean one (the issue names -50 dBFS).
DELAY_CONDITIONS = [name for name, (_, db, _) in CONDITIONS.items() if db <= -50.0]


@dataclass(frozen=True)
class Recording:
    name: str
    pcm: np.ndarray  # int16 mono at RATE
    start_s: float
    end_s: float  # one past the last voiced sample


@cache
def recordings() -> tuple[Recording, ...]:
    out = []
    for name, t in json.loads((SAMPLES / "manifest.json").read_text())["turns"].items():
        if t["noise"] == "none":
            out.append((SAMPLES / name, name, t["speech_start_s"], t["speech_end_s"]))
    for name, t in json.loads((SAMPLES / "turntaking" / "manifest.json").read_text())["items"].items():
        if t["noise"] == "none" and t["kind"] == "complete":
            out.append((SAMPLES / "turntaking" / name, name, t["speech_start_s"], t["speech_end_s"]))
    recs = []
    for path, name, s, e in out:
        pcm, rate = read_wav(path)
        recs.append(Recording(name, resample(pcm, rate, RATE), s, e))
    return tuple(recs)


def noise_for(condition: str, n: int, seed: int) -> np.ndarray:
    gen, db, kw = CONDITIONS[condition]
    return gen(n, db, seed=seed, rate=RATE, **kw)


def endpoint(pcm: np.ndarray) -> list:
    ep = Endpointer(LoopConfig().endpointer)
    for i in range(0, len(pcm), CHUNK):
        ep.feed(pcm[i : i + CHUNK])
    return ep.events()


@dataclass(frozen=True)
class Outcome:
    kinds: tuple[str, ...]
    stop: SpeechStopped | None  # the stop, if there was exactly one start and one stop


@cache
def outcomes(condition: str) -> dict[str, Outcome]:
    """The endpointer's events for every recording in ``condition`` ("clean" = no noise)."""
    out = {}
    for i, rec in enumerate(recordings()):
        x = np.concatenate([rec.pcm / 32768.0, np.zeros(int(TAIL_S * RATE))])
        if condition != "clean":
            x = x + noise_for(condition, len(x), seed=1000 * list(CONDITIONS).index(condition) + i)
        events = endpoint(to_pcm16(x))
        kinds = tuple(type(e).__name__ for e in events)
        stops = [e for e in events if isinstance(e, SpeechStopped)]
        one = kinds.count("SpeechStarted") == 1 and len(stops) == 1
        out[rec.name] = Outcome(kinds, stops[0] if one else None)
    return out


def ms(samples: float) -> float:
    return samples * 1000 / RATE


def last_error_ms(rec: Recording, stop: SpeechStopped) -> float:
    """Detected minus true end of the speech (ms; negative = found early)."""
    return ms(stop.last_voiced_sample + 1) - rec.end_s * 1000


def delay_ms(rec: Recording, stop: SpeechStopped) -> float:
    """The endpoint decision after the true end of the speech (ms)."""
    return ms(stop.sample) - rec.end_s * 1000


# -- the noise generators ----------------------------------------------------------------------


@pytest.mark.parametrize("condition", list(CONDITIONS))
def test_noise_has_its_level_and_is_seeded(condition):
    n = 3 * RATE
    x = noise_for(condition, n, seed=3)
    assert level_dbfs(x) == pytest.approx(CONDITIONS[condition][1], abs=0.01)
    assert level_dbfs(to_pcm16(x)) == pytest.approx(CONDITIONS[condition][1], abs=0.5)
    np.testing.assert_array_equal(x, noise_for(condition, n, seed=3))
    assert not np.array_equal(x, noise_for(condition, n, seed=4))


def band_db(x: np.ndarray, lo: float, hi: float) -> float:
    p = np.abs(np.fft.rfft(x)) ** 2
    f = np.fft.rfftfreq(len(x), 1 / RATE)
    return 10 * np.log10(p[(f >= lo) & (f < hi)].mean())


def test_noise_spectra():
    n = 4 * RATE
    w, p, f = white(n, -40, seed=1), pink(n, -40, seed=1), fan(n, -40, seed=1)
    assert abs(band_db(w, 4000, 8000) - band_db(w, 250, 500)) < 1.0  # flat
    assert band_db(p, 250, 500) - band_db(p, 4000, 8000) == pytest.approx(10 * np.log10(16), abs=1.5)  # -3 dB/octave
    assert band_db(f, 100, 200) - band_db(f, 2000, 4000) > 30  # a fan rumbles
    for mains in (50.0, 60.0):
        h = np.abs(np.fft.rfft(hum(n, -40, mains_hz=mains, seed=1))) ** 2
        freqs = np.fft.rfftfreq(n, 1 / RATE)
        top = freqs[np.argsort(h)[-3:]]
        assert set(np.round(top)) <= {mains, 2 * mains, 3 * mains, 5 * mains}


# -- the endpointer in noise -------------------------------------------------------------------


@pytest.mark.parametrize("condition", list(CONDITIONS))
def test_no_false_start_in_noise_alone(condition):
    for seed in range(3):
        events = endpoint(to_pcm16(noise_for(condition, 8 * RATE, seed=500 + seed)))
        assert not any(isinstance(e, SpeechStarted) for e in events), f"{condition} seed {seed}: {events}"


@pytest.mark.parametrize("condition", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="a comma's pause reads as the end in -35 dBFS noise"))
    if c in SPLIT_IN_LOUD_NOISE else c for c in ["clean", *CONDITIONS]])
def test_one_start_and_one_stop_per_utterance(condition):
    bad = {name: o.kinds for name, o in outcomes(condition).items() if o.stop is None}
    assert not bad, f"{condition}: {len(bad)} of {len(recordings())} utterances not one turn: {bad}"


@pytest.mark.parametrize("condition", ["clean", *CONDITIONS])
def test_last_voiced_sample_near_the_true_one(condition):
    errors = {r.name: last_error_ms(r, outcomes(condition)[r.name].stop) for r in recordings()
              if outcomes(condition)[r.name].stop is not None}
    early = LAST_EARLY_LOUD_MS if condition != "clean" and CONDITIONS[condition][1] >= -40 else LAST_EARLY_MS
    bad = {k: round(v) for k, v in errors.items() if not -early <= v <= LAST_LATE_MS}
    assert not bad, (f"{condition}: last voiced sample off by (ms, - = early) {bad}; "
                     f"allowed -{early}..+{LAST_LATE_MS}")


@pytest.mark.parametrize("condition", DELAY_CONDITIONS)
def test_endpoint_delay_as_without_noise(condition):
    clean, noisy = outcomes("clean"), outcomes(condition)
    diffs = {r.name: delay_ms(r, noisy[r.name].stop) - delay_ms(r, clean[r.name].stop) for r in recordings()
             if clean[r.name].stop is not None and noisy[r.name].stop is not None}
    assert len(diffs) == len(recordings())
    p50_clean = np.median([delay_ms(r, clean[r.name].stop) for r in recordings()])
    p50_noisy = np.median([delay_ms(r, noisy[r.name].stop) for r in recordings()])
    assert abs(p50_noisy - p50_clean) <= DELAY_TOL_MS, (condition, p50_noisy, p50_clean)
    bad = {k: f"{delay_ms(r, noisy[k].stop):.0f} ms vs {delay_ms(r, clean[k].stop):.0f} ms clean"
           for r in recordings() if abs(diffs[(k := r.name)]) > DELAY_EACH_MS}
    assert not bad, f"{condition}: endpoint delay after the true end differs by > {DELAY_EACH_MS} ms from clean: {bad}"
