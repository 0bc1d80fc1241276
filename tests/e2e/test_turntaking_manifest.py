"""samples/turntaking/: the manifest agrees with the WAVs (counts, format, durations, the pause inside each paused
turn, the speech marks, the noise levels)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

SET = Path(__file__).resolve().parents[2] / "samples" / "turntaking"
MANIFEST = json.loads((SET / "manifest.json").read_text())
ITEMS: dict[str, dict] = MANIFEST["items"]
RATE = 16000


@cache
def load(name: str) -> np.ndarray:
    x, rate = sf.read(SET / name, dtype="int16")
    assert rate == RATE
    return x


def idx(t: float) -> int:
    """A manifest position (s) as a sample index; positions are exact multiples of 1/16000."""
    i = round(t * RATE)
    assert abs(i - t * RATE) < 1e-3, f"{t} s is not on a sample"
    return i


def dbfs(x: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean((x / 32768.0) ** 2)) + 1e-12)


def of(kind: str) -> list[str]:
    return [name for name, m in ITEMS.items() if m["kind"] == kind]


def test_counts_and_files():
    assert len(of("paused")) >= 20 and len(of("complete")) >= 20
    assert set(ITEMS) == {p.name for p in SET.glob("*.wav")}, "manifest and folder list different WAVs"
    assert sum(p.stat().st_size for p in SET.iterdir()) < 6e6


def test_the_set_spans_voices_and_noise():
    for kind in ("paused", "complete"):
        items = [ITEMS[n] for n in of(kind)]
        assert {m["engine"] for m in items} == {"piper", "espeak"}
        assert len({m["voice"] for m in items}) >= 6
        levels = {(m["noise"], m["noise_dbfs"]) for m in items}
        assert ("none", None) in levels and {d for _, d in levels} >= {None, -50.0, -40.0}
        assert {n for n, _ in levels} == {"none", "white", "pink"}


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_item(name):
    m = ITEMS[name]
    info = sf.info(SET / name)
    assert (info.samplerate, info.channels, info.subtype, info.format) == (RATE, 1, "PCM_16", "WAV")
    assert m["rate"] == RATE and m["channels"] == 1
    x = load(name)
    assert len(x) == idx(m["duration_s"])
    assert " ".join(m["parts"]) == m["text"] and len(m["synth_parts"]) == len(m["parts"])
    spans = [(idx(a), idx(b)) for a, b in m["part_spans_s"]]
    assert spans[0][0] == idx(m["speech_start_s"]) > 0 and spans[-1][1] == idx(m["speech_end_s"]) < len(x)
    assert all(a < b for a, b in spans)
    if m["kind"] == "paused":
        assert len(m["parts"]) == len(spans) == 2
        p = m["pause"]
        assert 400 <= p["ms"] <= 800
        assert (idx(p["start_s"]), idx(p["end_s"])) == (spans[0][1], spans[1][0])
        assert (idx(p["end_s"]) - idx(p["start_s"])) * 1000 / RATE == pytest.approx(p["ms"], abs=1e-6)
    else:
        assert m["kind"] == "complete" and m["pause"] is None and len(spans) == 1
    silent = np.ones(len(x), bool)
    for a, b in spans:
        silent[a:b] = False
    if m["noise"] == "none":
        # Digital silence everywhere but the parts; each part starts and ends on a voiced sample.
        assert not np.any(x[silent]), "sound outside the marked speech"
        for a, b in spans:
            assert x[a] != 0 and x[b - 1] != 0
            assert np.abs(x[a:b]).max() > 0.4 * 32768
        assert m["noise_dbfs"] is None
    else:
        # The noise has its stated RMS in the silences (the lead, the pause, the tail) and the speech stands out of it.
        assert m["noise"] in ("white", "pink")
        assert dbfs(x[silent]) == pytest.approx(m["noise_dbfs"], abs=1.5)
        lead = x[: spans[0][0]]
        assert dbfs(lead) == pytest.approx(m["noise_dbfs"], abs=2.5)
        for a, b in spans:
            assert dbfs(x[a:b]) > m["noise_dbfs"] + 10
