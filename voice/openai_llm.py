"""The LLM stage on an OpenAI-compatible backend (``--llm URL``): any server with a streaming
``/v1/chat/completions`` (llama.cpp's server, vLLM, SGLang, a hosted API) in place of the local decode core.

``OpenAIConversation`` is a ``voice.protocols.Conversation`` like ``voice.llm.LLMConversation``: the same persona
and grounding (the "Fact:" message after the user's), the same history as heard, the same ``last_usage``.  The
reply streams over one HTTP connection (server-sent events, read with the standard library); closing the reply
(a barge-in, a cancel, a dropped speculation) closes that connection, which tells the backend to stop.

Tools: with ``tools`` set (the Realtime session's, in the Chat Completions shape), a reply may yield
``FunctionCallPiece``s instead of text; the call is kept in the history (an assistant message with
``tool_calls``), ``add_function_output`` adds its result, and ``reply(None)`` asks the backend to go on from there.

Nothing here runs on the decode core: ``sim_elapsed_s()`` is None and ``prepare()`` computes nothing (a backend
keeps its own prefix cache, where it has one).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .errors import LLMBackendError
from .llm import Persona, Usage
from .protocols import FunctionCallPiece

#: What the backend may take to start its answer and between two of its chunks, before the turn fails.
READ_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
#: Largest SSE line taken from a backend (a chunk is a few hundred bytes).
MAX_LINE = 1 << 20


@dataclass(frozen=True, slots=True)
class Backend:
    """Where the chat completions come from: ``base_url`` ends in ``/v1`` (or whatever prefix the server's
    ``/chat/completions`` lives under); ``model`` is sent as is (the backend's own default when None)."""

    base_url: str
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = READ_TIMEOUT_S

    def __post_init__(self):
        u = urlsplit(self.base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"--llm: '{self.base_url}' is not an http(s) URL (e.g. http://127.0.0.1:8080/v1)")

    @property
    def name(self) -> str:
        return f"{self.model or 'default model'} at {self.base_url}"

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, str]:
        u = urlsplit(self.base_url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        return cls(u.hostname, u.port, timeout=timeout), u.path.rstrip("/")

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def post(self, path: str, body: dict) -> http.client.HTTPResponse:
        """POST ``body`` to ``base_url + path``; the open response (status 200), else ``LLMBackendError`` with the
        backend's own error message."""
        conn, prefix = self._connection(CONNECT_TIMEOUT_S)
        try:
            conn.request("POST", prefix + path, body=json.dumps(body).encode(), headers=self._headers())
            conn.sock.settimeout(self.timeout_s)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise LLMBackendError(f"the LLM backend at {self.base_url} cannot be reached: {_why(e)}") from None
        if resp.status != 200:
            detail = _error_text(resp.read(64 * 1024))
            conn.close()
            raise LLMBackendError(f"the LLM backend at {self.base_url} answered HTTP {resp.status}: {detail}")
        return resp

    def check(self) -> None:
        """Fail early, in one line, when the backend cannot answer: a one-token completion."""
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": False}
        if self.model:
            body["model"] = self.model
        self.post("/chat/completions", body).read()


def _why(e: BaseException) -> str:
    if isinstance(e, socket.timeout | TimeoutError):
        return "timed out"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _error_text(raw: bytes) -> str:
    """The message of an OpenAI-style error body, else the body's start."""
    text = raw.decode("utf-8", "replace")
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
    except (ValueError, AttributeError):
        pass
    return text.strip()[:300] or "(no body)"


def sse_events(resp) -> Iterator[dict]:
    """The JSON objects of a ``text/event-stream`` body (``data:`` lines; ``[DONE]`` ends it)."""
    data: list[str] = []
    while True:
        line = resp.readline(MAX_LINE)
        if not line:
            return
        line = line.decode("utf-8", "replace").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
            continue
        if line or not data:
            continue  # comments (": keep-alive"), event names, ids, blank lines between events
        payload, data = "\n".join(data), []
        if payload == "[DONE]":
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            raise LLMBackendError(f"the LLM backend sent an event that is not JSON: {payload[:120]!r}") from None
        if isinstance(obj, dict) and "error" in obj:
            raise LLMBackendError(f"the LLM backend failed mid-answer: {_error_text(payload.encode())}")
        if isinstance(obj, dict):
            yield obj


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
        if self.backend.model:
            body["model"] = self.backend.model
        if self.tools:
            body["tools"] = list(self.tools)
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        self._calls = []
        self.instructions = None
        t0 = time.monotonic()
        resp = self.backend.post("/chat/completions", body)
        calls: dict[int, dict] = {}  # by the stream's index
        usage = None
        out = 0
        finished = False
        try:
            for ev in _guarded(sse_events(resp), self.backend):
                usage = ev.get("usage") or usage
                for choice in ev.get("choices") or ():
                    finished = finished or bool(choice.get("finish_reason"))
                    delta = choice.get("delta") or {}
                    text = delta.get("content")
                    if text:
                        out += 1
                        yield text
                    for tc in delta.get("tool_calls") or ():
                        yield from self._call_delta(calls, tc)
            if not finished:  # (llama.cpp's server, failing after its headers, just ends the stream)
                raise LLMBackendError(f"the LLM backend at {self.backend.base_url} ended its answer without a finish_reason "
                                      "(it failed mid-answer; its log says why)")
            for c in calls.values():  # the calls are complete when the stream ends
                self._calls.append({"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}})
                yield FunctionCallPiece(call_id=c["id"], name=c["name"], delta="", arguments=c["arguments"], done=True)
        finally:
            resp.close()
            self._elapsed = time.monotonic() - t0
            prompt = (usage or {}).get("prompt_tokens")
            cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            self.last_usage = Usage(input_tokens=int(prompt or self.prompt_tokens(user_text or "")), cached_tokens=int(cached),
                                    output_tokens=int((usage or {}).get("completion_tokens") or out))

    @staticmethod
    def _call_delta(calls: dict, tc: dict) -> Iterator[FunctionCallPiece]:
        index = tc.get("index", len(calls))
        fn = tc.get("function") or {}
        c = calls.get(index)
        if c is None:
            c = calls[index] = {"id": tc.get("id") or f"call_{index}_{int(time.time() * 1000)}", "name": fn.get("name") or "",
                                "arguments": ""}
        elif fn.get("name") and not c["name"]:
            c["name"] = fn["name"]
        piece = fn.get("arguments") or ""
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


def _guarded(events: Iterator[dict], backend: Backend) -> Iterator[dict]:
    """``events``, with a dropped or stalled connection turned into ``LLMBackendError``."""
    try:
        yield from events
    except (OSError, http.client.HTTPException) as e:
        raise LLMBackendError(f"the LLM backend at {backend.base_url} stopped mid-answer: {_why(e)}") from None
