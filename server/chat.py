"""``POST /v1/chat/completions`` on the websocket server's own port, answered by the decode core, so that any
OpenAI client can use it (``base_url="http://HOST:PORT/v1"``).

websockets' HTTP parser takes GET requests only (anything else gets 400 before ``process_request`` runs), so every
TCP connection starts with a sniffer: ``sniffing()`` is ``serve``'s ``create_connection``, and the
``SniffingConnection`` it makes looks at the first four bytes before websockets sees any.  ``GET `` hands the
connection back to websockets untouched (the handshake and ``process_request``'s routes, ``GET /v1/models``
included); any other method goes to ``HttpProtocol``, a small HTTP/1.1 server for one request a connection.

As in the rest of the server: sans-I/O cores (``RequestReader`` parses a request, ``parse_chat`` checks a body and
maps it onto the decode core's terms, ``StopScanner`` cuts streamed text at stop strings, and the response
builders), a thin asyncio shell (the sniffer, ``HttpProtocol``, ``ChatAPI``), and each completion decoded on a
thread of its own (``_Decode``) on a fork of the shared decode core's generator, so the event loop only does I/O.
A completion holds one of the server's ``max_sessions`` slots while it decodes (its fork is as big as a
session's KV cache), so the memory ``serve`` plans for at start-up still holds.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection

from decode import GREEDY, ContextLengthError, SamplingParams
from decode.generate import common_prefix

from .memory import trim

log = logging.getLogger("wafervox.server")
CHAT_PATH = "/v1/chat/completions"
MAX_HEAD_BYTES = 16 << 10  # request line and headers (431 past it)
MAX_BODY_BYTES = 1 << 20  # a request body (413 past it)
SNIFF_TIMEOUT_S = 10.0  # a connection's first bytes (websockets' own open_timeout)
REQUEST_TIMEOUT_S = 30.0  # a whole request, head and body (408 past it)
LINGER_S = 2.0  # after an error answered before the body was read: the body is read and dropped this long, then closed
DEFAULT_MAX_TOKENS = 512  # when the request names none (the context's room caps it either way)
#: temperature > 0 samples among this many most likely tokens, then top_p (llama.cpp's server does the same)
TOP_K = 40
MAX_STOPS = 4
TRIM_INTERVAL_S = 5.0
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str = "invalid_request_error", headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type, self.headers = status, message, code, param, type, headers

    def body(self) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}).encode()


# -- HTTP requests (sans-I/O) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Head:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names; a repeated header's values joined with ", "
    content_length: int | None

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def expects_continue(self) -> bool:
        return self.headers.get("expect", "").lower() == "100-continue"


@dataclass(frozen=True, slots=True)
class Body:
    data: bytes


class RequestReader:
    """Bytes in (``feed``), one request out (``next_event``: a ``Head``, then a ``Body``, else None while more bytes
    are needed); a malformed or oversized request raises ``ApiError`` with the status to answer.  A POST needs a
    Content-Length (no chunked bodies); other methods carry no body."""

    def __init__(self, max_head: int = MAX_HEAD_BYTES, max_body: int = MAX_BODY_BYTES):
        self.max_head, self.max_body = max_head, max_body
        self._buf = bytearray()
        self.head: Head | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_event(self) -> Head | Body | None:
        if self.done:
            return None
        if self.head is None:
            end = self._buf.find(b"\r\n\r\n")
            if (len(self._buf) if end < 0 else end + 4) > self.max_head:
                raise ApiError(431, f"the request line and headers are over {self.max_head} bytes", code="request_too_large")
            if end < 0:
                return None
            self.head = _parse_head(bytes(self._buf[:end]), self.max_body)
            del self._buf[:end + 4]
            return self.head
        n = self.head.content_length or 0
        if len(self._buf) < n:
            return None
        self.done = True
        body, self._buf = bytes(self._buf[:n]), bytearray()
        return Body(body)


def _parse_head(raw: bytes, max_body: int) -> Head:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1] or not parts[2].startswith(b"HTTP/1."):
        raise ApiError(400, "malformed request line", code="bad_request")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise ApiError(400, f"malformed header line {line[:60]!r}", code="bad_request")
        key, val = name.decode("ascii").lower(), value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {val}" if key in headers else val
    method = parts[0].decode("ascii")
    if "transfer-encoding" in headers:
        raise ApiError(411, "send the body with a Content-Length header (chunked request bodies are not accepted)",
                       code="length_required")
    length = headers.get("content-length")
    if length is not None:
        values = {v.strip() for v in length.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit():
            raise ApiError(400, f"bad Content-Length {length!r}", code="bad_request")
        length = int(next(iter(values)))
        if length > max_body:
            raise ApiError(413, f"the body is {length} bytes; the limit is {max_body}", code="request_too_large")
    elif method == "POST":
        raise ApiError(411, "a POST needs a Content-Length header", code="length_required")
    return Head(method=method, target=parts[1].decode("latin-1"), headers=headers, content_length=length)


# -- the request body (sans-I/O) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: tuple[dict, ...]  # {"role", "content"}, content a string: what the chat template takes
    max_tokens: int | None
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def parse_chat(body: bytes) -> ChatRequest:
    """A ``/v1/chat/completions`` body checked and mapped onto the decode core: messages (system, developer,
    user, assistant; string content or text parts), ``max_tokens``/``max_completion_tokens``, ``temperature``
    (0 or absent: greedy, as the voice turns decode), ``top_p``, ``seed``, ``stop``, ``stream`` and
    ``stream_options.include_usage``.  What this model cannot do (tools, ``n`` > 1, logprobs, structured output,
    audio) is refused with 400; unknown fields and the penalties are ignored."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_type")
    if data.get("messages") is None:
        raise ApiError(400, "missing required parameter: 'messages'", code="missing_required_parameter", param="messages")
    tools = data.get("tools") or data.get("functions")
    if tools and data.get("tool_choice", data.get("function_call")) != "none":
        raise ApiError(400, "this server's model (a 135M local model) cannot call tools; send the request without 'tools' "
                       "(or with tool_choice 'none')", code="tools_not_supported", param="tools")
    messages = _messages(data["messages"])
    stream = _get(data, "stream", bool, False)
    options = _get(data, "stream_options", dict, {})
    include_usage = _get(options, "include_usage", bool, False, "stream_options.include_usage")
    n = _get(data, "n", int, 1)
    if n != 1:
        raise ApiError(400, f"n={n}: this server returns one choice per request", code="unsupported_value", param="n")
    if _get(data, "logprobs", bool, False):
        raise ApiError(400, "logprobs are not supported", code="unsupported_value", param="logprobs")
    fmt = _get(data, "response_format", dict, {"type": "text"})
    if fmt.get("type") != "text":
        raise ApiError(400, f"response_format {fmt.get('type')!r} is not supported (only 'text')", code="unsupported_value",
                       param="response_format")
    if "audio" in (_get(data, "modalities", list, []) or []):
        raise ApiError(400, "this endpoint answers in text; speech is on the websocket (/v1/realtime)", code="unsupported_value",
                       param="modalities")
    max_tokens = _get(data, "max_completion_tokens", int, None)
    if max_tokens is None:
        max_tokens = _get(data, "max_tokens", int, None)
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}", code="invalid_value", param="max_tokens")
    return ChatRequest(messages=messages, max_tokens=max_tokens, sampling=_sampling(data), stop=_stops(data.get("stop")),
                       stream=stream, include_usage=include_usage)


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", dict: "an object", list: "an array", str: "a string"}


