"""Sound devices through sounddevice (PortAudio): the microphone as a ``QueueSource`` and the
speaker as a sink the loop plays into; the devices listed and a ``--device`` resolved, both before anything slow
loads (no device, or no such device, is one ``AudioError`` line).  Thin I/O shells; the loop logic lives elsewhere."""

from __future__ import annotations

import threading

import numpy as np

from .audio import AudioError, QueueSource


def _sd():
    try:
        import sounddevice as sd
    except OSError as exc:  # PortAudio missing
        raise AudioError(f"sound devices unavailable ({exc}); install libportaudio2 (apt-get install libportaudio2)") from None
    return sd


def devices() -> list[dict]:
    """Every device PortAudio reports (its index, name, channels both ways, host API), the defaults marked."""
    sd = _sd()
    try:
        found = sd.query_devices()
        apis = sd.query_hostapis()
        default_in, default_out = sd.default.device
    except Exception as exc:  # PortAudioError: PortAudio could not start
        raise AudioError(f"cannot list the sound devices: {exc}") from None
    out = []
    for d in found:
        out.append({"index": d["index"], "name": d["name"], "inputs": d["max_input_channels"],
                    "outputs": d["max_output_channels"], "api": apis[d["hostapi"]]["name"],
                    "rate": d["default_samplerate"], "default_input": d["index"] == default_in,
                    "default_output": d["index"] == default_out})
    return out


def describe_devices(found: list[dict] | None = None) -> str:
    """``wafervox mic --list-devices``: one line a device (``>`` the default input, ``<`` the default output)."""
    found = devices() if found is None else found
    if not found:
        return "no sound devices: PortAudio reports none (no sound card, or no access to it)"
    lines = []
    for d in found:
        mark = (">" if d["default_input"] else " ") + ("<" if d["default_output"] else " ")
        lines.append(f"{mark} {d['index']:>3}  {d['name']}  ({d['api']}; {d['inputs']} in, {d['outputs']} out, "
                     f"{d['rate']:.0f} Hz)")
    return "\n".join(lines)


def resolve_device(spec, kind: str, found: list[dict] | None = None) -> int:
    """The index of the ``kind`` ("input" or "output") device that ``spec`` names: None for the default, an index, or
    a part of its name (case-insensitive; an exact name first).  An ``AudioError`` in one line when there is none."""
    found = devices() if found is None else found
    key = "inputs" if kind == "input" else "outputs"
    usable = [d for d in found if d[key] > 0]
    if not usable:
        raise AudioError(f"no {kind} device: PortAudio reports {'no sound devices' if not found else f'none with {kind} channels'} "
                         "(no sound card, or no access to it; `wafervox mic --list-devices` lists what there is)")
    names = ", ".join(f"{d['index']}: {d['name']}" for d in usable)
    if spec is None or spec == "":
        chosen = [d for d in usable if d[f"default_{kind}"]]
        if not chosen:
            raise AudioError(f"no default {kind} device; pick one with --device or --{kind}-device ({names})")
        return chosen[0]["index"]
    text = str(spec).strip()
    if text.lstrip("-").isdigit():
        i = int(text)
        for d in usable:
            if d["index"] == i:
                return i
        raise AudioError(f"no {kind} device {i} (have {names})")
    exact = [d for d in usable if d["name"].lower() == text.lower()]
    part = exact or [d for d in usable if text.lower() in d["name"].lower()]
    if not part:
        raise AudioError(f"no {kind} device named {text!r} (have {names})")
    if len(part) > 1:
        raise AudioError(f"{text!r} names {len(part)} {kind} devices ({', '.join(d['name'] for d in part)}); "
                         "give more of the name, or the index")
    return part[0]["index"]


class _Stream:
    """A PortAudio stream's life and latency (``self._stream``), shared by the microphone and the speaker."""

    _stream = None

    def start(self):
        self._stream.start()
        return self

    @property
    def latency(self) -> float:
        """The latency PortAudio reports for the stream (s): a prior for the echo canceller's delay."""
        return float(self._stream.latency)

    def close(self):
        self._stream.stop()
        self._stream.close()


class Microphone(_Stream, QueueSource):
    """Default input device, mono PCM16 at ``rate``, in blocks of ``block_ms``."""

    def __init__(self, rate: int = 16000, block_ms: int = 20, device=None):
        super().__init__(rate)
        sd = _sd()
        self.overflows = 0

        def callback(indata, frames, time_info, status):
            if status.input_overflow:
                self.overflows += 1
            self.push(indata[:, 0].copy())

        try:
            self._stream = sd.InputStream(samplerate=rate, channels=1, dtype="int16", blocksize=rate * block_ms // 1000,
                                          callback=callback, device=device)
        except Exception as exc:  # PortAudioError and friends
            raise AudioError(f"cannot open the microphone: {exc}") from None


class Speaker(_Stream):
    """Default output device; ``play`` queues PCM, ``clear_after`` drops what is not yet played."""

    def __init__(self, rate: int, device=None):
        sd = _sd()
        self.rate = rate
        self._buf = np.zeros(0, np.int16)
        self._lock = threading.Lock()
        self.played_samples = 0

        def callback(outdata, frames, time_info, status):
            with self._lock:
                n = min(frames, len(self._buf))
                outdata[:n, 0] = self._buf[:n]
                outdata[n:, 0] = 0
                self._buf = self._buf[n:]
                self.played_samples += n

        try:
            self._stream = sd.OutputStream(samplerate=rate, channels=1, dtype="int16", callback=callback, device=device,
                                           blocksize=rate // 50)
        except Exception as exc:
            raise AudioError(f"cannot open the speaker: {exc}") from None

    def play(self, t: float, pcm: np.ndarray) -> None:
        with self._lock:
            self._buf = np.concatenate([self._buf, pcm.astype(np.int16)])

    def clear_after(self, t: float) -> None:
        with self._lock:
            self._buf = self._buf[:0]
