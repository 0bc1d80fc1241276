"""``wafervox serve``: the ASGI app around ``RealtimeSession``, served by uvicorn (``server.asgi``).

The event loop only does I/O: HTTP routes (``/`` the demo page, ``/static/*``, ``/healthz``, ``/metrics``,
``/v1/models``; Starlette routes them), the handshake checks (token, Origin, session count), reading client messages
into their session, and writing each session's output with a bounded buffer.  Sessions compute on their own threads
(``server.session``), sharing the engines loaded once (``SharedEngines``).  Every request but a GET (``POST
/v1/chat/completions``) goes to ``server.chat``.  Before any route, ``_Front`` applies what holds for every request:
the head's size, the rate per client address, ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import mimetypes
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from voice.loop import LoopConfig

from .asgi import MAX_HEAD_BYTES, AsgiServer, SessionSocket, bind, closing, deny, head_bytes, respond, wants_extensions
from .chat import CHAT_PATH, ApiError, ChatAPI
from .memory import trim
from .metrics import CONTENT_TYPE, Metrics
from .realtime import IdSource, ProtocolError
from .session import Limits, RealtimeSession
from .twilio import STREAM_PATH as TWILIO_STREAM_PATH
from .twilio import VOICE_PATH as TWILIO_VOICE_PATH
from .twilio import TwilioCalls
from .webrtc import CALLS_PATH, WebRTCCalls

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
    #: proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (the client address the rate limit sees)
    trusted_proxies: tuple[str, ...] = ()
    #: the server's address as callers' providers reach it (``--public-url``): the TwiML's stream URL; else the request's host
    public_url: str | None = None
    #: the Twilio account's auth token: the voice webhook answers only requests signed with it (``X-Twilio-Signature``)
    twilio_auth_token: str | None = None
    #: ``--record DIR``: each session as a stereo WAV (user left, agent right, on the loop's clock) and its turns' JSON
    #: (``voice.recording``), written when the session ends
    record: str | None = None


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

    def __init__(self, ws: SessionSocket, loop: asyncio.AbstractEventLoop, limit: int, metrics: Metrics):
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


class _Front:
    """What holds for every request, before any route: the head's size, the rate per client address (non-GET requests
    have theirs checked by ``ChatAPI``, in its order and its error shape), websockets on their paths only, and
    ``Connection: close`` on every HTTP answer."""

    def __init__(self, app, server: VoiceServer):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        srv = self.server
        over = head_bytes(scope) > MAX_HEAD_BYTES
        too_big = f"the request line and headers are over {MAX_HEAD_BYTES} bytes"
        if kind == "http":
            send = closing(send)
            if scope["method"] != "GET" and scope["path"] not in (CALLS_PATH, TWILIO_VOICE_PATH):  # (WebRTC, phone: routes below)
                if over:
                    await srv.chat.refuse(send, receive, ApiError(431, too_big, code="request_too_large"), True)
                else:
                    await srv.chat.handle(scope, receive, send)
                return
        refuse = (lambda status, text, headers=(): deny(send, status, text, headers)) if kind == "websocket" else \
            (lambda status, text, headers=(): respond(send, status, text.encode(), "text/plain", headers))
        address = scope["client"][0] if scope.get("client") else "?"
        if over:
            await refuse(431, too_big + "\n")
        elif not srv.limiter.allow(address):
            srv.metrics.rejected.labels("rate").inc()
            await refuse(429, f"too many connections from {address}: at most {srv.opts.connect_rate:g} a second; retry shortly\n",
                         (("Retry-After", "1"),))
        elif kind == "websocket" and scope["path"] not in (*WS_PATHS, TWILIO_STREAM_PATH):
            await refuse(404, f"not found: {scope['path']}\n")
        else:
            await self.app(scope, receive, send)


class VoiceServer:
    def __init__(self, shared, options: ServerOptions | None = None, metrics: Metrics | None = None):
        self.shared = shared
        self.opts = options or ServerOptions()
        self.metrics = metrics or Metrics()
        self.ids = _Ids()
        self._conns: dict[SessionSocket, RealtimeSession] = {}  # the open sessions, by their connection
        self._n = 0
        self.port: int | None = None
        self._http: AsgiServer | None = None
        self.limiter = RateLimiter(self.opts.connect_rate, max(1.0, 2 * self.opts.connect_rate))
        self._metrics_page: tuple[float, bytes] | None = None  # rendered at most once a second
        self._trim_handle: asyncio.TimerHandle | None = None  # the trim after the last connection closed
        #: POST /v1/chat/completions (and any request but a GET); its completions share the sessions' slots
        self.chat = ChatAPI(shared, metrics=self.metrics, ids=self.ids, limiter=self.limiter, token=self.opts.token,
                            max_sessions=self.opts.limits.max_sessions, sessions=lambda: len(self._conns))
        #: phone calls: POST /v1/twilio/voice (TwiML) and the /v1/twilio/stream websocket (server.twilio)
        self.twilio = TwilioCalls(self)
        #: POST /v1/realtime/calls: the WebRTC transport (server.webrtc); each call is a session run by ``_handle``
        self.webrtc = WebRTCCalls(self)

    def asgi_app(self):
        """The ASGI app: the GET routes and the two websockets in Starlette, behind ``_Front``."""
        routes = [Route("/", self._static), Route("/static/{name:path}", self._static), Route("/healthz", self._healthz),
                  Route("/metrics", self._metrics), Route(CHAT_PATH, self._openai_get), Route("/v1/models", self._openai_get),
                  Route("/v1/models/{name:path}", self._openai_get), Route(CALLS_PATH, self.webrtc.answer, methods=["POST"])]
        for path in WS_PATHS:
            routes += [WebSocketRoute(path, self._session), Route(path, self._upgrade_required)]
        routes += [Route(TWILIO_VOICE_PATH, self.twilio.voice, methods=["POST"]), WebSocketRoute(TWILIO_STREAM_PATH, self.twilio.stream)]
        return _Front(Starlette(routes=routes, exception_handlers={404: self._not_found}), self)

    # -- HTTP routes (GET) -------------------------------------------------------------------------

    async def _healthz(self, request: Request) -> Response:
        body = {"status": "ok", "sessions": len(self._conns), "completions": self.chat.active,
                "max_sessions": self.opts.limits.max_sessions}
        return _response(200, json.dumps(body).encode(), "application/json")

    async def _metrics(self, request: Request) -> Response:
        """Rendered here on the event loop from counters alone: no session or compute is touched."""
        now = time.monotonic()
        if self._metrics_page is None or now - self._metrics_page[0] >= 1.0:
            self._metrics_page = (now, self.metrics.render())
        return _response(200, self._metrics_page[1], CONTENT_TYPE)

    async def _static(self, request: Request) -> Response:
        path = request.url.path
        name = "index.html" if path == "/" else request.path_params["name"]
        f = (STATIC / name).resolve()
        if f.parent == STATIC.resolve() and f.is_file():
            ctype = mimetypes.guess_type(f.name)[0] or "application/octet-stream"
            if ctype.startswith("text/") or ctype.endswith("javascript"):
                ctype += "; charset=utf-8"
            return _response(200, f.read_bytes(), ctype)
        return await self._not_found(request, None)

    async def _not_found(self, request: Request, exc) -> Response:
        return _response(404, f"not found: {request.url.path}\n".encode(), "text/plain")

    async def _upgrade_required(self, request: Request) -> Response:
        response = _response(426, f"{request.url.path} is a websocket: connect with a websocket client\n".encode(), "text/plain")
        response.headers["Upgrade"] = "websocket"
        return response

    async def _openai_get(self, request: Request) -> Response:
        """``GET /v1/models`` (and ``/v1/models/ID``) in the OpenAI shapes, behind the same token as the rest."""
        path = request.url.path
        err = self.chat.check_token(request.headers.get("Authorization"))
        if err is None and path == CHAT_PATH:
            err = ApiError(405, f"use POST for {CHAT_PATH}", code="method_not_allowed", headers=(("Allow", "POST"),))
        if err is None and path.startswith("/v1/models/") and path[len("/v1/models/"):] != self.chat.model_id:
            err = ApiError(404, f"the model {path[len('/v1/models/'):]!r} does not exist; this server has "
                           f"{self.chat.model_id!r}", code="model_not_found", param="model")
        if err is not None:
            response = _response(err.status, err.body(), "application/json")
            for k, v in err.headers:
                response.headers[k] = v
            return response
        body = self.chat.models() if path == "/v1/models" else self.chat.model()
        return _response(200, json.dumps(body).encode(), "application/json")

    # -- the websocket handshake -------------------------------------------------------------------

    def _check_ws(self, ws: WebSocket) -> Response | None:
        origin = ws.headers.get("Origin")
        if origin is not None and not self._origin_ok(origin, ws.headers.get("Host", "")):
            self.metrics.rejected.labels("origin").inc()
            return _response(403, f"origin {origin} is not allowed (allow it with --allow-origin)\n".encode(), "text/plain")
        if self.opts.token:
            offered = _token(ws.headers.get("Authorization", ""), ws.headers.getlist("Sec-WebSocket-Protocol"),
                             parse_qs(ws.url.query))
            if offered is None or not hmac.compare_digest(offered.encode(), self.opts.token.encode()):
                self.metrics.rejected.labels("token").inc()
                what = "missing" if offered is None else "wrong"
                return _response(401, f"{what} token: send 'Authorization: Bearer <token>', the subprotocol "
                                 f"'{KEY_SUBPROTOCOL}<token>' or ?token=<token>\n".encode(), "text/plain")
        return None

    def _origin_ok(self, origin: str, host: str) -> bool:
        if origin in self.opts.origins or "*" in self.opts.origins:
            return True
        o = urlsplit(origin)
        return o.scheme in ("http", "https") and o.netloc == host  # the page this server served

    @staticmethod
    def _select_subprotocol(offered) -> str | None:
        if "realtime" in offered:
            return "realtime"
        return offered[0] if offered else None  # a browser drops the socket unless one it offered comes back

    # -- a connection ------------------------------------------------------------------------------

    async def _session(self, websocket: WebSocket) -> None:
        denial = self._check_ws(websocket)
        if denial is not None:
            await websocket.send_denial_response(denial)
            return
        await websocket.accept(subprotocol=self._select_subprotocol(websocket.scope.get("subprotocols", [])))
        await self._handle(SessionSocket(websocket), websocket.url.path, parse_qs(websocket.url.query))

    async def _handle(self, ws: SessionSocket, path: str, query: dict) -> None:
        limits = self.opts.limits
        if len(self._conns) + self.chat.active >= limits.max_sessions:
            self.metrics.rejected.labels("full").inc()
            await ws.close(1013, f"server full: {len(self._conns) + self.chat.active} of {limits.max_sessions} sessions "
                           "(chat completions included) in use; try again later")
            self._trim_later()
            return
        self._n += 1
        out = _Outbox(ws, asyncio.get_running_loop(), limits.max_output_bytes, self.metrics)
        native = path in ("/v1/stream", CALLS_PATH)  # raw PCM16 audio (a WebRTC call's tracks: server.webrtc)
        session = RealtimeSession(self.shared, out.emit, native=native, limits=limits, ids=self.ids,
                                  loop_config=self.opts.loop_config, metrics=self.metrics, close=out.close, name=f"session-{self._n}",
                                  extensions=path == "/v1/stream" or wants_extensions(query))
        out.session = session
        recording = self._recording(session)
        self._conns[ws] = session
        self.metrics.sessions.inc()
        self.metrics.active.set(len(self._conns))
        log.info("%s opened (%s) from %s", session.name, path, ws.remote_address)
        session.start()
        sender = asyncio.create_task(out.run())
        idle = asyncio.create_task(self._idle_watch(ws, session))
        try:
            async for msg in ws.messages():
                session.submit(msg)
        finally:
            session.stop()
            idle.cancel()
            sender.cancel()
            self._conns.pop(ws, None)
            self.metrics.active.set(len(self._conns))
            await asyncio.to_thread(session.thread.join, 10)
            if recording is not None:
                await asyncio.to_thread(self._save, recording, session.name)
            trim()  # the session's memory, freed, goes back to the system (well under a millisecond)
            self._trim_later()
            log.info("%s closed (%s %s): %s", session.name, ws.close_code, ws.close_reason or "",
                     json.dumps(session.summary()))

    def _recording(self, session: RealtimeSession):
        """``--record DIR``: the session's recording, attached to its loop when the loop starts (``session.recorder``)."""
        if self.opts.record is None:
            return None
        from voice.recording import SessionRecording

        session.recorder = SessionRecording(self.opts.record, session.name, self.shared.sample_rate)
        return session.recorder

    @staticmethod
    def _save(recording, name: str) -> None:
        try:
            wav, _ = recording.close()
            log.info("%s recorded in %s", name, wav)
        except OSError as e:  # (a full disk: the server goes on)
            log.warning("%s: the recording could not be written: %s", name, e)

    def _trim_later(self, delay_s: float = 1.0) -> None:
        """``trim`` once more ``delay_s`` after the last connection closed: what the event loop frees after a session's
        own trim (its socket, handshake and task objects) otherwise stays in the heap.  200 connect/abort cycles left
        RSS ~80 MB (+9%) over idle without it, +0.5% with it."""
        if self._trim_handle is not None:
            self._trim_handle.cancel()
        self._trim_handle = asyncio.get_running_loop().call_later(delay_s, trim)

    async def _idle_watch(self, ws: SessionSocket, session: RealtimeSession) -> None:
        limit = self.opts.limits.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            if time.monotonic() - session.last_message > limit:
                await self.say_goodbye(ws, session, 1000, f"idle for more than {limit:g} s")
                return

    async def say_goodbye(self, ws: SessionSocket, session: RealtimeSession, code: int, reason: str) -> None:
        """Close a session from our side: its ``session.latency`` summary first."""
        if session.loop is not None and session.extensions:
            await ws.send(session.proto.session_latency(session.summary()).to_json())
        await ws.close(code, reason)

    # -- running -----------------------------------------------------------------------------------

    async def start(self, sock: socket.socket | None = None) -> None:
        """Listen on ``sock``, else on the options' host and port (OSError when that cannot be)."""
        self._http = AsgiServer(self.asgi_app(), ws_max_size=4 * self.opts.limits.max_message_bytes,
                                trusted_proxies=self.opts.trusted_proxies)
        await self._http.start(sock if sock is not None else bind(self.opts.host, self.opts.port))
        self.port = self._http.port

    async def stop(self) -> None:
        for ws, session in list(self._conns.items()):
            await self.say_goodbye(ws, session, 1001, "server shutting down")
        await self.chat.close()
        if self._http is not None:
            await self._http.stop()


def _token(authorization: str, protocols: list[str], query: dict) -> str | None:
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    for proto in ",".join(protocols).split(","):
        proto = proto.strip()
        if proto.startswith(KEY_SUBPROTOCOL):
            return proto[len(KEY_SUBPROTOCOL):]
    vals = query.get("token")
    return vals[0] if vals else None


def _response(status: int, body: bytes, ctype: str) -> Response:
    return Response(body, status, headers={"Content-Type": ctype, "Cache-Control": "no-store"})
