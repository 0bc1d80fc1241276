"""The HTTP stack under ``wafervox serve``: uvicorn, with h11 for HTTP/1.1 and ``websockets`` (its sans-I/O protocol)
for the websocket connections, serving an ASGI app on a socket bound here, from an event loop that already runs (the
CLI's, or a test's thread).  Requests reach the app parsed; nothing here reads a request's bytes.

Two additions to uvicorn's h11 protocol keep the limits the server had before it moved onto this stack: a request head
must arrive within ``HEAD_TIMEOUT_S`` (a slow client gets 408, a silent one is closed), and a head over
``MAX_HEAD_BYTES`` gets h11's own hint, 431, where uvicorn answers every malformed request with 400.  Every HTTP
answer closes its connection (``Connection: close``), as the server's answers always did.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import h11
import uvicorn
from starlette.websockets import WebSocket, WebSocketDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEAD_BYTES = 16 << 10  # request line and headers (431 past it)
HEAD_TIMEOUT_S = 10.0  # a connection's request head, from its accept on (408 past it)
GRACEFUL_S = 10  # at shutdown, what connections and tasks are still running get before they are cancelled

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


# -- answers ---------------------------------------------------------------------------------------


def _header_list(ctype: str, length: int, headers) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", ctype.encode()), (b"content-length", str(length).encode())]
    return out + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def respond(send: Send, status: int, body: bytes, ctype: str = "application/json", headers=(), *, more: bool = False) -> None:
    """One whole HTTP answer (``more``: its last, empty piece is still to come)."""
    await send({"type": "http.response.start", "status": status, "headers": _header_list(ctype, len(body), headers)})
    await send({"type": "http.response.body", "body": body, "more_body": more})


async def deny(send: Send, status: int, text: str, headers=()) -> None:
    """Refuse a websocket handshake with an HTTP answer (ASGI's ``websocket.http.response``)."""
    body = text.encode()
    head = _header_list("text/plain", len(body), (("Cache-Control", "no-store"), ("Connection", "close"), *headers))
    await send({"type": "websocket.http.response.start", "status": status, "headers": head})
    await send({"type": "websocket.http.response.body", "body": body})


def closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` and ``Cache-Control: no-store`` on every answer that does not set them."""

    async def wrapped(message: dict) -> None:
        if message["type"] == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers", ())}
            extra = [(k, v) for k, v in ((b"connection", b"close"), (b"cache-control", b"no-store")) if k not in names]
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return wrapped


def head_bytes(scope: dict) -> int:
    """The size of the request line and headers as the client sent them (give or take the spaces around a colon)."""
    target = len(scope.get("raw_path", b"")) + (len(scope["query_string"]) + 1 if scope.get("query_string") else 0)
    return len(scope.get("method", "GET")) + target + 12 + sum(len(k) + len(v) + 4 for k, v in scope["headers"]) + 2


def _error_body(status: int, message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}).encode()


# -- uvicorn's h11 protocol, with the head's limits ------------------------------------------------


class _H11(h11.Connection):
    """h11's connection, remembering the error it raised (its ``error_status_hint`` is the status to answer)."""

    error: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.error = e
            raise


class HttpProtocol(H11Protocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = _H11(h11.SERVER, self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES)
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timeout)

    def connection_lost(self, exc) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _head_timeout(self) -> None:
        if self.cycle is not None or self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # a request came (or the connection became a websocket, or is gone)
        if self.conn.trailing_data[0]:  # part of a head: say why it is closed
            self._answer(408, _error_body(408, f"the request did not arrive within {HEAD_TIMEOUT_S:g} s", "request_timeout"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:  # uvicorn's answer to a request h11 refused
        err = self.conn.error
        status = err.error_status_hint if err is not None else 400
        if status == 431:
            body = _error_body(431, f"the request line and headers are over {MAX_HEAD_BYTES} bytes", "request_too_large")
        else:
            body = _error_body(status, f"malformed request: {err or msg}", "bad_request")
        self._answer(status, body)
        self.transport.close()

    def _answer(self, status: int, body: bytes) -> None:
        lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
        lines += [k + b": " + v for k, v in self.server_state.default_headers]
        lines += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close",
                  b"cache-control: no-store"]
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)


# -- serving ---------------------------------------------------------------------------------------


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (its first address), for uvicorn to listen on; OSError when it cannot be."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class AsgiServer:
    """uvicorn serving ``app``, started and stopped from a running event loop (signals stay the caller's)."""

    def __init__(self, app, *, ws_max_size: int, trusted_proxies: tuple[str, ...] = ()):
        self.config = uvicorn.Config(
            app, http=HttpProtocol, ws="websockets-sansio", lifespan="off", log_config=None, access_log=False,
            server_header=False, headers=[("Server", "wafervox")], h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            ws_max_size=ws_max_size, ws_ping_interval=20.0, ws_ping_timeout=20.0,
            timeout_graceful_shutdown=GRACEFUL_S, proxy_headers=bool(trusted_proxies),
            forwarded_allow_ips=list(trusted_proxies) or None)
        self.server = uvicorn.Server(self.config)
        self.sockets: list[socket.socket] = []
        self._ticks: asyncio.Task | None = None

    @property
    def port(self) -> int:
        return self.sockets[0].getsockname()[1]

    async def start(self, sock: socket.socket) -> None:
        self.sockets = [sock]
        self.config.load()
        self.server.lifespan = self.config.lifespan_class(self.config)
        await self.server.startup(sockets=self.sockets)
        self._ticks = asyncio.create_task(self.server.main_loop())  # its first tick sets the Server and Date headers
        await asyncio.sleep(0)

    async def stop(self) -> None:
        """Stop listening, close the connections (the idle at once; answers in progress finish, up to ``GRACEFUL_S``)."""
        if self._ticks is None:
            return
        self.server.should_exit = True
        await self._ticks
        self._ticks = None
        await self.server.shutdown(sockets=self.sockets)


def payload(msg: dict) -> str | bytes:
    """A ``websocket.receive`` message's text, or else its bytes."""
    return msg["text"] if msg.get("text") is not None else msg.get("bytes", b"")


class SessionSocket:
    """A session's websocket (Starlette's, over uvicorn's): sending, closing, the messages in, how it closed.  Sending
    on a socket that has closed does nothing."""

    def __init__(self, ws: WebSocket):
        self.ws = ws
        self.remote_address = (ws.client.host, ws.client.port) if ws.client else None
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""

    async def send(self, frame: str | bytes) -> None:  # waits while the socket's write buffer is full
        if self.closed:
            return
        try:
            if isinstance(frame, bytes):
                await self.ws.send_bytes(frame)
            else:
                await self.ws.send_text(frame)
        except (WebSocketDisconnect, OSError, RuntimeError):
            self.closed = True

    async def close(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed, self.close_code, self.close_reason = True, code, reason
        try:
            await self.ws.close(code, reason)
        except (WebSocketDisconnect, OSError, RuntimeError):
            pass

    async def receive(self) -> str | bytes | None:
        """The next message in, or None once the peer has gone (its close code and reason kept, unless we closed first)."""
        msg = await self.ws.receive()
        if msg["type"] == "websocket.disconnect":
            if self.close_code is None:
                self.close_code, self.close_reason = msg.get("code", 1005), msg.get("reason") or ""
            self.closed = True
            return None
        return payload(msg)

    async def messages(self):
        while (msg := await self.receive()) is not None:
            yield msg


def wants_extensions(query: dict) -> bool:
    """Our extension events (``turn.latency``, ``session.latency``, ``output_audio.paused``/``.resumed``) go to a
    ``/v1/realtime`` client only when it asks with ``?extensions=1`` (or ``true``/``yes``) in the URL: strict clients
    validate every event against the Realtime schema, which does not have them.  ``/v1/stream`` always has them."""
    return any(v.strip().lower() in ("1", "true", "yes", "on") for v in query.get("extensions", []))
