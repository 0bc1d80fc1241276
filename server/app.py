"""``wafervox serve``: the asyncio websockets adapter around ``RealtimeSession``.

The event loop only does I/O: HTTP routes (``/`` the demo page, ``/static/*``, ``/healthz``,
``/metrics``, ``/v1/models``), the handshake checks (token, Origin, session count), reading client messages
into their session, and writing each session's output with a bounded buffer.  Sessions compute
on their own threads (``server.session``), sharing the engines loaded once (``SharedEngines``).
Requests other than GET (``POST /v1/chat/completions``) never reach websockets: ``server.http_api`` answers them.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import mimetypes
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from voice.loop import LoopConfig

from .http_api import CHAT_PATH, ApiError, ChatAPI
from .memory import trim
from .metrics import CONTENT_TYPE, Metrics
from .realtime import IdSource, ProtocolError
from .session import Limits, RealtimeSession

log = logging.getLogger("wafervox.server")
STATIC = Path(__file__).parent / "static"
WS_PATHS = ("/v1/realtime", "/v1/stream")
KEY_SUBPROTOCOL = "openai-insecure-api-key."


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None  # required bearer token (header, subprotocol or ?token=)
    origins: tuple[str, ...] = ()  # allowed browser Origins besides the server's own
    limits: Limits = field(default_factory=Limits)
    loop_config: LoopConfig = field(default_factory=LoopConfig)
    connect_rate: float = 10.0  # connections (websocket or HTTP) per second per client address, in bursts of 2 s worth


class RateLimiter:
    """A token bucket per client address: ``rate`` a second, holding at most ``burst``.  Addresses whose bucket is
    full again are forgotten once many are tracked, so the table stays small."""

    def __init__(self, rate: float, burst: float, clock=time.monotonic, max_tracked: int = 4096):
        self.rate, self.burst, self.clock, self.max_tracked = rate, burst, clock, max_tracked
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, when)

    def allow(self, address: str) -> bool:
        now = self.clock()
        tokens, when = self._buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        ok = tokens >= 1.0
        self._buckets[address] = (tokens - 1.0 if ok else tokens, now)
        if len(self._buckets) > self.max_tracked:
            self._buckets = {a: (t, w) for a, (t, w) in self._buckets.items()
                             if min(self.burst, t + (now - w) * self.rate) < self.burst}
        return ok


class _Ids:
    """One id source for the whole server (ids unique across sessions), safe across session threads."""

    def __init__(self):
        self._ids = IdSource()
        self._lock = threading.Lock()

    def __call__(self, prefix: str) -> str:
        with self._lock:
            return self._ids(prefix)


class _Outbox:
    """A session's output towards a client: filled from the session thread, emptied by a sender task.
    Audio beyond ``limit`` queued bytes is dropped with one ``error`` event per overflow; a client
    that lets even the events pile up past twice the limit is disconnected."""

    def __init__(self, ws: ServerConnection, loop: asyncio.AbstractEventLoop, limit: int, metrics: Metrics):
        self.ws, self.loop, self.limit, self.metrics = ws, loop, limit, metrics
        self.queue: deque[str | bytes] = deque()
        self.bytes = 0
        self.dropping = False
        self.ready = asyncio.Event()
        self.session: RealtimeSession | None = None
        self.closed = False

    def emit(self, frame: str | bytes, droppable: bool) -> None:  # any thread
        try:
            self.loop.call_soon_threadsafe(self._put, frame, droppable)
        except RuntimeError:  # the event loop is gone (server shutting down)
            pass

    def close(self, code: int, reason: str) -> None:  # any thread
        try:
            self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.ws.close(code, reason)))
        except RuntimeError:
            pass

    def _put(self, frame: str | bytes, droppable: bool) -> None:
        if self.closed:
            return
        n = len(frame)
        if droppable and self.bytes + n > self.limit:
            self.metrics.dropped.inc(n)
            if not self.dropping:
                self.dropping = True
                err = ProtocolError("output_buffer_full", f"the client is not reading: more than {self.limit} bytes of output "
                                    "are queued; audio is being dropped", type="server_error")
                self.metrics.error(err.code)
                self._put(self.session.proto.error(err).to_json(), False)
            return
        if not droppable and self.bytes + n > 2 * self.limit:
            self.closed = True
            self.metrics.error("client_not_reading")
            asyncio.ensure_future(self.ws.close(1008, "client is not reading its output"))
            return
        self.queue.append(frame)
        self.bytes += n
        self.ready.set()

    async def run(self) -> None:
        while True:
            await self.ready.wait()
            while self.queue:
                frame = self.queue.popleft()
                try:
                    await self.ws.send(frame)  # waits while the socket's write buffer is full
                finally:
                    self.bytes -= len(frame)
                if self.dropping and self.bytes < self.limit // 2:
                    self.dropping = False
            self.ready.clear()


class VoiceServer:
    def __init__(self, shared, options: ServerOptions | None = None, metrics: Metrics | None = None):
        self.shared = shared
        self.opts = options or ServerOptions()
        self.metrics = metrics or Metrics()
        self.ids = _Ids()
        self._conns: dict[ServerConnection, RealtimeSession] = {}  # the open sessions, by their connection
        self._n = 0
        self.port: int | None = None
        self._server = None
        self.limiter = RateLimiter(self.opts.connect_rate, max(1.0, 2 * self.opts.connect_rate))
        self._metrics_page: tuple[float, bytes] | None = None  # rendered at most once a second
        self._trim_handle: asyncio.TimerHandle | None = None  # the trim after the last connection closed
        #: POST /v1/chat/completions (and any request but a GET); its completions share the sessions' slots
        self.chat = ChatAPI(shared, metrics=self.metrics, ids=self.ids, limiter=self.limiter, token=self.opts.token,
                            max_sessions=self.opts.limits.max_sessions, sessions=lambda: len(self._conns))

    # -- HTTP and the handshake --------------------------------------------------------------------

    def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        path = url.path
        address = conn.remote_address[0] if conn.remote_address else "?"
        if not self.limiter.allow(address):
            self.metrics.rejected.labels("rate").inc()
            body = f"too many connections from {address}: at most {self.opts.connect_rate:g} a second; retry shortly\n".encode()
            response = _response(HTTPStatus.TOO_MANY_REQUESTS, body, "text/plain")
            response.headers["Retry-After"] = "1"
            return response
        if path in WS_PATHS:
            return self._check_ws(conn, request, parse_qs(url.query))
        if path == "/healthz":
            body = {"status": "ok", "sessions": len(self._conns), "completions": self.chat.active,
                    "max_sessions": self.opts.limits.max_sessions}
            return _response(HTTPStatus.OK, json.dumps(body).encode(), "application/json")
        if path == "/v1/models" or path.startswith("/v1/models/") or path == CHAT_PATH:
            return self._openai_get(path, request)
        if path == "/metrics":  # rendered here on the event loop from counters alone: no session or compute is touched
            now = time.monotonic()
            if self._metrics_page is None or now - self._metrics_page[0] >= 1.0:
                self._metrics_page = (now, self.metrics.render())
            return _response(HTTPStatus.OK, self._metrics_page[1], CONTENT_TYPE)
        if path == "/" or path.startswith("/static/"):
            name = "index.html" if path == "/" else path[len("/static/"):]
            f = (STATIC / name).resolve()
            if f.parent == STATIC.resolve() and f.is_file():
                ctype = mimetypes.guess_type(f.name)[0] or "application/octet-stream"
                if ctype.startswith("text/") or ctype.endswith("javascript"):
                    ctype += "; charset=utf-8"
                return _response(HTTPStatus.OK, f.read_bytes(), ctype)
        return _response(HTTPStatus.NOT_FOUND, f"not found: {path}\n".encode(), "text/plain")

    def _openai_get(self, path: str, request: Request) -> Response:
        """``GET /v1/models`` (and ``/v1/models/ID``) in the OpenAI shapes, behind the same token as the rest."""
        err = self.chat.check_token(request.headers.get("Authorization"))
        if err is None and path == CHAT_PATH:
            err = ApiError(405, f"use POST for {CHAT_PATH}", code="method_not_allowed", headers=(("Allow", "POST"),))
        if err is None and path.startswith("/v1/models/") and path[len("/v1/models/"):] != self.chat.model_id:
            err = ApiError(404, f"the model {path[len('/v1/models/'):]!r} does not exist; this server has "
                           f"{self.chat.model_id!r}", code="model_not_found", param="model")
        if err is not None:
            response = _response(HTTPStatus(err.status), err.body(), "application/json")
            for k, v in err.headers:
                response.headers[k] = v
            return response
        body = self.chat.models() if path == "/v1/models" else self.chat.model()
        return _response(HTTPStatus.OK, json.dumps(body).encode(), "application/json")

    def _check_ws(self, conn: ServerConnection, request: Request, query: dict) -> Response | None:
        origin = request.headers.get("Origin")
        if origin is not None and not self._origin_ok(origin, request.headers.get("Host", "")):
            self.metrics.rejected.labels("origin").inc()
            body = f"origin {origin} is not allowed (allow it with --allow-origin)\n".encode()
            return _response(HTTPStatus.FORBIDDEN, body, "text/plain")
        if self.opts.token:
            offered = _token(request.headers, query)
            if offered is None or not hmac.compare_digest(offered.encode(), self.opts.token.encode()):
                self.metrics.rejected.labels("token").inc()
                what = "missing" if offered is None else "wrong"
                return _response(HTTPStatus.UNAUTHORIZED, f"{what} token: send 'Authorization: Bearer <token>', the subprotocol "
                                 f"'{KEY_SUBPROTOCOL}<token>' or ?token=<token>\n".encode(), "text/plain")
        return None

    def _origin_ok(self, origin: str, host: str) -> bool:
        if origin in self.opts.origins or "*" in self.opts.origins:
            return True
        o = urlsplit(origin)
        return o.scheme in ("http", "https") and o.netloc == host  # the page this server served

    @staticmethod
    def _select_subprotocol(conn: ServerConnection, offered):
        if "realtime" in offered:
            return "realtime"
        return offered[0] if offered else None  # a browser drops the socket unless one it offered comes back

    # -- a connection ------------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        url = urlsplit(ws.request.path)
        path = url.path
        limits = self.opts.limits
        if len(self._conns) + self.chat.active >= limits.max_sessions:
            self.metrics.rejected.labels("full").inc()
            await ws.close(1013, f"server full: {len(self._conns) + self.chat.active} of {limits.max_sessions} sessions "
                           "(chat completions included) in use; try again later")
            self._trim_later()
            return
        self._n += 1
        out = _Outbox(ws, asyncio.get_running_loop(), limits.max_output_bytes, self.metrics)
        native = path == "/v1/stream"
        session = RealtimeSession(self.shared, out.emit, native=native, limits=limits, ids=self.ids,
                                  loop_config=self.opts.loop_config, metrics=self.metrics, close=out.close, name=f"session-{self._n}",
                                  extensions=native or wants_extensions(parse_qs(url.query)))
        out.session = session
        self._conns[ws] = session
        self.metrics.sessions.inc()
        self.metrics.active.set(len(self._conns))
        log.info("%s opened (%s) from %s", session.name, path, ws.remote_address)
        session.start()
        sender = asyncio.create_task(out.run())
        idle = asyncio.create_task(self._idle_watch(ws, session))
        try:
            async for msg in ws:
                session.submit(msg)
        except ConnectionClosed:
            pass
        finally:
            session.stop()
            idle.cancel()
            sender.cancel()
            self._conns.pop(ws, None)
            self.metrics.active.set(len(self._conns))
            await asyncio.to_thread(session.thread.join, 10)
            trim()  # the session's memory, freed, goes back to the system (well under a millisecond)
            self._trim_later()
            log.info("%s closed (%s %s): %s", session.name, ws.close_code, ws.close_reason or "",
                     json.dumps(session.summary()))

    def _trim_later(self, delay_s: float = 1.0) -> None:
        """``trim`` once more ``delay_s`` after the last connection closed: what the event loop frees after a session's
        own trim (its socket, handshake and task objects) otherwise stays in the heap.  200 connect/abort cycles left
        RSS ~80 MB (+9%) over idle without it, +0.5% with it."""
        if self._trim_handle is not None:
            self._trim_handle.cancel()
        self._trim_handle = asyncio.get_running_loop().call_later(delay_s, trim)

    async def _idle_watch(self, ws: ServerConnection, session: RealtimeSession) -> None:
        limit = self.opts.limits.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            if time.monotonic() - session.last_message > limit:
                await self.say_goodbye(ws, session, 1000, f"idle for more than {limit:g} s")
                return

    async def say_goodbye(self, ws: ServerConnection, session: RealtimeSession, code: int, reason: str) -> None:
        """Close a session from our side: its ``session.latency`` summary first."""
        try:
            if session.loop is not None and session.extensions:
                await ws.send(session.proto.session_latency(session.summary()).to_json())
            await ws.close(code, reason)
        except ConnectionClosed:
            pass

    # -- running -----------------------------------------------------------------------------------

    async def start(self) -> None:
        limits = self.opts.limits
        self._server = await serve(
            self._handle, self.opts.host, self.opts.port, process_request=self._process_request,
            select_subprotocol=self._select_subprotocol, max_size=4 * limits.max_message_bytes,
            write_limit=1 << 16, max_queue=64, server_header="wafervox", create_connection=self.chat.create_connection())
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for ws, session in list(self._conns.items()):
            await self.say_goodbye(ws, session, 1001, "server shutting down")
        await self.chat.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def wants_extensions(query: dict) -> bool:
    """Our extension events (``turn.latency``, ``session.latency``) go to a ``/v1/realtime`` client only when it asks
    with ``?extensions=1`` (or ``true``/``yes``) in the URL: strict clients validate every event against the
    Realtime schema, which does not have them.  ``/v1/stream`` always has them."""
    return any(v.strip().lower() in ("1", "true", "yes", "on") for v in query.get("extensions", []))


def _token(headers: Headers, query: dict) -> str | None:
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    for proto in ",".join(headers.get_all("Sec-WebSocket-Protocol")).split(","):
        proto = proto.strip()
        if proto.startswith(KEY_SUBPROTOCOL):
            return proto[len(KEY_SUBPROTOCOL):]
    vals = query.get("token")
    return vals[0] if vals else None


def _response(status: HTTPStatus, body: bytes, ctype: str) -> Response:
    # websockets closes the connection after any answer but 101: say so, or an HTTP client (the openai SDK's pool)
    # sends its next request on it and finds it closed
    headers = Headers([("Content-Type", ctype), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
                       ("Connection", "close")])
    return Response(status.value, status.phrase, headers, body)
