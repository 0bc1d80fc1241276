"""The small protocols the pipeline's engines implement (real engines behind each)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

#: The rate the endpointer and the ASR work at.
ASR_RATE = 16000


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str
    audio_s: float  # length of the audio transcribed
    compute_ms: float  # wall time of the transcription


class Transcriber(Protocol):
    """Utterance audio (float32 mono at ``ASR_RATE``, -1..1) -> text."""

    def transcribe(self, audio: np.ndarray) -> Transcript: ...


class Synthesizer(Protocol):
    """Text -> PCM16 mono chunks at ``sample_rate``, the first one as early as possible."""

    sample_rate: int

    def synthesize(self, text: str) -> Iterator[np.ndarray]: ...


class TokenStream(Protocol):
    """A conversation with the LLM: text pieces of the reply to a user turn, as they come."""

    def reply(self, user_text: str) -> Iterator[str]: ...
