"""Build the overlap cases in samples/overlap/: sounds a user makes while the agent speaks, each with what must follow.

Run from the repository root:

    .venv/bin/python samples/overlap/make_overlap.py

Backchannels and interruptions are spoken by espeak-ng voices that no other sample and no tuning uses (``en-us+m7``,
``en-gb-x-rp+f2``, ``en-029``; espeak-ng hums poorly: its "mm-hmm" is taken from the voice that makes it a hum,
Whisper hears the others' as words, "in the", "and then then"); the cough and the knock are made here (a shaped noise
burst, a few damped resonances), since no package ships such recordings. Every file is 16 kHz mono PCM16: 50 ms of
silence, the sound, 50 ms of silence. ``cases.json`` lists each case: its file, the kind of sound, the expected
outcome ("resume": the answer goes on, no turn; "interrupt": the answer stops and the speech is answered) and, for speech, the text.
Output is deterministic (espeak-ng is; the noises use fixed seeds).
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import butter, resample_poly, sosfilt

HERE = Path(__file__).resolve().parent
RATE = 16000
PEAK = 0.5
LEAD = int(0.05 * RATE)

# (name, text, espeak voice, words per minute, expected)
SPOKEN = [
    ("uh_huh", "uh-huh", "en-us+m7", 150, "resume"),
    ("yeah", "yeah", "en-gb-x-rp+f2", 160, "resume"),
    ("mm_hmm", "mm-hmm", "en-gb-x-rp+f2", 140, "resume"),
    ("okay", "okay", "en-us+m7", 170, "resume"),
    ("right", "right", "en-gb-x-rp+f2", 150, "resume"),
    ("stop", "Stop.", "en-us+m7", 160, "interrupt"),
    ("wait_question", "Wait, are you open on Sunday?", "en-029", 160, "interrupt"),
    ("sorry_owner", "Sorry, who is the owner?", "en-gb-x-rp+f2", 150, "interrupt"),
]


def espeak(text: str, voice: str, wpm: int) -> np.ndarray:
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "--stdout", text], check=True, capture_output=True).stdout
    audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
    audio = resample_poly(audio, RATE, rate) if rate != RATE else audio
    keep = np.flatnonzero(np.abs(audio) > 0.005 * np.abs(audio).max())
    return audio[keep[0]:keep[-1] + 1]


def cough(seed: int = 7) -> np.ndarray:
    """Two bursts of band-passed noise with a fast attack and a ~0.1 s decay: a short dry cough (~0.35 s)."""
    rng = np.random.default_rng(seed)
    out = []
    for length, level in ((0.18, 1.0), (0.14, 0.6)):
        n = int(length * RATE)
        t = np.arange(n) / RATE
        burst = sosfilt(butter(2, (300, 3000), "bandpass", fs=RATE, output="sos"), rng.standard_normal(n))
        out += [burst * level * np.minimum(1, t / 0.01) * np.exp(-t / 0.06), np.zeros(int(0.03 * RATE))]
    return np.concatenate(out)


def knock(seed: int = 11) -> np.ndarray:
    """Three knocks on a door: damped low resonances excited by a click, 0.18 s apart."""
    rng = np.random.default_rng(seed)
    n = int(0.15 * RATE)
    t = np.arange(n) / RATE
    one = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, np.pi)) * np.exp(-t / d) for f, d in ((180, 0.03), (410, 0.02), (950, 0.01)))
    one[:40] += rng.standard_normal(40) * 0.8
    gap = np.zeros(int(0.03 * RATE))
    return np.concatenate([one, gap, one * 0.9, gap, one * 0.8])


def write(name: str, audio: np.ndarray) -> None:
    audio = audio * (PEAK / np.abs(audio).max())
    pcm = np.concatenate([np.zeros(LEAD), audio, np.zeros(LEAD)])
    sf.write(HERE / f"{name}.wav", (pcm * 32767).astype(np.int16), RATE, subtype="PCM_16")


def main() -> None:
    cases = []
    for name, text, voice, wpm, expected in SPOKEN:
        write(name, espeak(text, voice, wpm))
        cases.append({"name": name, "file": f"{name}.wav", "kind": "backchannel" if expected == "resume" else "interruption",
                      "text": text, "voice": f"espeak-{voice}-{wpm}", "expected": expected})
    for name, make in (("cough", cough), ("knock", knock)):
        write(name, make())
        cases.append({"name": name, "file": f"{name}.wav", "kind": "noise", "text": "", "voice": "synthetic",
                      "expected": "resume"})
    for c in cases:
        info = sf.info(HERE / c["file"])
        c["duration_s"] = round(info.frames / info.samplerate, 3)
    (HERE / "cases.json").write_text(json.dumps({"rate": RATE, "lead_silence_s": LEAD / RATE, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
