"""A session's recording (``wafervox mic --record DIR``, ``wafervox serve --record DIR``): one stereo WAV, the user on
the left and the agent on the right on the loop's one clock, and the session's turns as JSON beside it.

``SessionRecording.attach(loop)`` follows a running ``VoiceLoop`` from the outside: its input as the loop stored it
(16 kHz, after any echo canceller: what the loop heard), each piece placed at the clock time the loop gives its first
sample; its output through a sink wrapper (added at ``play(t, pcm)``, cut at ``clear_after(t)``: what was played, as
``BufferSink`` keeps it); its turns from the loop's ``TurnEnded`` events (each report's ``to_dict()`` and its stamps, in seconds on the
WAV's time axis), and barge-ins.
``close()`` writes ``NAME.wav`` (PCM16, two channels, at the agent's rate; the user's side resampled to it) and
``NAME.json``.  Both tracks are held in memory as PCM16 until then (about 80 KB a second).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from .audio import BufferSink, TeeSink, resample, to_pcm16
from .protocols import ASR_RATE


class SessionRecording:
    def __init__(self, directory, name: str, rate: int):
        self.dir = Path(directory)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.name = f"{stamp}-{os.getpid()}-{name}"
        self.rate = rate  # the agent's (the sink's) rate, the WAV's
        self.agent = BufferSink(rate)
        self.user: list[tuple[float, np.ndarray]] = []  # (clock time of the first sample, 16 kHz PCM16)
        self.turns: list[dict] = []
        self.barge_ins: list[dict] = []
        self.started = time.time()
        self.paths: tuple[Path, Path] | None = None
        self._loop = None

    @classmethod
    def start(cls, directory, name: str, rate: int) -> SessionRecording:
        """A recording into ``directory`` (made if missing; an ``OSError`` when it cannot be)."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        return cls(directory, name, rate)

    # -- following a loop ---------------------------------------------------------------------------------------------

    def attach(self, loop) -> None:
        """Follow ``loop`` from now on: its sink, its input and its events are wrapped (nothing else changes)."""
        self._loop = loop
        loop.sink = TeeSink(loop.sink, self.agent)  # the loop's own sink, and the recording's agent track
        feed = loop.feed

        def recorded_feed(chunk) -> None:
            start = loop.input.end_sample
            feed(chunk)
            end = loop.input.end_sample
            if end > start:
                self.user.append((loop.audio_time(start), to_pcm16(loop.input.utterance(start, end, 0))))

        loop.feed = recorded_feed
        on_event = loop.on_event

        def recorded_event(ev) -> None:
            self.event(ev)
            if on_event is not None:
                on_event(ev)

        loop.on_event = recorded_event

    def event(self, ev) -> None:
        from .loop_events import TurnEnded

        if isinstance(ev, TurnEnded) and ev.report is not None:  # (its stamps: seconds on the WAV's time axis)
            self.turns.append({**ev.report.to_dict(), "stamps": {k: round(v, 4) for k, v in ev.report.stamps.items()}})

    # -- the files ----------------------------------------------------------------------------------------------------

    def tracks(self) -> np.ndarray:
        """(samples, 2) PCM16 at ``rate``: the user on channel 0, the agent on channel 1, on one clock from 0."""
        user_end = max((t + len(p) / ASR_RATE for t, p in self.user), default=0.0)
        agent = self.agent.render()
        n = max(len(agent), int(np.ceil(user_end * self.rate)))
        out = np.zeros((n, 2), np.int16)
        out[:len(agent), 1] = agent
        if self.user:
            t0 = self.user[0][0]
            left = np.zeros(int(np.ceil((user_end - t0) * ASR_RATE)) + 1, np.int16)
            for t, p in self.user:  # contiguous input, placed by its clock time (input that jumped is placed anew)
                i = int(round((t - t0) * ASR_RATE))
                left[i:i + len(p)] = p[:len(left) - i]
            left = resample(left, ASR_RATE, self.rate)
            i = max(0, int(round(t0 * self.rate)))
            m = min(len(left), n - i)
            out[i:i + m, 0] = left[:m]
        return out

    def close(self) -> tuple[Path, Path] | None:
        """Write the WAV and the JSON (once); returns their paths."""
        if self.paths is not None:
            return self.paths
        import soundfile as sf

        loop = self._loop
        if loop is not None:
            self.barge_ins = [{"speech_s": b.speech_s, "detected_s": b.detected_s, "stopped_s": b.stopped_s}
                              for b in getattr(loop, "barge_ins", [])]
        data = self.tracks()
        self.dir.mkdir(parents=True, exist_ok=True)
        wav, meta = self.dir / f"{self.name}.wav", self.dir / f"{self.name}.json"
        sf.write(str(wav), data, self.rate, subtype="PCM_16")
        meta.write_text(json.dumps({"session": self.name, "wav": wav.name, "rate": self.rate, "channels": ["user", "agent"],
                                    "started_unix": self.started, "duration_s": len(data) / self.rate,
                                    "turns": self.turns, "barge_ins": self.barge_ins}, indent=1))
        self.paths = (wav, meta)
        return self.paths
