"""The microphone path for real: ``wafervox mic`` on sounddevice, against a private PulseAudio
server whose null sinks stand in for the microphone and the speaker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from pulse import mic_session

from voice.audio import read_wav
from voice.replay import SAMPLES, manifest

ROOT = Path(__file__).resolve().parents[2]


def test_mic_demo_hears_and_answers(pulse, tmp_path):
    m = manifest()
    wav = SAMPLES / "morning_01_open_tomorrow.wav"
    out_wav = tmp_path / "speaker.wav"
    proc, _ = mic_session(pulse, wav, record=out_wav, cwd=ROOT)
    stdout, stderr = proc.stdout, proc.stderr
    assert proc.returncode == 0, stderr
    lines = [json.loads(x) for x in stdout.splitlines() if x.strip()]
    turns = [x for x in lines if "turn" in x]
    assert turns, (stdout, stderr)
    t = turns[0]
    assert "open" in t["transcript"].lower(), t
    for kw in m["turns"][wav.name]["keywords"]:
        assert kw in t["reply"].lower(), t
    assert t["latency_ms"]["voice_to_voice_ms"] is not None
    assert "summary" in lines[-1]
    # the answer really went out through the speaker device
    pcm, rate = read_wav(out_wav)
    assert np.abs(pcm.astype(np.float32)).max() > 1000, "no agent audio reached the speaker"
    assert os.path.getsize(out_wav) > rate  # more than half a second of audio recorded


def test_run_speaks_through_the_sound_device(pulse, tmp_path):
    out_wav = tmp_path / "speaker.wav"
    rec = pulse.record(out_wav)
    try:
        proc = subprocess.run([sys.executable, "-m", "server.cli", "run", "--speak", "--json",
                               str(SAMPLES / "visit_01_address.wav")], cwd=ROOT, env={**pulse.env, "PYTHONUNBUFFERED": "1"},
                              capture_output=True, text=True, timeout=300)
    finally:
        rec.terminate()
        rec.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr
    turn = json.loads(proc.stdout.splitlines()[0])
    assert "harbor" in turn["reply"].lower()
    pcm, _ = read_wav(out_wav)
    assert np.abs(pcm.astype(np.float32)).max() > 1000, "no answer reached the speaker"
