"""Playing recorded conversations through the voice loop (the main job, ``wafervox run``)."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from .audio import BufferSink, chunks, read_wav, resample
from .clock import RealClock, VirtualClock
from .latency import TurnReport
from .loop import Engines, LoopConfig, VoiceLoop, run_stream
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