def _get(data: dict, name: str, kind: type, default, param: str | None = None):
    value = data.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise ApiError(400, f"'{param or name}' must be {_TYPE_NAMES[kind]}, got {json.dumps(value)[:40]}", code="invalid_type",
                       param=param or name)
    return value


def _text(value: str, param: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"'{param}' holds a lone surrogate (not valid Unicode)", code="invalid_unicode", param=param) from None
    return value


def _messages(value) -> tuple[dict, ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty array", code="invalid_type", param="messages")
    out = []
    for i, m in enumerate(value):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"'{at}' must be an object", code="invalid_type", param=at)
        role = m.get("role")
        if role in ("tool", "function") or m.get("tool_calls") or m.get("function_call"):
            raise ApiError(400, f"'{at}' is a tool call or result: this server's model cannot call tools", code="tools_not_supported",
                           param=at)
        if role not in ("system", "developer", "user", "assistant"):
            raise ApiError(400, f"'{at}.role' must be one of system, developer, user, assistant; got {json.dumps(role)}",
                           code="invalid_value", param=f"{at}.role")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else None
                    raise ApiError(400, f"'{at}.content[{j}]' must be a text part ({{\"type\": \"text\", \"text\": ...}}); "
                                   f"got type {json.dumps(kind)}: this model reads text only", code="invalid_value",
                                   param=f"{at}.content[{j}]")
                texts.append(part["text"])
            content = "\n".join(texts)
        if not isinstance(content, str):
            raise ApiError(400, f"'{at}.content' must be a string or an array of text parts", code="invalid_type",
                           param=f"{at}.content")
        out.append({"role": "system" if role == "developer" else role, "content": _text(content, f"{at}.content")})
    return tuple(out)


