"""The LLM stage on an OpenAI-compatible backend (``--llm URL``): any server with a streaming
``/v1/chat/completions`` (llama.cpp's server, vLLM, SGLang, a hosted API) in place of the local decode core.

``OpenAIConversation`` is a ``voice.protocols.Conversation`` like ``voice.llm.LLMConversation``: the same persona
and grounding (the "Fact:" message after the user's), the same history as heard, the same ``last_usage``.  The
reply streams through the ``openai`` SDK (server-sent events on a kept-alive connection); closing the reply (a
barge-in, a cancel, a dropped speculation) closes that response's connection, which tells the backend to stop.

Tools: with ``tools`` set (the Realtime session's, in the Chat Completions shape), a reply may yield
``FunctionCallPiece``s instead of text; the call is kept in the history (an assistant message with
``tool_calls``), ``add_function_output`` adds its result, and ``reply(None)`` asks the backend to go on from there.

Nothing here runs on the decode core: ``sim_elapsed_s()`` is None and ``prepare()`` computes nothing (a backend
keeps its own prefix cache, where it has one).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import openai

from .errors import LLMBackendError
from .llm import Persona, Usage
from .protocols import FunctionCallPiece

#: What the backend may take to start its answer and between two of its chunks, before the turn fails.
READ_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Backend:
    """Where the chat completions come from: ``base_url`` ends in ``/v1`` (or whatever prefix the server's
    ``/chat/completions`` lives under); ``model`` is sent as is (the backend's own default when None).  Requests go
    through the ``openai`` SDK's client (one per backend, its connections kept alive between replies): it reads the
    event stream, retries a failed connection or a 5xx ``max_retries`` times, and times out; ``create`` maps what it
    raises onto ``LLMBackendError``."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = READ_TIMEOUT_S
    #: a turn waits for each retry (the SDK's back-off starts at half a second): one, then the turn fails
    max_retries: int = 1
    _client: openai.OpenAI = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        u = urlsplit(self.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"--llm: '{self.base_url}' is not an http(s) URL (e.g. http://127.0.0.1:8080/v1)")
        client = openai.OpenAI(base_url=self.base_url.rstrip("/"), api_key=self.api_key or "unused", max_retries=self.max_retries,
                               timeout=openai.Timeout(self.timeout_s, connect=CONNECT_TIMEOUT_S))
        object.__setattr__(self, "_client", client)

    @property
    def name(self) -> str:
        return f"{self.model or 'default model'} at {self.base_url}"

    def create(self, **body) -> Iterator:
        """``chat.completions.create(**body)`` (``stream=True``: the chunks as they come), else ``LLMBackendError``
        with the backend's own error message.  No key: no ``Authorization`` header at all."""
        try:
            return self._client.chat.completions.create(model=self.model or openai.omit, **body,
                                                        extra_headers=None if self.api_key else {"Authorization": openai.omit})
        except openai.APIStatusError as e:
            raise LLMBackendError(f"the LLM backend at {self.base_url} answered HTTP {e.status_code}: {_error_text(e)}") from None
        except openai.APIError as e:
            raise LLMBackendError(f"the LLM backend at {self.base_url} cannot be reached: {_why(e)}") from None

    def check(self) -> None:
        """Fail early, in one line, when the backend cannot answer: a one-token completion."""
        self.create(messages=[{"role": "user", "content": "Hi"}], max_tokens=1, stream=False)


def _why(e: BaseException) -> str:
    """A connection failure in a few words: its cause's (``Connection refused``), or that it timed out."""
    if isinstance(e, openai.APITimeoutError | TimeoutError):
        return "timed out"
    cause = e.__cause__ or e
    return getattr(cause, "strerror", None) or str(cause) or type(cause).__name__


def _error_text(e: openai.APIError) -> str:
    """The message of an OpenAI-style error (the SDK keeps the body's ``error`` object), else the body's start."""
    body = e.body
    if isinstance(body, dict):
        msg = body.get("message")
        return (msg if isinstance(msg, str) and msg else json.dumps(body))[:300]
    if isinstance(body, str) and body.strip():
        return body.strip()[:300]
    return "(no body)"


def _chunks(stream, backend: Backend) -> Iterator:
    """The chunks of a streamed completion, with what can go wrong mid-answer turned into ``LLMBackendError``."""
    try:
        yield from stream
    except openai.APIConnectionError as e:  # (a timeout is one)
        raise LLMBackendError(f"the LLM backend at {backend.base_url} stopped mid-answer: {_why(e)}") from None
    except openai.APIError as e:  # an error event in the stream
        raise LLMBackendError(f"the LLM backend failed mid-answer: {_error_text(e)}") from None
    except ValueError as e:  # an event that is not JSON
        doc = getattr(e, "doc", "")
        raise LLMBackendError(f"the LLM backend sent an event that is not JSON: {doc[:120]!r}") from None


def chat_tool(tool: dict) -> dict:
    """A Realtime function tool (``{"type": "function", "name", "description", "parameters"}``) in the Chat
    Completions shape."""
    fn = {"name": tool["name"]}
    for k in ("description", "parameters"):
        if k in tool:
            fn[k] = tool[k]
    return {"type": "function", "function": fn}


def chat_tool_choice(choice) -> str | dict | None:
    """A Realtime ``tool_choice`` ("auto" / "none" / "required" / ``{"type": "function", "name"}``) in the Chat
    Completions shape."""
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return choice


@dataclass
class OpenAIConversation:
    """A ``Conversation`` over an OpenAI-compatible chat completions backend."""

    backend: Backend
    persona: Persona = field(default_factory=Persona)
    max_tokens: int = 48
    temperature: float = 0.0
    #: Earlier exchanges sent with each turn (None = all): a larger model uses them well, and the prompt stays bounded.
    history_turns: int | None = 8
    tools: tuple[dict, ...] = ()  # Chat Completions function tools
    tool_choice: str | dict | None = None
    history: list[dict] = field(default_factory=list)  # every turn, as heard (tool calls and results included)
    last_usage: Usage | None = None
    #: the per-response instructions of the next reply only (``response.create``'s), else the persona's
    instructions: str | None = None

    def __post_init__(self):
        self._opening = self.persona.opening()
        self._calls: list[dict] = []  # the last reply's tool calls, for its assistant message
        self._elapsed: float | None = None

    # -- what the Conversation protocol asks ----------------------------------------------------------

    def warmup(self) -> None:
        self.backend.check()

    def prepare(self) -> int:
        return 0

    def sim_elapsed_s(self) -> float | None:
        return None

    def context(self) -> list[dict]:
        """The opening and the last ``history_turns`` exchanges (a tool call and its result stay with their turn)."""
        turns = self.history
        if self.history_turns == 0:
            turns = []
        elif self.history_turns is not None:
            starts = [i for i, m in enumerate(turns) if m["role"] == "user"]
            if len(starts) > self.history_turns:
                turns = turns[starts[-self.history_turns]:]
        return self._opening + turns

    def scoring_context(self) -> list[dict]:
        """What the local end-of-turn score reads the user's text after: the persona's opening (its prefix stays in the
        scorer's cache; the history is the backend's)."""
        return self._opening

    @property
    def n_ctx(self) -> int:
        """The backend's context is not known here: a bound for what a session sends (the backend says if it is less)."""
        return 32768

    @property
    def calls_tools(self) -> bool:
        return True

    def with_persona(self, persona: Persona) -> OpenAIConversation:
        return self.fork(persona)

    def fork(self, persona: Persona | None = None) -> OpenAIConversation:
        """A new conversation on the same backend (a session's), with ``persona`` (this one's by default)."""
        return OpenAIConversation(self.backend, persona=persona or self.persona, max_tokens=self.max_tokens,
                                  temperature=self.temperature, history_turns=self.history_turns)

    def close(self) -> None:
        """Nothing is held between replies (each has its own connection)."""

    def opening_tokens(self, persona: Persona | None = None) -> int:
        """A rough count (4 characters a token): the backend's tokenizer is not ours."""
        msgs = self._opening if persona is None else persona.opening()
        return sum(len(m["content"]) for m in msgs) // 4

    def prompt_tokens(self, user_text: str) -> int:
        return sum(len(m.get("content") or "") for m in self._messages(user_text)) // 4

    def _messages(self, user_text: str | None) -> list[dict]:
        msgs = self.context()
        if self.instructions is not None:
            msgs = [{"role": "system", "content": self.instructions}] + msgs[1:]
        if user_text is None:  # go on after a tool's result
            return msgs
        previous = next((m["content"] for m in reversed(self.history) if m["role"] == "user"), None)
        turn, _start = self.persona.turn(user_text, previous)
        return msgs + turn

    def reply(self, user_text: str | None) -> Iterator[str | FunctionCallPiece]:
        """Text pieces of the answer to ``user_text`` (None: go on from the conversation as it stands, after a tool's
        result), and ``FunctionCallPiece``s when the backend calls a tool; raises ``LLMBackendError`` when the backend
        cannot answer.  Closing it closes the HTTP stream."""
        body = {"messages": self._messages(user_text), "stream": True, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "stream_options": {"include_usage": True}}
        if self.tools:
            body["tools"] = list(self.tools)
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        self._calls = []
        self.instructions = None
        t0 = time.monotonic()
        stream = self.backend.create(**body)
        calls: dict[int, dict] = {}  # by the stream's index
        usage = None
        out = 0
        finished = False
        try:
            for ev in _chunks(stream, self.backend):
                usage = ev.usage or usage
                for choice in ev.choices or ():
                    finished = finished or bool(choice.finish_reason)
                    delta = choice.delta
                    if delta is None:
                        continue
                    if delta.content:
                        out += 1
                        yield delta.content
                    for tc in delta.tool_calls or ():
                        yield from self._call_delta(calls, tc)
            if not finished:  # (llama.cpp's server, failing after its headers, just ends the stream)
                raise LLMBackendError(f"the LLM backend at {self.backend.base_url} ended its answer without a finish_reason "
                                      "(it failed mid-answer; its log says why)")
            for c in calls.values():  # the calls are complete when the stream ends
                self._calls.append({"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}})
                yield FunctionCallPiece(call_id=c["id"], name=c["name"], delta="", arguments=c["arguments"], done=True)
        finally:
            stream.close()  # (a barge-in's close drops the connection: the backend stops)
            self._elapsed = time.monotonic() - t0
            details = getattr(usage, "prompt_tokens_details", None)
            self.last_usage = Usage(input_tokens=int(getattr(usage, "prompt_tokens", 0) or self.prompt_tokens(user_text or "")),
                                    cached_tokens=int(getattr(details, "cached_tokens", 0) or 0),
                                    output_tokens=int(getattr(usage, "completion_tokens", 0) or out))

    @staticmethod
    def _call_delta(calls: dict, tc) -> Iterator[FunctionCallPiece]:
        index = len(calls) if tc.index is None else tc.index
        name = getattr(tc.function, "name", None)
        c = calls.get(index)
        if c is None:
            c = calls[index] = {"id": tc.id or f"call_{index}_{int(time.time() * 1000)}", "name": name or "", "arguments": ""}
        elif name and not c["name"]:
            c["name"] = name
        piece = getattr(tc.function, "arguments", None) or ""
        if piece:
            c["arguments"] += piece
            yield FunctionCallPiece(call_id=c["id"], name=c["name"], delta=piece, arguments=c["arguments"], done=False)

    def commit(self, user_text: str | None, spoken: str) -> None:
        """Record the turn as it was heard (a tool-call reply keeps its calls)."""
        if user_text is not None:
            self.history.append({"role": "user", "content": user_text})
        msg = {"role": "assistant", "content": spoken.strip()}
        if self._calls:
            msg["tool_calls"], self._calls = self._calls, []
        if msg["content"] or "tool_calls" in msg:
            self.history.append(msg)

    def add_function_output(self, call_id: str, output: str) -> None:
        self.history.append({"role": "tool", "tool_call_id": call_id, "content": output})

    def amend_last(self, spoken: str) -> None:
        if self.history and self.history[-1]["role"] == "assistant":
            self.history[-1] = dict(self.history[-1], content=spoken.strip())

    def reset(self) -> None:
        self.history = []

