"""``wafervox mic``'s devices for real (sounddevice on PortAudio): with no sound card at all (PortAudio reports no
devices) it refuses in one line before anything loads; on a private PulseAudio server (null sinks standing in for the
microphone and the speaker, ``tests/pulse.py``) it lists them, names what exists when asked for what does not, and
runs on the one chosen with ``--device``, its session recorded with ``--record``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from pulse import mic_session

from voice.replay import SAMPLES, manifest

ROOT = Path(__file__).resolve().parents[2]


def _wafervox(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _no_sound_env(tmp_path) -> dict:
    """No sound server to reach (its runtime folder empty), so PortAudio sees only the sound cards (this machine: none)."""
    run = tmp_path / "run"
    run.mkdir()
    return {**os.environ, "XDG_RUNTIME_DIR": str(run), "PULSE_RUNTIME_PATH": str(run / "pulse"), "PULSE_SERVER": str(run / "none")}


def _devices(env) -> list[str]:
    code = "import sounddevice as sd; print(len(sd.query_devices()))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60).stdout.split()


@pytest.mark.parametrize("args", [["--device", "nosuch"], [], ["--input-device", "0"]])
def test_no_device_is_one_line_before_anything_loads(tmp_path, args):
    env = _no_sound_env(tmp_path)
    if _devices(env) != ["0"]:
        pytest.fail("this machine has a sound card: the no-device case needs one without (as CI's)")
    proc = _wafervox("mic", *args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert not proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wafervox: error: no input device"), proc.stderr
    listing = _wafervox("mic", "--list-devices", env=env)
    assert listing.returncode == 0 and listing.stdout.startswith("no sound devices"), listing


def test_devices_listed_and_a_wrong_name_answered_with_the_real_ones(pulse):
    listing = _wafervox("mic", "--list-devices", env=pulse.env)
    assert listing.returncode == 0, listing.stderr
    rows = listing.stdout.splitlines()
    assert any("pulse" in r.lower() for r in rows), rows
    assert any(r.startswith(">") for r in rows) and any(r[1] == "<" for r in rows), rows  # the defaults marked
    proc = _wafervox("mic", "--device", "nosuch", env=pulse.env)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "no input device named 'nosuch'" in line and "pulse" in line.lower(), line


def test_mic_on_a_named_device_records_the_session(pulse, tmp_path):
    wav = SAMPLES / "visit_01_address.wav"
    info = manifest()["turns"][wav.name]
    out = tmp_path / "rec"
    proc, seen = mic_session(pulse, wav, "--device", "pulse", "--record", str(out), cwd=ROOT)
    stdout, stderr = proc.stdout, proc.stderr
    assert "echo cancellation on" in seen
    assert proc.returncode == 0, stderr
    turns = [json.loads(x) for x in stdout.splitlines() if x.strip() and "turn" in json.loads(x)]
    assert turns and "harbor" in turns[0]["reply"].lower(), stdout
    (meta_path,) = out.glob("*.json")
    meta = json.loads(meta_path.read_text())
    assert [t["transcript"] for t in meta["turns"]] == [t["transcript"] for t in turns]
    data, rate = sf.read(str(out / meta["wav"]), dtype="int16", always_2d=True)
    assert data.shape[1] == 2
    user = np.flatnonzero(np.abs(data[:, 0]) > 1000)
    agent = np.flatnonzero(np.abs(data[:, 1]) > 1000)
    assert len(user) and len(agent)
    assert abs((user[-1] - user[0]) / rate - (info["speech_end_s"] - info["speech_start_s"])) < 0.4
    stamps = meta["turns"][0]["stamps"]
    assert abs(agent[0] / rate - stamps["answer_audio"]) < 0.1  # one clock: the report's times are the WAV's