def _sampling(data: dict) -> SamplingParams:
    temperature = _get(data, "temperature", float, 0.0)
    top_p = _get(data, "top_p", float, 1.0)
    seed = _get(data, "seed", int, None)
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"temperature must be in [0, 2], got {temperature}", code="invalid_value", param="temperature")
    if not 0 <= top_p <= 1:
        raise ApiError(400, f"top_p must be in [0, 1], got {top_p}", code="invalid_value", param="top_p")
    if temperature == 0 or top_p == 0:
        return GREEDY
    return SamplingParams(temperature=float(temperature), top_k=TOP_K, top_p=float(top_p), repetition_penalty=1.0,
                          seed=None if seed is None else seed % (1 << 64))


def _stops(value) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value if value is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, f"'stop' must be a non-empty string or an array of at most {MAX_STOPS} of them", code="invalid_value",
                       param="stop")
    return tuple(_text(s, "stop") for s in stops)


class StopScanner:
    """Streamed text in, the text that may go out: a stop string ends the text before it (``stopped``); a piece's
    tail that could begin one is held back until the next pieces decide.  Feeding the text whole or in any pieces
    gives the same output."""

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped or not text:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        cuts = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.stopped, self.held = True, ""
            return buf[:min(cuts)]
        keep = max((k for s in self.stops for k in range(min(len(s) - 1, len(buf)), 0, -1) if buf.endswith(s[:k])), default=0)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out


# -- responses (sans-I/O) --------------------------------------------------------------------------


def usage(prompt: int, cached: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def completion_object(cid: str, created: int, model: str, text: str, finish: str, use: dict) -> dict:
    return {"id": cid, "object": "chat.completion", "created": created, "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}, "logprobs": None,
                         "finish_reason": finish}], "usage": use}


def chunk_object(cid: str, created: int, model: str, delta: dict | None, finish: str | None = None, *,
                 include_usage: bool = False, use: dict | None = None) -> dict:
    """A ``chat.completion.chunk``; ``delta`` None: the usage chunk (no choices).  With ``include_usage`` every chunk
    carries ``usage`` (null but on the last)."""
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "system_fingerprint": None,
           "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if include_usage:
        out["usage"] = use
    return out


def sse(obj: dict | str) -> bytes:
    return b"data: " + (obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))).encode() + b"\n\n"


def response_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Server: wafervox", "Connection: close", "Cache-Control: no-store",
             *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


# -- the sniffer: which connections websockets gets ------------------------------------------------


