"""``--voice``: the Piper voices installed (packages, ``$WAFERVOX_PIPER_VOICES``) found by name, a voice that is not
installed reported in one line that lists those that are, before anything slow loads."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from voice.errors import EngineError
from voice.tts import PIPER_VOICES_ENV, PiperSynthesizer, find_voice, installed_voices, joe_voice_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def another_voice(tmp_path, monkeypatch):
    """A second voice installed in a folder of $WAFERVOX_PIPER_VOICES (the joe voice's files under another name)."""
    joe = joe_voice_path()
    folder = tmp_path / "voices"
    folder.mkdir()
    shutil.copy(joe, folder / "en_US-copy-medium.onnx")
    shutil.copy(f"{joe}.json", folder / "en_US-copy-medium.onnx.json")
    (folder / "lonely.onnx").write_bytes(b"no config beside it: not a voice")
    monkeypatch.setenv(PIPER_VOICES_ENV, str(folder))
    return folder / "en_US-copy-medium.onnx"


def test_installed_voices_are_found_by_name(another_voice):
    voices = installed_voices()
    assert voices["en_US-joe-medium"] == joe_voice_path()
    assert voices["en_US-copy-medium"] == another_voice
    assert "lonely" not in voices
    assert find_voice("copy") == another_voice  # a unique part of the name
    assert find_voice("en_US-joe-medium") == joe_voice_path()
    assert find_voice(str(another_voice)) == another_voice  # a path


def test_a_voice_not_installed_lists_those_that_are(another_voice):
    with pytest.raises(EngineError) as e:
        find_voice("amy")
    assert "en_US-copy-medium" in str(e.value) and "en_US-joe-medium" in str(e.value)
    with pytest.raises(EngineError, match="names 2"):
        find_voice("medium")
    with pytest.raises(EngineError, match="not found"):
        find_voice(str(another_voice.parent / "lonely.onnx"))


@pytest.mark.engines
def test_the_voice_found_speaks(another_voice):
    tts = PiperSynthesizer(voice_path=find_voice("copy"))
    pcm = np.concatenate(list(tts.synthesize("Hello there.")))
    assert len(pcm) > tts.sample_rate // 4 and np.abs(pcm).max() > 1000


@pytest.mark.engines
def test_the_command_refuses_a_voice_not_installed_before_loading():
    """One line, exit 2, and before the engines load (nothing else is printed: no kernel path, no engines ready)."""
    proc = subprocess.run([sys.executable, "-m", "server.cli", "run", "--voice", "nosuch-voice"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert not proc.stdout.strip()
    lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
    assert len(lines) == 1 and "nosuch-voice" in lines[0] and "en_US-joe-medium" in lines[0], proc.stderr
