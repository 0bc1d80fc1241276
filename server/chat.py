"""``POST /v1/chat/completions`` on the server's own port, answered by the decode core, so that any OpenAI client can
use it (``base_url="http://HOST:PORT/v1"``).

Sans-I/O cores (``parse_chat`` checks a body and maps it onto the decode core's terms, ``StopScanner`` cuts streamed
text at stop strings, and the response builders), a thin ASGI shell (``ChatAPI.handle``: the request's checks, its
body, the answer, plain or as server-sent events) behind uvicorn, which parses HTTP, and each completion decoded on a
thread of its own (``_Decode``) on a fork of the shared decode core's generator, so that the event loop only does I/O.
A completion holds one of the server's ``max_sessions`` slots while it decodes (its fork is as big as a session's KV
cache), so the memory ``serve`` plans for at start-up still holds.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from decode import GREEDY, ContextLengthError, SamplingParams
from decode.generate import common_prefix

from .asgi import Receive, Send, respond
from .memory import trim

log = logging.getLogger("wafervox.server")
CHAT_PATH = "/v1/chat/completions"
MAX_BODY_BYTES = 1 << 20  # a request body (413 past it)
BODY_TIMEOUT_S = 30.0  # a request's body, from its head on (408 past it)
LINGER_S = 2.0  # after an error answered before the body was read: the body is read and dropped this long, then closed
DEFAULT_MAX_TOKENS = 512  # when the request names none (the context's room caps it either way)
#: temperature > 0 samples among this many most likely tokens, then top_p (llama.cpp's server does the same)
TOP_K = 40
MAX_STOPS = 4
TRIM_INTERVAL_S = 5.0

class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str = "invalid_request_error", headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type, self.headers = status, message, code, param, type, headers

    def body(self) -> bytes:
        return json.dumps({"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}).encode()



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


# -- the ASGI shell --------------------------------------------------------------------------------


class _Request:
    """What the checks need of an ASGI ``http`` scope (uvicorn parsed it: the names are lower case)."""

    def __init__(self, scope: dict):
        self.method, self.path = scope["method"], scope["path"]
        self.address = scope["client"][0] if scope.get("client") else "?"
        self.headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            key, val = k.decode("latin-1"), v.decode("latin-1")
            self.headers[key] = f"{self.headers[key]}, {val}" if key in self.headers else val
        length = self.headers.get("content-length")
        self.length = int(length) if length is not None and length.isdigit() else None
        self.chunked = "transfer-encoding" in self.headers
        #: a body may still be on its way (unless the client waits for a 100 Continue that an early answer never sends)
        self.body_pending = (self.chunked or bool(self.length)) and self.headers.get("expect", "").lower() != "100-continue"


class ChatAPI:
    """The OpenAI-compatible HTTP side of a ``VoiceServer``: every request but a GET comes here.  Its checks (size,
    rate, route, token, capacity), the completions in progress, ``GET /v1/models``'s answer."""

    def __init__(self, shared, *, metrics, ids: Callable[[str], str], limiter, token: str | None, max_sessions: int,
                 sessions: Callable[[], int], max_body: int = MAX_BODY_BYTES):
        self.shared, self.metrics, self.ids, self.limiter, self.token = shared, metrics, ids, limiter, token
        self.max_sessions, self.sessions, self.max_body = max_sessions, sessions, max_body
        self.generator = shared.generator  # the one sessions fork (with --llm too: this endpoint's answers are local)
        self.model_id = Path(str(self.generator.model.file.path)).stem
        self.jobs: set[_Decode] = set()  # completions decoding (each holds a session slot until its thread ends)

    @property
    def active(self) -> int:
        return len(self.jobs)

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

    def check_framing(self, req: _Request) -> ApiError | None:
        """The body's framing, judged on the head before anything else (uvicorn has refused malformed heads)."""
        if req.chunked:
            return ApiError(411, "send the body with a Content-Length header (chunked request bodies are not accepted)",
                            code="length_required")
        if req.length is not None and req.length > self.max_body:
            return ApiError(413, f"the body is {req.length} bytes; the limit is {self.max_body}", code="request_too_large")
        if req.length is None and req.method == "POST":
            return ApiError(411, "a POST needs a Content-Length header", code="length_required")
        return None

    def check_head(self, req: _Request) -> ApiError | None:
        if not self.limiter.allow(req.address):
            self.metrics.rejected.labels("rate").inc()
            return ApiError(429, f"too many requests from {req.address}: at most {self.limiter.rate:g} a second; retry shortly",
                            type="requests", code="rate_limit_exceeded", headers=(("Retry-After", "1"),))
        if req.method not in ("GET", "POST"):
            return ApiError(405, f"method {req.method} is not allowed: POST {CHAT_PATH}, GET elsewhere",
                            code="method_not_allowed", headers=(("Allow", "GET, POST"),))
        if req.path != CHAT_PATH:
            return ApiError(404, f"not found: {req.method} {req.path} (POST is answered at {CHAT_PATH} only)", code="not_found")
        return self.check_token(req.headers.get("authorization"))

    def count_error(self, err: ApiError) -> None:
        if err.code and err.status not in (401, 429):  # those two are counted as refused connections
            self.metrics.error(err.code)

    async def refuse(self, send: Send, receive: Receive, err: ApiError, body_pending: bool) -> None:
        """Answer ``err``; while the client may still be sending its body, linger for it (read and dropped) so that it
        reads the answer instead of a reset."""
        self.count_error(err)
        await respond(send, err.status, err.body(), headers=err.headers, more=body_pending)
        if not body_pending:
            return
        try:
            async with asyncio.timeout(LINGER_S):
                while (msg := await receive())["type"] == "http.request" and msg.get("more_body"):
                    pass
        except TimeoutError:
            pass
        await send({"type": "http.response.body", "body": b""})

    # -- a request ---------------------------------------------------------------------------------

    async def handle(self, scope: dict, receive: Receive, send: Send) -> None:
        """An ASGI ``http`` request whose method is not GET."""
        req = _Request(scope)
        err = self.check_framing(req) or self.check_head(req)
        if err is not None:
            await self.refuse(send, receive, err, req.body_pending)
            return
        parts = []
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return  # the client left
                    parts.append(msg.get("body", b""))
                    if not msg.get("more_body"):
                        break
        except TimeoutError:
            err = ApiError(408, f"the request's body did not arrive within {BODY_TIMEOUT_S:g} s", code="request_timeout")
            await self.refuse(send, receive, err, True)
            return
        await self.complete(b"".join(parts), receive, send)

    async def complete(self, body: bytes, receive: Receive, send: Send) -> None:
        try:
            req = await asyncio.to_thread(parse_chat, body)  # up to a megabyte of JSON: not on the event loop
        except ApiError as e:
            await self.refuse(send, receive, e, False)
            return
        if self.sessions() + self.active >= self.max_sessions:
            self.metrics.rejected.labels("full").inc()
            await self.refuse(send, receive, ApiError(503, f"server full: {self.max_sessions} sessions and completions in "
                                                      "progress; retry shortly", type="server_error", code="server_full",
                                                      headers=(("Retry-After", "1"),)), False)
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
        job.thread.start()
        gone = asyncio.create_task(_watch(receive, job.cancelled.set))  # a client that leaves stops its completion
        try:
            await _Reply(self, send, receive, req, events, cid).run()
        finally:
            gone.cancel()

    def _ended(self, loop, job) -> None:  # from the decode thread, when its fork is closed
        try:
            loop.call_soon_threadsafe(self.jobs.discard, job)
        except RuntimeError:
            self.jobs.discard(job)

    async def close(self) -> None:
        """The server is stopping: completions stop, their decode threads are waited for."""
        for job in list(self.jobs):
            job.cancelled.set()
        for job in list(self.jobs):
            await asyncio.to_thread(job.thread.join, 10)


