"""samples/: every recorded turn in the manifest exists, has the stated format, and its speech marks agree with its audio."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
TURNS: dict[str, dict] = MANIFEST["turns"]
BARGE = MANIFEST["barge_in"]

FRAME_S = 0.010
EDGE_TOL_S = 0.020  # speech marks are exact from construction up to the trim threshold / resampler: +-20 ms


@cache
def load(name: str) -> tuple[np.ndarray, int, int]:
    """Mono float audio (channels averaged), sample rate, channel count."""
    audio, rate = sf.read(SAMPLES / name, dtype="float64", always_2d=True)
    return audio.mean(axis=1), rate, audio.shape[1]


def frame_rms(x: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """RMS of consecutive 10 ms frames, and each frame's centre time."""
    n = int(FRAME_S * rate)
    k = len(x) // n
    frames = x[: k * n].reshape(k, n)
    return np.sqrt(np.mean(frames**2, axis=1)), (np.arange(k) + 0.5) * n / rate


def in_window(t: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return (t - FRAME_S / 2 >= lo) & (t + FRAME_S / 2 <= hi)


def check_speech_marks(name: str, segments: list[tuple[float, float]], noise: str) -> None:
    """Energy check of the speech segments [(start_s, end_s), ...] of one file."""
    x, rate, _ = load(name)
    dur = len(x) / rate
    rms, t = frame_rms(x, rate)
    speech = np.zeros(len(t), bool)
    for s, e in segments:
        speech |= (t > s - 0.03) & (t < e + 0.03)
    silence = ~speech
    assert silence.sum() > 10, "no silence around the speech to measure a noise floor"
    floor = float(np.median(rms[silence]))
    if noise == "none":
        assert rms[silence].max() < 1e-3, f"{name}: sound outside the marked speech"
    elif noise == "clicks":
        assert rms[t < segments[0][0] - 0.1].max() > 0.01, f"{name}: no clicks/breath in the leading silence"
    else:
        assert floor > 1e-3, f"{name}: no steady {noise} noise"
    for s, e in segments:
        assert 0 < s < e <= dur
        seg = in_window(t, s, e)
        peak = float(rms[seg].max())
        assert peak > 10 * max(floor, 1e-4), f"{name}: speech {s:.3f}-{e:.3f} is not 20 dB above the floor"
        thr = max(3 * floor, 0.02 * peak)
        # Energy near both marks is above the noise floor...
        assert rms[in_window(t, s, s + 0.15)].max() > thr, f"{name}: no energy just after speech_start {s:.3f}"
        assert rms[in_window(t, e - 0.25, e)].max() > thr, f"{name}: no energy just before speech_end {e:.3f}"
        # ...and just outside them it is at the floor (the speech does not start earlier or end later).
        before = in_window(t, max(0.0, s - 0.15), s - EDGE_TOL_S)
        after = in_window(t, e + EDGE_TOL_S, min(dur, e + 0.15))
        for side, mask in (("before speech_start", before), ("after speech_end", after)):
            if mask.any():
                assert rms[mask].max() < max(2 * floor, 1e-3), f"{name}: energy {side} ({s:.3f}-{e:.3f})"
    if noise == "none":
        # Clean files: the first/last sample above -46 dB of the peak sit on the marks.
        voiced = np.nonzero(np.abs(x) > 0.005 * np.abs(x).max())[0] / rate
        assert abs(voiced[0] - segments[0][0]) <= EDGE_TOL_S
        assert abs(voiced[-1] - segments[-1][1]) <= EDGE_TOL_S


def test_manifest_shape():
    assert len(TURNS) >= 12
    rates = {m["rate"] for m in TURNS.values()}
    assert {8000, 16000, 22050, 44100} <= rates
    assert any(m["channels"] == 2 for m in TURNS.values())
    assert {"none", "white", "pink", "clicks"} <= {m["noise"] for m in TURNS.values()}
    assert {"owner", "address"} <= set(MANIFEST["persona"])


def test_conversations_reference_existing_turns():
    convs = MANIFEST["conversations"]
    assert next(iter(convs)) == "default"
    named = {k: v for k, v in convs.items() if k != "default"}
    assert len(named) >= 3
    assert convs["default"] in named.values(), "default must be one of the named conversations"
    for name, files in convs.items():
        assert files, name
        for f in files:
            assert f in TURNS, f"{name}: {f} not in turns"
    assert set(TURNS) <= {f for files in named.values() for f in files}, "a turn belongs to no conversation"


def test_keywords_are_persona_facts():
    facts = json.dumps(MANIFEST["persona"]).lower()
    for entry in [*TURNS.values(), *BARGE["turns"]]:
        assert entry["keywords"], entry["text"]
        for kw in entry["keywords"]:
            assert kw and kw == kw.lower() and kw in facts, (entry["text"], kw)


def check_format(name: str, entry: dict) -> None:
    path = SAMPLES / name
    assert path.is_file(), name
    info = sf.info(path)
    assert (info.format, info.subtype) == ("WAV", "PCM_16")
    assert info.samplerate == entry["rate"]
    assert info.channels == entry["channels"]
    dur = info.frames / info.samplerate
    assert abs(dur - entry["duration_s"]) < 1.5 / info.samplerate
    assert dur >= entry["speech_end_s"] + entry["trail_silence_s"] - 1.5 / info.samplerate


@pytest.mark.parametrize("name", sorted(TURNS))
def test_turn_file(name):
    entry = TURNS[name]
    assert entry["text"] and entry["voice"]
    check_format(name, entry)
    assert abs(entry["speech_start_s"] - entry["lead_silence_s"]) < 1e-6
    assert 0.3 - 1e-6 <= entry["lead_silence_s"] <= 1.5 + 1e-6
    assert 0.3 - 1e-6 <= entry["trail_silence_s"] <= 1.5 + 1e-6
    check_speech_marks(name, [(entry["speech_start_s"], entry["speech_end_s"])], entry["noise"])


def test_barge_in_file():
    assert BARGE["type"] == "barge_in"
    check_format(BARGE["file"], BARGE)
    first, second = BARGE["turns"]
    assert second["text"] == "Sorry, who is the owner?"
    assert BARGE["barge_in_at_s"] == second["speech_start_s"]
    gap = second["speech_start_s"] - first["speech_end_s"]
    assert abs(gap - BARGE["gap_s"]) < 1e-3 and gap >= 1.0, "the agent must have time to start answering"
    # The user speaks again while the agent's answer (started at the end of the gap at the earliest) would still play.
    assert second["speech_start_s"] < first["speech_end_s"] + BARGE["agent_answer_estimate_s"]
    segments = [(first["speech_start_s"], first["speech_end_s"]), (second["speech_start_s"], second["speech_end_s"])]
    check_speech_marks(BARGE["file"], segments, BARGE["noise"])


def test_total_size_under_3mb():
    assert sum(p.stat().st_size for p in SAMPLES.iterdir() if p.is_file()) < 3_000_000