def sniffing(other: Callable[[asyncio.Transport], asyncio.Protocol], undecided: set, timeout_s: float = SNIFF_TIMEOUT_S):
    """``create_connection`` for websockets' ``serve``: connections that start with ``GET `` stay websockets'; any
    other goes to the protocol ``other(transport)`` makes.  ``undecided`` holds the transports whose first bytes have
    not come yet (for the server to abort when it stops)."""

    def create(*args, **kwargs) -> SniffingConnection:
        return SniffingConnection(other, undecided, timeout_s, *args, **kwargs)

    return create


class SniffingConnection(ServerConnection):
    """websockets' connection, made when the TCP connection is accepted as usual, but started (``connection_made``,
    which starts websockets' handler task) only once the request's first bytes say GET; until then a ``_Sniffer`` is
    the transport's protocol."""

    def __init__(self, other, undecided: set, timeout_s: float, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._other, self._sniffing, self._sniff_timeout_s = other, undecided, timeout_s

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.set_protocol(_Sniffer(self, transport, self._sniff_timeout_s))
        self._sniffing.add(transport)

    def _to_websockets(self, transport: asyncio.Transport, data: bytes) -> None:
        transport.set_protocol(self)
        super().connection_made(transport)
        self.data_received(data)

    def _to_http(self, transport: asyncio.Transport, data: bytes) -> None:
        proto = self._other(transport)
        transport.set_protocol(proto)
        proto.connection_made(transport)
        proto.data_received(data)


class _Sniffer(asyncio.Protocol):
    def __init__(self, conn: SniffingConnection, transport, timeout_s: float):
        self.conn, self.transport = conn, transport
        self.buf = b""
        self.timer = asyncio.get_running_loop().call_later(timeout_s, transport.abort)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        n = min(len(self.buf), 4)
        if self.buf[:n] == b"GET "[:n] and n < 4:
            return
        self.timer.cancel()
        self.conn._sniffing.discard(self.transport)
        if n == 4 and self.buf[:4] == b"GET ":
            self.conn._to_websockets(self.transport, self.buf)
        else:
            self.conn._to_http(self.transport, self.buf)

    def eof_received(self) -> bool:
        return False  # closes

    def connection_lost(self, exc) -> None:
        self.timer.cancel()
        self.conn._sniffing.discard(self.transport)


# -- one HTTP connection ---------------------------------------------------------------------------


class HttpProtocol(asyncio.Protocol):
    """One request, one response, then the connection closes.  ``api.check_head`` judges the head before the body is
    read, ``api.handle`` answers the whole request; an error answered before the body was read is followed by a short
    linger (the client's body read and dropped), so that the client reads the answer instead of a reset."""

    def __init__(self, api: ChatAPI, transport: asyncio.Transport):
        self.api, self.transport = api, transport
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if peer else "?"
        self.reader = RequestReader(api.max_head, api.max_body)
        self.loop = asyncio.get_running_loop()
        self.timer = self.loop.call_later(REQUEST_TIMEOUT_S, self._timeout)
        self.task: asyncio.Task | None = None
        self.closed = False  # the connection is gone (or going): nothing more is written
        self.on_lost: Callable[[], None] | None = None  # the completion in progress, to stop
        self._lingering = False
        self._sent = False  # a response has begun
        self._paused = False
        self._drained: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.api.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.task is not None or self._lingering or self.closed:
            return  # past the one request: dropped
        self.reader.feed(data)
        try:
            while (ev := self.reader.next_event()) is not None:
                if isinstance(ev, Head):
                    err = self.api.check_head(ev, self.address)
                    if err is not None:
                        self.fail(err)
                        return
                    if ev.expects_continue and ev.content_length:
                        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                else:
                    self.timer.cancel()
                    self.task = self.loop.create_task(self.api.handle(self, ev.data))
                    self.task.add_done_callback(self._handled)
                    return
        except ApiError as e:
            self.fail(e)

    def _handled(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug: this request fails, the server goes on
            log.error("a chat completion request failed", exc_info=task.exception())
            if self._sent:
                self.close()
            else:
                self.respond(500, ApiError(500, "internal error", type="server_error", code="server_error").body())

    def eof_received(self) -> bool:
        self._lost()  # a client that stops sending has gone: its completion stops
        return False

    def connection_lost(self, exc) -> None:
        self._lost()
        self.api.connections.discard(self)

    def _lost(self) -> None:
        self.closed = True
        self.timer.cancel()
        if self.on_lost is not None:
            self.on_lost()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        while self._paused and not self.closed:
            self._drained = self.loop.create_future()
            await self._drained

    def write(self, data: bytes) -> None:
        if not self.closed and data:
            self._sent = True
            self.transport.write(data)

    def respond(self, status: int, body: bytes, ctype: str = "application/json", headers=()) -> None:
        self.write(response_head(status, [("Content-Type", ctype), ("Content-Length", str(len(body))), *headers]) + body)
        self.close()

    def fail(self, err: ApiError) -> None:
        """Answer ``err``; before the body is read, linger for it."""
        self.api.count_error(err)
        if self.reader.done:
            self.respond(err.status, err.body(), headers=err.headers)
            return
        self.write(response_head(err.status, [("Content-Type", "application/json"), ("Content-Length", str(len(err.body()))),
                                              *err.headers]) + err.body())
        self._lingering = True
        self.timer.cancel()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.timer = self.loop.call_later(LINGER_S, self.close)

    def close(self) -> None:
        self.closed = True
        self.transport.close()

    def _timeout(self) -> None:
        if self.task is None and not self._lingering:
            self.fail(ApiError(408, f"the request did not arrive within {REQUEST_TIMEOUT_S:g} s", code="request_timeout"))


# -- the API ---------------------------------------------------------------------------------------


class ChatAPI:
    """The OpenAI-compatible HTTP side of a ``VoiceServer``: its checks (rate, route, token, size, capacity), the
    completions in progress, ``GET /v1/models``'s answer."""

    def __init__(self, shared, *, metrics, ids: Callable[[str], str], limiter, token: str | None, max_sessions: int,
                 sessions: Callable[[], int], max_head: int = MAX_HEAD_BYTES, max_body: int = MAX_BODY_BYTES):
        self.shared, self.metrics, self.ids, self.limiter, self.token = shared, metrics, ids, limiter, token
        self.max_sessions, self.sessions = max_sessions, sessions
        self.max_head, self.max_body = max_head, max_body
        self.generator = shared.generator  # the one sessions fork (with --llm too: this endpoint's answers are local)
        self.model_id = Path(str(self.generator.model.file.path)).stem
        self.connections: set[HttpProtocol] = set()
        self.sniffing: set[asyncio.BaseTransport] = set()  # connections whose first bytes have not come yet
        self.jobs: set[_Decode] = set()  # completions decoding (each holds a session slot until its thread ends)

    @property
    def active(self) -> int:
        return len(self.jobs)

    def connection(self, transport: asyncio.Transport) -> HttpProtocol:
        return HttpProtocol(self, transport)

    def create_connection(self):
        """websockets' ``serve(create_connection=...)``: GET stays websockets', the rest comes here."""
        return sniffing(self.connection, self.sniffing)

    def models(self) -> dict:
        return {"object": "list", "data": [self.model()]}

    def model(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "wafervox"}

    # -- checks ------------------------------------------------------------------------------------

    def check_token(self, authorization: str | None) -> ApiError | None:
        if not self.token:
            return None
        offered = authorization[7:].strip() if authorization and authorization.lower().startswith("bearer ") else None
        if offered is not None and hmac.compare_digest(offered.encode(), self.token.encode()):
            return None
        self.metrics.rejected.labels("token").inc()
        what = "missing" if offered is None else "wrong"
        return ApiError(401, f"{what} API key: send 'Authorization: Bearer <token>' with the server's token (its --token)",
                        code="invalid_api_key")

    def check_head(self, head: Head, address: str) -> ApiError | None:
        if not self.limiter.allow(address):
            self.metrics.rejected.labels("rate").inc()
            return ApiError(429, f"too many requests from {address}: at most {self.limiter.rate:g} a second; retry shortly",
                            type="requests", code="rate_limit_exceeded", headers=(("Retry-After", "1"),))
        if head.method not in ("GET", "POST"):
            return ApiError(405, f"method {head.method} is not allowed: POST {CHAT_PATH}, GET elsewhere",
                            code="method_not_allowed", headers=(("Allow", "GET, POST"),))
        if head.path != CHAT_PATH:
            return ApiError(404, f"not found: {head.method} {head.path} (POST is answered at {CHAT_PATH} only)", code="not_found")
        return self.check_token(head.headers.get("authorization"))

    def count_error(self, err: ApiError) -> None:
        if err.code and err.status not in (401, 429):  # those two are counted as refused connections
            self.metrics.error(err.code)

    # -- a completion ------------------------------------------------------------------------------

    async def handle(self, conn: HttpProtocol, body: bytes) -> None:
        try:
            req = await asyncio.to_thread(parse_chat, body)  # up to a megabyte of JSON: not on the event loop
        except ApiError as e:
            conn.fail(e)
            return
        if conn.closed:  # the client left meanwhile
            return
        if self.sessions() + self.active >= self.max_sessions:
            self.metrics.rejected.labels("full").inc()
            conn.fail(ApiError(503, f"server full: {self.max_sessions} sessions and completions in progress; retry shortly",
                               type="server_error", code="server_full", headers=(("Retry-After", "1"),)))
            return
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def post(ev: tuple) -> None:  # from the decode thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:  # the event loop is gone (shutting down)
                job.cancelled.set()

        cid = self.ids("chatcmpl")
        job = _Decode(self.shared, req, post, name=cid)
        self.jobs.add(job)
        job.on_end = lambda: self._ended(loop, job)
        conn.on_lost = job.cancelled.set
        job.thread.start()
        await _Reply(self, conn, req, events, cid).run()

    def _ended(self, loop, job) -> None:  # from the decode thread, when its fork is closed
        try:
            loop.call_soon_threadsafe(self.jobs.discard, job)
        except RuntimeError:
            self.jobs.discard(job)

    async def close(self) -> None:
        """The server is stopping: completions stop, connections close, decode threads are waited for."""
        for job in list(self.jobs):
            job.cancelled.set()
        tasks = [c.task for c in self.connections if c.task is not None]
        for transport in [c.transport for c in self.connections] + list(self.sniffing):
            transport.abort()
        for job in list(self.jobs):
            await asyncio.to_thread(job.thread.join, 10)
        if tasks:
            await asyncio.wait(tasks, timeout=10)


class _Reply:
    """A completion's events from its decode thread, written as one JSON answer or as server-sent events."""

    def __init__(self, api: ChatAPI, conn: HttpProtocol, req: ChatRequest, events: asyncio.Queue, cid: str):
        self.api, self.conn, self.req, self.events = api, conn, req, events
        self.cid, self.created, self.model = cid, int(time.time()), api.model_id

    async def run(self) -> None:
        ev = await self.events.get()  # ("error", ...) and ("end", ...) are the last a decode thread posts
        if ev[0] == "error":
            self.conn.fail(ev[1])
            return
        _, prompt, cached = ev
        if self.req.stream:
            await self._stream(prompt, cached)
        else:
            texts = []
            while (ev := await self.events.get())[0] == "text":
                texts.append(ev[1])
            if ev[0] == "error":
                self._count("error", prompt, 0)
                self.conn.fail(ev[1])
                return
            finish, out = ev[1], ev[2]
            self._count(finish, prompt, out)
            if finish is not None:
                body = completion_object(self.cid, self.created, self.model, "".join(texts), finish, usage(prompt, cached, out))
                self.conn.respond(200, json.dumps(body).encode())

    async def _stream(self, prompt: int, cached: int) -> None:
        conn, inc = self.conn, self.req.include_usage

        def chunk(delta, finish=None, use=None):
            return chunked(sse(chunk_object(self.cid, self.created, self.model, delta, finish, include_usage=inc, use=use)))

        conn.write(response_head(200, [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")]))
        conn.write(chunk({"role": "assistant", "content": "", "refusal": None}))
        while (ev := await self.events.get())[0] == "text":
            conn.write(chunk({"content": ev[1]}))
            await conn.drain()
        if ev[0] == "error":
            err = ev[1]
            self._count("error", prompt, 0)
            self.api.count_error(err)
            conn.write(chunked(sse({"error": json.loads(err.body())["error"]})))
        else:
            finish, out = ev[1], ev[2]
            self._count(finish, prompt, out)
            if finish is not None:
                conn.write(chunk({}, finish))
                if inc:
                    conn.write(chunk(None, use=usage(prompt, cached, out)))
        conn.write(chunked(sse("[DONE]")) + b"0\r\n\r\n")
        conn.close()

    def _count(self, finish: str | None, prompt: int, out: int) -> None:
        m = self.api.metrics
        m.completions.labels(finish or "client_gone").inc()
        m.completion_tokens.labels("prompt").inc(prompt)
        m.completion_tokens.labels("completion").inc(out)


class _Decode:
    """One completion's decoding on a thread of its own: the prompt from the model's chat template, a fork of the
    shared generator (made on the compute thread, as a session's is), the text handed to ``post`` as it comes:
    ``("start", prompt_tokens, cached_tokens)``, ``("text", str)``..., then ``("end", finish, completion_tokens)``
    (finish None: cancelled), or ``("error", ApiError)`` instead.  ``cancelled`` (the client went away) stops it
    after the token in progress; the fork is closed either way."""

    def __init__(self, shared, req: ChatRequest, post: Callable[[tuple], None], name: str):
        self.shared, self.req, self.post = shared, req, post
        self.cancelled = threading.Event()
        self.on_end: Callable[[], None] = lambda: None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self._decode()
        except ApiError as e:
            self.post(("error", e))
        except Exception as e:  # a bug, or the engine failing: this completion fails, the server goes on
            log.exception("%s failed", self.thread.name)
            self.post(("error", ApiError(500, f"the completion failed: {type(e).__name__}: {e}", type="server_error",
                                         code="server_error")))
        finally:
            self.on_end()

    def _decode(self) -> None:
        base = self.shared.generator
        try:
            ids = base.encode_chat(list(self.req.messages))
        except Exception as e:  # the model's template refused the messages (e.g. a role order it does not take)
            raise ApiError(400, f"the model's chat template refused the messages: {e}", code="invalid_value", param="messages") from None
        n_ctx = base.n_ctx
        if len(ids) >= n_ctx:
            raise ApiError(400, f"the messages are {len(ids)} tokens; this model's context holds {n_ctx} (prompt and answer "
                           "together): shorten them", code="context_length_exceeded", param="messages")
        max_tokens = min(self.req.max_tokens or DEFAULT_MAX_TOKENS, n_ctx - len(ids))
        gen = self.shared.compute.call(base.fork)
        try:
            cached = max(0, min(common_prefix(gen.cached, ids), len(ids) - 1))
            self.post(("start", len(ids), cached))
            stream = gen.stream(ids, max_tokens=max_tokens, sampling=self.req.sampling)
            scanner = StopScanner(self.req.stop)
            out, finish = 0, None
            try:
                for piece in stream:
                    if self.cancelled.is_set():
                        break
                    out += piece.token_id >= 0
                    if text := scanner.feed(piece.text):
                        self.post(("text", text))
                    if scanner.stopped:
                        finish = "stop"
                        break
                else:
                    if tail := scanner.flush():
                        self.post(("text", tail))
                    finish = "stop" if gen.last.finish_reason == "stop" else "length"  # context_full: length
            except ContextLengthError as e:
                raise ApiError(400, str(e), code="context_length_exceeded", param="messages") from None
            finally:
                stream.close()
            self.post(("end", finish, out))
        finally:
            gen.close()
            trim(TRIM_INTERVAL_S)