async def _watch(receive: Receive, on_gone: Callable[[], None]) -> None:
    """Once the body is read, the next ASGI message is ``http.disconnect``: the client left (or the answer ended)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    on_gone()


class _Reply:
    """A completion's events from its decode thread, written as one JSON answer or as server-sent events."""

    def __init__(self, api: ChatAPI, send: Send, receive: Receive, req: ChatRequest, events: asyncio.Queue, cid: str):
        self.api, self.send, self.receive, self.req, self.events = api, send, receive, req, events
        self.cid, self.created, self.model = cid, int(time.time()), api.model_id

    async def run(self) -> None:
        ev = await self.events.get()  # ("error", ...) and ("end", ...) are the last a decode thread posts
        if ev[0] == "error":
            await self.api.refuse(self.send, self.receive, ev[1], False)
            return
        _, prompt, cached = ev
        if self.req.stream:
            await self._stream(prompt, cached)
            return
        texts = []
        while (ev := await self.events.get())[0] == "text":
            texts.append(ev[1])
        if ev[0] == "error":
            self._count("error", prompt, 0)
            await self.api.refuse(self.send, self.receive, ev[1], False)
            return
        finish, out = ev[1], ev[2]
        self._count(finish, prompt, out)
        if finish is not None:
            body = completion_object(self.cid, self.created, self.model, "".join(texts), finish, usage(prompt, cached, out))
            await respond(self.send, 200, json.dumps(body).encode())

    async def _stream(self, prompt: int, cached: int) -> None:
        inc = self.req.include_usage

        async def write(data: bytes) -> None:  # waits while the client's socket is full
            await self.send({"type": "http.response.body", "body": data, "more_body": True})

        def chunk(delta, finish=None, use=None) -> bytes:
            return sse(chunk_object(self.cid, self.created, self.model, delta, finish, include_usage=inc, use=use))

        # no Content-Length: HTTP/1.1's chunked transfer coding, by uvicorn
        await self.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await write(chunk({"role": "assistant", "content": "", "refusal": None}))
        while (ev := await self.events.get())[0] == "text":
            await write(chunk({"content": ev[1]}))
        if ev[0] == "error":
            err = ev[1]
            self._count("error", prompt, 0)
            self.api.count_error(err)
            await write(sse({"error": json.loads(err.body())["error"]}))
        else:
            finish, out = ev[1], ev[2]
            self._count(finish, prompt, out)
            if finish is not None:
                await write(chunk({}, finish))
                if inc:
                    await write(chunk(None, use=usage(prompt, cached, out)))
        await self.send({"type": "http.response.body", "body": sse("[DONE]")})

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

