"""The small protocols the voice loop's collaborators implement: the engines (real ones behind each), the clock it runs on
and the sink it plays into."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from .llm import Persona, Usage

#: The rate the endpointer and the ASR work at.
ASR_RATE = 16000


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str
    audio_s: float  # length of the audio transcribed
    compute_ms: float  # wall time of the transcription
    #: A speculative transcription that came out degenerate and was not retried (the retry reads the whole 30 s
    #: window: ~640 ms here, while the loop reads no input): not to be used; transcribe again at the endpoint.
    retry: bool = False


class Transcriber(Protocol):
    """Utterance audio (float32 mono at ``ASR_RATE``, -1..1) -> text.  ``speculative``: the utterance may not be
    over (a pause); a transcriber may then skip its slow retries and say so (``Transcript.retry``).  ``short``: the
    turn is late (``voice.mitigation``): a faster, less careful transcription if it has one.  ``prompt``: the words
    to expect (Whisper's initial prompt) for this call: None the transcriber's own vocabulary, "" none."""

    def transcribe(self, audio: np.ndarray, *, speculative: bool = False, short: bool = False,
                   prompt: str | None = None) -> Transcript: ...


class Synthesizer(Protocol):
    """Text -> PCM16 mono chunks at ``sample_rate``, the first one as early as possible."""

    sample_rate: int

    def synthesize(self, text: str) -> Iterator[np.ndarray]: ...


@dataclass(frozen=True, slots=True)
class FunctionCallPiece:
    """A piece of a tool call in a reply (OpenAI-compatible backends only): ``delta`` is the new part of its JSON
    ``arguments`` (all of them so far in ``arguments``); the last piece of a call has ``done`` set."""

    call_id: str
    name: str
    delta: str
    arguments: str
    done: bool


class TokenStream(Protocol):
    """A conversation with the LLM: text pieces of the reply to a user turn, as they come (and ``FunctionCallPiece``s
    from a backend that calls tools; ``user_text`` None: go on after a tool's result)."""

    def reply(self, user_text: str | None) -> Iterator[str | FunctionCallPiece]: ...


class Conversation(TokenStream, Protocol):
    """The LLM's side of the conversation: ``voice.llm.LLMConversation`` on our decode core,
    ``voice.openai_llm.OpenAIConversation`` on an OpenAI-compatible backend.  All of it, so that no caller probes for a
    member: the voice loop uses the first group, the Realtime session (``server/session.py``) the rest.

    ``reply`` streams the answer to a user turn, ``commit`` records the turn as it was heard, ``amend_last`` shortens
    the last recorded answer (less of it was heard), ``prepare`` prefills the context the next turn starts with and
    returns the tokens computed; ``sim_elapsed_s`` is the simulated time the reply in progress (or the last one) has
    taken on the deployment the decode core runs on (None when it runs on no simulated deployment)."""

    persona: Persona
    max_tokens: int
    #: the next reply's own instructions (a Realtime ``response.create``'s), for that reply only
    instructions: str | None
    last_usage: Usage | None  # the last reply's token counts
    #: Chat Completions function tools and tool_choice, used only where ``calls_tools``
    tools: tuple[dict, ...]
    tool_choice: str | dict | None

    def commit(self, user_text: str | None, spoken: str) -> None: ...

    def sim_elapsed_s(self) -> float | None: ...

    def amend_last(self, spoken: str) -> None: ...

    def prepare(self) -> int: ...

    # -- the session's ------------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int: ...

    @property
    def calls_tools(self) -> bool:
        """Replies may call tools (``FunctionCallPiece``s), whose results ``add_function_output`` takes."""
        ...

    def add_function_output(self, call_id: str, output: str) -> None: ...

    def warmup(self) -> None: ...

    def close(self) -> None: ...

    def reset(self) -> None: ...

    def context(self) -> list[dict]: ...

    def scoring_context(self) -> list[dict]:
        """What the end-of-turn score (``voice.turn_end``) reads the user's text after."""
        ...

    def opening_tokens(self, persona: Persona | None = None) -> int: ...

    def prompt_tokens(self, user_text: str) -> int: ...

    def with_persona(self, persona: Persona) -> Conversation:
        """A new conversation like this one (same sequence or backend) with ``persona``; its history starts afresh."""
        ...


class Clock(Protocol):
    """Seconds since the session began (``voice.clock``).  ``advance_to(t)`` lets time reach ``t`` (the real clock waits,
    a virtual one jumps); compute runs inside ``with working():`` (a virtual clock adds its duration)."""

    realtime: bool

    def now(self) -> float: ...

    def advance_to(self, t: float) -> None: ...

    def working(self) -> AbstractContextManager[None]: ...


class Sink(Protocol):
    """Where the agent's audio goes: ``play`` PCM16 at ``Synthesizer.sample_rate`` starting at clock time ``t``;
    ``clear_after(t)`` drops what would play after ``t`` (a barge-in)."""

    def play(self, t: float, pcm: np.ndarray) -> None: ...

    def clear_after(self, t: float) -> None: ...
