"""Playing recorded conversations through the voice loop (the main job, ``wafervox run``)."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import numpy as np

from .audio import AudioChunk, BufferSink, chunks, read_wav, resample
from .clock import RealClock, VirtualClock
from .latency import TurnReport
from .loop import Engines, LoopConfig, VoiceLoop, run_stream, run_until
from .loop_events import LoopEvent, PhraseStarted
from .protocols import ASR_RATE

#: The bundled recordings and their manifest (the ``samples`` package's data, wherever it is installed).
SAMPLES = Path(str(resources.files("samples")))


def manifest(samples: Path = SAMPLES) -> dict:
    path = samples / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"no sample manifest at {path}")
    return json.loads(path.read_text())


def conversation_files(name: str = "default", samples: Path = SAMPLES) -> list[Path]:
    m = manifest(samples)
    convs = m.get("conversations", {})
    if name not in convs:
        raise KeyError(f"no conversation {name!r} in the samples (have: {', '.join(convs)})")
    return [samples / f for f in convs[name]]


def words(text: str) -> list[str]:
    """A transcript's words as they are scored: lower case, punctuation (hyphens too) as spaces, apostrophes kept."""
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def edit_distance(a: list, b: list) -> int:
    """Levenshtein distance: the fewest insertions, deletions and substitutions that turn ``a`` into ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word edits (``edit_distance`` of ``words``) over the reference's words."""
    ref = words(reference)
    return edit_distance(ref, words(hypothesis)) / max(1, len(ref))


def play_conversation(engines: Engines, files, realtime: bool = True, config: LoopConfig | None = None,
                      on_report=None, sink=None, chunk_ms: int = 20) -> tuple[list[TurnReport], VoiceLoop]:
    """Feed ``files`` one after another into one loop (one conversation, history kept);
    each file's answer plays out before the next file starts."""
    clock = RealClock() if realtime else VirtualClock()
    sink = sink or BufferSink(engines.tts.sample_rate)
    loop = VoiceLoop(engines, sink, clock, config, on_report=on_report)
    loop.file_offsets = []  # input time at which each file started
    for f in files:
        pcm, rate = read_wav(f)
        pcm = resample(pcm, rate, ASR_RATE)  # a whole file resamples exactly; live input streams through soxr
        loop.file_offsets.append(loop.input_time)
        run_stream(loop, chunks(pcm, ASR_RATE, chunk_ms))
    loop.finish()
    return loop.reports, loop


def play_overlap(engines: Engines, question: Path, sound: Path, after_s: float = 0.6, config: LoopConfig | None = None,
                 chunk_ms: int = 20, max_wait_s: float = 10.0) -> tuple[VoiceLoop, list[LoopEvent], float]:
    """Ask ``question``; ``after_s`` after the answer's first audio starts, make ``sound`` over the answer (a
    backchannel, a cough, an interruption: ``samples/overlap``), then let the loop finish.  On the virtual clock (the
    engines' compute time charged to it).  Returns the loop, its events and the input time at which ``sound`` began."""
    events: list[LoopEvent] = []
    loop = VoiceLoop(engines, BufferSink(engines.tts.sample_rate), VirtualClock(), config, on_event=events.append)
    pcm, rate = read_wav(question)
    run_stream(loop, chunks(resample(pcm, rate, ASR_RATE), ASR_RATE, chunk_ms), drain=False)
    n = ASR_RATE * chunk_ms // 1000
    silence = np.zeros(n, np.int16)
    end = loop.input_time + max_wait_s
    while loop.input_time < end:
        start = next((e.start_s for e in events if isinstance(e, PhraseStarted)), None)
        if start is not None and loop.input_time >= start + after_s:
            break
        run_until(loop, loop.input_time + n / ASR_RATE)
        loop.feed(AudioChunk(silence, ASR_RATE, 0))
    else:
        raise RuntimeError(f"no answer to {question.name} within {max_wait_s:g} s")
    at = loop.input_time
    pcm, rate = read_wav(sound)
    run_stream(loop, chunks(resample(pcm, rate, ASR_RATE), ASR_RATE, chunk_ms), drain=False)
    loop.finish()
    return loop, events, at
