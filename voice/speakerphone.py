"""A speakerphone around the voice loop, simulated: what the agent plays comes back into its microphone through a room
(an impulse response, a delay and a gain) on top of the user's voice and the microphone's own noise, with or without
echo cancellation (``voice.aec``) before the loop's input.  The loop runs for real (its engines, its endpointer) on a
virtual clock; the room is a sink beside the loop's, so it hears exactly what was played (cut at ``clear_after``,
added at ``play``).

``tests/voice/test_aec.py`` holds the loop to it (no self-interruption with echo at -6 dB; a real interruption still
stops the answer), ``bench/echo.py`` measures the canceller with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .aec import EchoCanceller, EchoCancellingInput, EchoReference, EchoTee
from .audio import AudioChunk, BufferSink, TeeSink, read_wav, resample, to_pcm16
from .clock import VirtualClock
from .drivers import run_until
from .protocols import ASR_RATE
from .turns import TurnState
from .vad import State as VadState


def room_impulse_response(rt60_s: float = 0.25, length_s: float = 0.3, rate: int = ASR_RATE, seed: int = 0) -> np.ndarray:
    """A synthetic room: a direct path, a few early reflections and an exponentially decaying diffuse tail (noise
    under an envelope that falls 60 dB in ``rt60_s``), scaled to unit energy (so an echo's level is its gain)."""
    rng = np.random.default_rng(seed)
    n = int(length_s * rate)
    t = np.arange(n) / rate
    h = rng.standard_normal(n) * np.exp(-6.9 * t / rt60_s) * 0.3
    h[:int(0.002 * rate)] = 0.0  # the tail builds up after the direct sound
    h[0] = 1.0
    for delay_ms, g in ((3.1, -0.5), (5.7, 0.35), (9.2, -0.25), (14.0, 0.2)):
        h[int(delay_ms * rate / 1000)] += g
    return (h / np.sqrt(np.sum(h ** 2))).astype(np.float32)


class Room:
    """A sink: what plays into it comes back at the microphone ``delay_s`` later through ``rir`` at ``level_db``
    (relative to the played signal's own level), at 16 kHz."""

    def __init__(self, rate: int, *, delay_s: float = 0.08, level_db: float = -6.0, rir: np.ndarray | None = None):
        self.rate = rate
        self.played = EchoReference(rate, keep_s=3600.0)
        self.rir = room_impulse_response() if rir is None else rir
        self.delay = int(round(delay_s * ASR_RATE))
        self.gain = 10 ** (level_db / 20)
        self.clears: list[float] = []  # clock times of every clear_after
        self.plays: list[tuple[float, float]] = []  # (start, end) of every piece played

    def play(self, t: float, pcm: np.ndarray) -> None:
        self.played.play(t, pcm)
        self.plays.append((t, t + len(pcm) / self.rate))

    def clear_after(self, t: float) -> None:
        self.played.clear_after(t)
        self.clears.append(t)

    def echo(self, k0: int, k1: int) -> np.ndarray:
        """The echo at the microphone for clock samples [k0, k1), float32."""
        L = len(self.rir)
        x = self.played.read16(k0 - self.delay - L + 1, k1 - self.delay)
        if not x.any():
            return np.zeros(k1 - k0, np.float32)
        return (self.gain * np.convolve(x, self.rir, mode="valid")).astype(np.float32)


@dataclass
class Say:
    """A user's recording in the scene: played after the agent's last answer is over and ``gap_s`` of quiet (the next
    question), or ``barge_after_s`` after the agent's answer to the previous one starts playing (an interruption)."""

    pcm: np.ndarray  # 16 kHz int16
    gap_s: float = 0.3
    barge_after_s: float | None = None
    speech_start_s: float = 0.0  # where its voice starts in the recording
    started_s: float | None = field(default=None)  # clock time it started

    @classmethod
    def file(cls, path, **kw) -> Say:
        pcm, rate = read_wav(path)
        return cls(resample(pcm, rate, ASR_RATE), **kw)


@dataclass
class Scene:
    """What happened: the loop, the room, the recording of the microphone as the loop got it, each utterance's start."""

    loop: object
    room: Room
    says: list[Say]
    mic: list[np.ndarray] = field(default_factory=list)  # as the microphone captured it (before the canceller)
    fed: list[np.ndarray] = field(default_factory=list)  # as the loop got it
    canceller: EchoCanceller | None = None

    @property
    def self_interruptions(self) -> int:
        """Barge-ins with no user voice to cause them (every barge-in when no utterance was an interruption)."""
        real = [s for s in self.says if s.barge_after_s is not None]
        return max(0, len(self.loop.barge_ins) - len(real)) if real else len(self.loop.barge_ins)


def run_scene(engines, says: list[Say], *, aec: bool = True, delay_s: float = 0.08, level_db: float = -6.0,
              noise_dbfs: float = -60.0, rir: np.ndarray | None = None, config=None, chunk_ms: int = 20,
              max_s: float = 120.0, seed: int = 1, on_chunk: Callable[[int], None] | None = None,
              aec_options: dict | None = None) -> Scene:
    """Run the loop on a virtual clock with its microphone in the room: ``says`` one after another, the agent's answers
    echoed back, the canceller before the loop's input when ``aec``.  Ends when every utterance was said and the
    agent is done."""
    from .loop import VoiceLoop

    clock = VirtualClock()
    rate = engines.tts.sample_rate
    room = Room(rate, delay_s=delay_s, level_db=level_db, rir=rir)
    heard = BufferSink(rate)
    sink = TeeSink(heard, room)
    stage = None
    canceller = None
    if aec:
        reference = EchoReference(rate)
        canceller = EchoCanceller(reference, **(aec_options or {}))
        sink = EchoTee(sink, reference)
        stage = EchoCancellingInput(canceller, clock)
    loop = VoiceLoop(engines, sink, clock, config)
    scene = Scene(loop, room, says, canceller=canceller)
    rng = np.random.default_rng(seed)
    noise = 10 ** (noise_dbfs / 20)
    n = ASR_RATE * chunk_ms // 1000
    k = 0  # clock sample of the next chunk
    pending = list(says)
    current: Say | None = None
    pos = 0
    answer_from = None  # when the agent's answer to the last utterance began playing
    quiet_since = 0.0
    last_said_start = 0.0  # (the answer to it is what plays after it began: it may come in the recording's silent tail)
    while k < max_s * ASR_RATE:
        t = k / ASR_RATE
        run_until(loop, t + n / ASR_RATE)
        if current is None and pending:
            nxt = pending[0]
            starts = [a for a, _ in room.plays if a >= last_said_start]
            answer_from = min(starts) if starts else None
            idle = (not loop.answering and loop.turns.state is TurnState.LISTENING and loop.vad.state is VadState.SILENCE
                    and room.played.end_s <= t)
            if not idle:
                quiet_since = t
            if nxt.barge_after_s is not None:
                go = answer_from is not None and t >= answer_from + nxt.barge_after_s
            else:
                go = idle and t - quiet_since >= nxt.gap_s
            if go:
                current, pos = pending.pop(0), 0
                current.started_s = last_said_start = t
        elif current is None and not pending:
            if (not loop.answering and loop.turns.state is TurnState.LISTENING and loop.vad.state is VadState.SILENCE
                    and room.played.end_s <= t - 0.5):
                break
        user = np.zeros(n, np.float32)
        if current is not None:
            part = current.pcm[pos:pos + n].astype(np.float32) / 32768.0
            user[:len(part)] = part
            pos += n
            if pos >= len(current.pcm):
                current = None
        mic = user + room.echo(k, k + n) + noise * rng.standard_normal(n).astype(np.float32)
        pcm = to_pcm16(mic)
        scene.mic.append(pcm)
        chunk = AudioChunk(pcm, ASR_RATE, k)
        if stage is not None:
            chunk = stage(chunk)
        scene.fed.append(chunk.pcm)
        loop.feed(chunk)
        if on_chunk is not None:
            on_chunk(k)
        k += n
    loop.finish()
    return scene
