"""A private PulseAudio server with two null sinks, for exercising the sounddevice path for real.

``wvx_mic``: tests play speech into it; its monitor is the default source (our microphone).
``wvx_spk``: the default sink (our speaker); tests record its monitor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest


class PulseServer:
    def __init__(self):
        if not shutil.which("pulseaudio") or not shutil.which("pactl"):
            raise RuntimeError("pulseaudio not installed: apt-get install pulseaudio pulseaudio-utils libasound2-plugins")
        self.runtime = tempfile.mkdtemp(prefix="wvx-pulse-")
        self.env = {**os.environ, "XDG_RUNTIME_DIR": self.runtime, "PULSE_RUNTIME_PATH": os.path.join(self.runtime, "pulse")}
        subprocess.run(["pulseaudio", "--daemonize=yes", "--exit-idle-time=-1", "-n", "--disallow-exit",
                        "--load=module-native-protocol-unix", "--load=module-null-sink sink_name=wvx_spk",
                        "--load=module-null-sink sink_name=wvx_mic"], env=self.env, check=True, capture_output=True, timeout=20)
        deadline = time.monotonic() + 10
        while subprocess.run(["pactl", "info"], env=self.env, capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("pulseaudio did not come up")
            time.sleep(0.1)
        self.pactl("set-default-sink", "wvx_spk")
        self.pactl("set-default-source", "wvx_mic.monitor")

    def pactl(self, *args):
        return subprocess.run(["pactl", *args], env=self.env, check=True, capture_output=True, text=True, timeout=10)

    def play(self, wav) -> subprocess.Popen:
        return subprocess.Popen(["paplay", "--device=wvx_mic", str(wav)], env=self.env)

    def record(self, path, rate=22050) -> subprocess.Popen:
        return subprocess.Popen(["parec", "--device=wvx_spk.monitor", "--file-format=wav", f"--rate={rate}",
                                 "--channels=1", "--format=s16le", str(path)], env=self.env)

    def close(self):
        subprocess.run(["pulseaudio", "--kill"], env=self.env, capture_output=True, timeout=10)
        shutil.rmtree(self.runtime, ignore_errors=True)


def wait_listening(proc: subprocess.Popen, timeout_s: float = 240) -> str:
    """Read ``wafervox mic``'s stderr until it says it is listening (the engines load first); returns what it said.
    Fails the test when the demo exits first or takes longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    seen = ""
    while "listening" not in seen:
        line = proc.stderr.readline()
        if not line:
            pytest.fail(f"mic demo exited early: {seen}")
        seen += line
        assert time.monotonic() < deadline, "mic demo did not start listening"
    return seen


def mic_session(pulse: PulseServer, wav, *args: str, record=None, cwd=None) -> tuple[subprocess.CompletedProcess, str]:
    """``wafervox mic --seconds 14 --json *args`` on ``pulse``'s devices: once it listens, ``wav`` is played into its
    microphone (and, with ``record``, its speaker is recorded to that path meanwhile).  Returns the finished process
    (stdout, stderr as text) and what it said on stderr before it listened."""
    import sys

    env = {**pulse.env, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "mic", "--seconds", "14", "--json", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rec = None
    try:
        seen = wait_listening(proc)  # (the engines load first)
        if record is not None:
            rec = pulse.record(record)
        time.sleep(0.5)
        pulse.play(wav).wait(timeout=30)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if rec is not None:
            rec.terminate()
            rec.wait(timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), seen
