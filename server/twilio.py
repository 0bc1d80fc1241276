"""Phone calls: Twilio's Media Streams (``<Connect><Stream>``) in front of a Realtime session.

A phone provider opens a websocket to ``/v1/twilio/stream`` and speaks JSON: ``connected``, ``start`` (the call's
ids, its ``customParameters``, the media format: 8 kHz mu-law), ``media`` (base64 mu-law, 20 ms a message), ``dtmf``,
``mark`` (the echo of a mark we sent, once the audio before it has played, or was cleared) and ``stop``.  We answer
with ``media``, ``mark`` and ``clear`` (drop what has not played: a barge-in).  Telnyx, Plivo, Vonage and Exotel
speak the same shape.

``MediaStream`` is the protocol core, sans-I/O: Twilio's messages in, the Realtime client events that drive the
session out (``input_audio_buffer.append`` with the payload as it came: the session is in ``audio/pcmu``, so nothing
is transcoded or resampled here); the session's server events in, Twilio's messages out:

- each ``response.output_audio.delta`` (an answer chunk) is cut into 20 ms ``media`` frames (160 bytes; the rest waits
  for the next chunk, the last one is padded with mu-law silence), preceded by a mark at the answer's first sample and
  followed by a mark at the chunk's end;
- a mark's echo says where the call's playback is: the answer's first mark becomes ``output_audio.played`` with the
  input samples sent so far (``input_sample``), so the session measures voice-to-voice on the call's own clock, as
  for a Realtime client that reports what it played;
- ``input_audio_buffer.speech_started`` while answer audio is still queued on the call (the session has decided the
  barge-in: it sends that event just before it cuts the answer) sends ``clear`` at once, then
  ``conversation.item.truncate`` at the position the call had played (the last echo, moved on by the call's clock), so
  the conversation keeps the words the caller heard;
- ``output_audio.paused`` (our extension: the session judges the caller's speech over the answer, ``voice.overlap``)
  sends ``clear`` at once and holds what the call had not played, with what the session sends meanwhile;
  ``output_audio.resumed`` (a backchannel, a noise) sends it again from where the call stopped; an interruption
  (``speech_started``) then truncates at that point;
- a ``dtmf`` key is kept (``dtmf``), and becomes a user turn: a text item ("The caller pressed 5.") and
  ``response.create`` (during an answer: ``response.cancel`` first, the turn once its ``response.done`` came);
- a response cancelled while its audio is queued on the call (``response.cancel``, a key) is cleared as a barge-in is.

``TwilioCalls`` is the ASGI side: ``POST /v1/twilio/voice`` answers a number's voice webhook with TwiML that connects
the call to the stream (its URL from ``--public-url``, else the request's host); with the account's auth token
(``TWILIO_AUTH_TOKEN``, ``--twilio-auth-token``) it answers only a request whose ``X-Twilio-Signature`` is Twilio's
(``signature``, 403 otherwise), and ``/v1/twilio/stream`` checks the
origin and the token (the handshake's, else the ``token`` custom parameter the TwiML carries: Twilio cannot set
headers), then runs the call as a session of the server (``VoiceServer._handle``: its limits, metrics and outbox).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import parse_qs
from xml.sax.saxutils import quoteattr

from voice.g711 import MULAW_SILENCE

from .asgi import SessionSocket, payload

log = logging.getLogger("wafervox.twilio")

VOICE_PATH = "/v1/twilio/voice"
STREAM_PATH = "/v1/twilio/stream"
RATE = 8000
FRAME = 160  # 20 ms of 8 kHz mu-law, one byte a sample
#: the session's formats on a call: G.711 mu-law both ways, as the call carries it
SESSION_AUDIO = {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}}
#: messages read before ``start`` at most, and how long they may take
MAX_PRELUDE_MESSAGES, PRELUDE_TIMEOUT_S = 8, 10.0
MAX_VOICE_BODY = 64 * 1024  # a voice webhook's form body


class StreamError(Exception):
    """A message the stream cannot go on with (the adapter closes the call with ``code``)."""

    def __init__(self, message: str, code: int = 1003):
        super().__init__(message)
        self.code = code


@dataclass
class _Mark:
    name: str
    sample: int  # the session's output samples sent before it
    response_id: str | None = None  # the answer whose first sample follows it (its first mark)
    item_id: str | None = None


@dataclass
class _Answer:
    response_id: str
    item_id: str
    first_sample: int  # the session's output sample count at its first sample
    samples: int = 0
    audio: bytearray = field(default_factory=bytearray)  # its audio put on the call (or waiting for a whole frame)


@dataclass
class MediaStream:
    """One call's Media Streams protocol (sans-I/O).  ``from_call(text)`` -> Realtime client events for the session;
    ``from_session(event)`` -> ``(messages for the call, client events for the session)``."""

    stream_sid: str | None = None
    call_sid: str | None = None
    parameters: dict = field(default_factory=dict)
    started: bool = False
    stopped: bool = False
    dtmf: list[str] = field(default_factory=list)  # keys pressed, in order
    input_samples: int = 0  # mu-law samples received from the call (the call's clock)
    out_samples: int = 0  # the session's output samples received (its own count: positions are in these)
    played_sample: int = 0  # the last position the call confirmed playing (a mark's echo)
    played_at_input: int = 0  # ``input_samples`` when it did
    clears: int = 0
    _pending: bytearray = field(default_factory=bytearray)  # less than a frame, waiting for the next chunk
    _marks: deque = field(default_factory=deque)  # marks sent, not echoed yet
    _answers: dict = field(default_factory=dict)  # response id -> _Answer
    _current: _Answer | None = None  # the answer whose audio is being sent
    responding: bool = False  # a response is in progress (response.created .. response.done)
    _turns: list = field(default_factory=list)  # a keypad turn waiting for the response in progress to end
    _n: int = 0
    #: the session judges speech over the answer (``output_audio.paused``): the call's audio was cleared, what it had not
    #: played is held here with what the session sends meanwhile, to go out again on ``output_audio.resumed``
    _held: bytearray | None = None
    _held_done: bool = False  # the answer's audio ended while held (its last partial frame is padded on resume)

    # -- the call -> the session -----------------------------------------------------------------

    def from_call(self, text: str | bytes) -> list[dict]:
        if isinstance(text, bytes):
            raise StreamError("binary frames are not part of Media Streams")
        try:
            msg = json.loads(text)
        except ValueError:
            raise StreamError("a message that is not JSON") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("event"), str):
            raise StreamError("a message without an 'event'")
        kind = msg["event"]
        if kind == "connected":
            return []
        if kind == "start":
            return self._start(msg)
        if not self.started:
            raise StreamError(f"'{kind}' before 'start'")
        if kind == "media":
            return self._media(msg)
        if kind == "mark":
            return self._echo(msg)
        if kind == "dtmf":
            return self._dtmf(msg)
        if kind == "stop":
            self.stopped = True
            return []
        return []  # other events (a provider's own) are not ours to refuse

    def _start(self, msg: dict) -> list[dict]:
        if self.started:
            raise StreamError("a second 'start'")
        start = msg.get("start")
        if not isinstance(start, dict):
            raise StreamError("'start' without its 'start' object")
        self.stream_sid = start.get("streamSid") or msg.get("streamSid")
        if not isinstance(self.stream_sid, str) or not self.stream_sid:
            raise StreamError("'start' without a streamSid")
        self.call_sid = start.get("callSid")
        params = start.get("customParameters") or {}
        self.parameters = {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {}
        fmt = start.get("mediaFormat") or {}
        encoding, rate, channels = fmt.get("encoding", "audio/x-mulaw"), int(fmt.get("sampleRate", RATE)), int(fmt.get("channels", 1))
        if (encoding, rate, channels) != ("audio/x-mulaw", RATE, 1):
            raise StreamError(f"media format {encoding} at {rate} Hz, {channels} channel(s): only audio/x-mulaw at 8000 Hz, mono")
        self.started = True
        session: dict = {"type": "realtime", "audio": json.loads(json.dumps(SESSION_AUDIO))}
        if self.parameters.get("instructions"):
            session["instructions"] = self.parameters["instructions"]
        return [{"type": "session.update", "session": session}]

    def _media(self, msg: dict) -> list[dict]:
        media = msg.get("media")
        if not isinstance(media, dict) or media.get("track", "inbound") not in ("inbound", "inbound_track"):
            return []  # (a both-tracks stream: our own voice coming back is not input)
        payload = media.get("payload")
        if not isinstance(payload, str):
            raise StreamError("'media' without a payload")
        try:
            n = len(base64.b64decode(payload, validate=True))
        except (binascii.Error, ValueError):
            raise StreamError("'media' whose payload is not base64") from None
        self.input_samples += n
        return [{"type": "input_audio_buffer.append", "audio": payload}]

    def _echo(self, msg: dict) -> list[dict]:
        name = (msg.get("mark") or {}).get("name")
        while self._marks:
            mark = self._marks.popleft()
            if mark.name == name:
                break
        else:
            return []  # a mark we no longer wait for (cleared, or not ours)
        self.played_sample, self.played_at_input = mark.sample, self.input_samples
        if mark.response_id is None:
            return []
        return [{"type": "output_audio.played", "sample": mark.sample, "input_sample": self.input_samples,
                 "response_id": mark.response_id, "item_id": mark.item_id}]

    def _dtmf(self, msg: dict) -> list[dict]:
        digit = str((msg.get("dtmf") or {}).get("digit", ""))[:1]
        if not digit:
            return []
        self.dtmf.append(digit)
        log.info("%s: dtmf %s", self.call_sid or self.stream_sid, digit)
        turn = [{"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": f"(The caller pressed {digit} on the keypad.)"}]}},
                {"type": "response.create"}]
        if not self.responding:
            return turn
        first = not self._turns
        self._turns = turn  # (the latest key wins) once the answer in progress has ended: cancelled now
        return [{"type": "response.cancel"}] if first else []

    # -- the session -> the call -----------------------------------------------------------------

    def from_session(self, ev: dict) -> tuple[list[dict], list[dict]]:
        kind = ev.get("type")
        if kind == "response.output_audio.delta":
            return self._delta(ev), []
        if kind == "response.output_audio.done":
            return self._flush(), []
        if kind == "input_audio_buffer.speech_started":
            return self._barge_in()
        if kind == "output_audio.paused":
            return self._pause(), []
        if kind == "output_audio.resumed":
            return self._resume(), []
        if kind == "response.created":
            self.responding = True
        elif kind == "response.done":
            self.responding = False
            to_call, to_session = [], []
            if (ev.get("response") or {}).get("status") == "cancelled":  # its audio still queued on the call is not to play
                to_call, to_session = self._barge_in()
            to_session += self._turns
            self._turns = []
            return to_call, to_session
        return [], []

    def _delta(self, ev: dict) -> list[dict]:
        audio = base64.b64decode(ev["delta"])
        out = []
        rid = ev.get("response_id")
        if self._current is None or self._current.response_id != rid:
            self._held = None  # (a new answer: what an old one held is not to play)
            out += self._flush()
            self._current = _Answer(rid, ev.get("item_id"), self.out_samples)
            self._answers[rid] = self._current
            while len(self._answers) > 8:
                self._answers.pop(next(iter(self._answers)))
            out.append(self._mark(self._current.first_sample, self._current))
        if self._held is not None:  # judged: kept until it goes on
            self._held += audio
            return out
        return out + self._put(audio)

    def _put(self, audio: bytes) -> list[dict]:
        """The current answer's ``audio`` onto the call, in whole frames (the rest waits), and a mark after it."""
        out = []
        self._current.samples += len(audio)
        self._current.audio += audio
        self.out_samples += len(audio)
        self._pending += audio
        whole = len(self._pending) // FRAME * FRAME
        out += self._frames(bytes(self._pending[:whole]))
        del self._pending[:whole]
        out.append(self._mark(self.sent))
        return out

    @property
    def sent(self) -> int:
        """The session's output samples put on the call (the rest waits for a whole frame)."""
        return self.out_samples - len(self._pending)

    def _flush(self) -> list[dict]:
        """The last partial frame of an answer, padded with silence to 20 ms."""
        if self._held is not None:
            self._held_done = True
            return []
        if not self._pending:
            return []
        frame = bytes(self._pending) + bytes([MULAW_SILENCE]) * (FRAME - len(self._pending))
        self._pending.clear()
        out = self._frames(frame)
        out.append(self._mark(self.sent))
        return out

    def _frames(self, data: bytes) -> list[dict]:
        return [{"event": "media", "streamSid": self.stream_sid, "media": {"payload": base64.b64encode(data[i:i + FRAME]).decode()}}
                for i in range(0, len(data), FRAME)]

    def _mark(self, sample: int, answer: _Answer | None = None) -> dict:
        self._n += 1
        mark = _Mark(f"wv{self._n}", sample, answer and answer.response_id, answer and answer.item_id)
        self._marks.append(mark)
        return {"event": "mark", "streamSid": self.stream_sid, "mark": {"name": mark.name}}

    def playing_position(self) -> int:
        """Where the call's playback is now, in the session's output samples: the last echo, moved on by the input
        samples received since (both run at 8 kHz on the call's clock), never past what was sent."""
        return min(self.sent, self.played_sample + self.input_samples - self.played_at_input)

    @property
    def queued(self) -> bool:
        """Answer audio sent to the call that it has not confirmed playing."""
        return bool(self._marks) or bool(self._pending)

    def _pause(self) -> list[dict]:
        """Speech over the answer is being judged: ``clear`` the call; what it had not played is held, and the position
        counts end where its playback stopped (as if the session had sent no more)."""
        a = self._current
        if self._held is not None or a is None or not self.queued:
            return []
        at = max(a.first_sample, self.playing_position())
        keep = at - a.first_sample
        self._held = bytearray(a.audio[keep:])  # sent and not played, and the partial frame not sent
        cut = len(a.audio) - keep
        del a.audio[keep:]
        a.samples -= cut
        self.out_samples -= cut
        self._pending.clear()
        self._marks.clear()  # (their echoes say nothing about playback now)
        self.clears += 1
        self.played_sample, self.played_at_input = at, self.input_samples
        return [{"event": "clear", "streamSid": self.stream_sid}]

    def _resume(self) -> list[dict]:
        """The speech was no turn: what was held goes out again, from where the call stopped."""
        held, self._held = self._held, None
        if held is None or self._current is None:
            return []
        self.played_at_input = self.input_samples  # (nothing played while it was paused)
        out = self._put(bytes(held)) if held else []
        if self._held_done:
            self._held_done = False
            out += self._flush()
        return out

    def _barge_in(self) -> tuple[list[dict], list[dict]]:
        if self._held is not None:  # paused: the call stopped where it was cleared; nothing more to clear
            self._held, self._held_done = None, False
            answer, self._current = self._current, None
            if answer is None or not answer.item_id:
                return [], []
            return [], [{"type": "conversation.item.truncate", "item_id": answer.item_id, "content_index": 0,
                         "audio_end_ms": (self.played_sample - answer.first_sample) * 1000 // RATE}]
        if not self.queued:
            return [], []
        at = self.playing_position()
        self._marks.clear()  # their echoes (Twilio sends them for cleared audio too) say nothing about playback
        self._pending.clear()
        self.clears += 1
        self.played_sample, self.played_at_input = self.out_samples, self.input_samples  # the cleared audio never plays
        to_session = []
        answer, self._current = self._current, None
        if answer is not None and answer.item_id and at < answer.first_sample + answer.samples:
            heard_ms = max(0, at - answer.first_sample) * 1000 // RATE
            to_session.append({"type": "conversation.item.truncate", "item_id": answer.item_id, "content_index": 0,
                               "audio_end_ms": heard_ms})
        return [{"event": "clear", "streamSid": self.stream_sid}], to_session


def twiml(stream_url: str, parameters: dict[str, str] | None = None) -> str:
    """The voice webhook's answer: connect the call to ``stream_url`` (bidirectional), with custom parameters."""
    params = "".join(f"<Parameter name={quoteattr(k)} value={quoteattr(v)}/>" for k, v in (parameters or {}).items())
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Connect><Stream url={quoteattr(stream_url)}>{params}'
            "</Stream></Connect></Response>\n")


def stream_url(public_url: str | None, host: str, scheme: str) -> str:
    """The stream's ``wss://`` URL: under ``--public-url`` when set, else on the request's host (``ws://`` only for a
    plain-HTTP request to a loopback host: a phone provider connects to ``wss://`` alone)."""
    if public_url:
        base = public_url.rstrip("/")
        for plain, secure in (("https://", "wss://"), ("http://", "ws://")):
            if base.startswith(plain):
                base = secure + base[len(plain):]
        if "://" not in base:
            base = "wss://" + base
        return base + STREAM_PATH
    name = host.rsplit(":", 1)[0].strip("[]") if host.count(":") <= 1 or host.startswith("[") else host
    loopback = name in ("localhost", "127.0.0.1", "::1")
    return f"{'ws' if scheme == 'http' and loopback else 'wss'}://{host}{STREAM_PATH}"


def check_public_url(url: str) -> str:
    """``--public-url``: an absolute http(s) or ws(s) URL with a host (a path prefix allowed); ValueError says why not."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "wss", "ws") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"--public-url {url!r} is not an https://HOST[/PATH] URL (the server's address as the phone provider "
                         "reaches it)")
    return url


def _offered_token(headers, query: dict) -> str | None:
    auth = headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    vals = query.get("token")
    return vals[0] if vals else None


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def signature(auth_token: str, url: str, form: dict[str, list[str]]) -> str:
    """Twilio's request signature (``X-Twilio-Signature``): HMAC-SHA1 with the account's auth token of the URL Twilio
    requested (query included), followed by each form parameter's name and value, by name (a name's values sorted),
    base64."""
    data = url + "".join(name + value for name in sorted(form) for value in sorted(form[name]))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode()


def signed_urls(public_url: str | None, request_url: str, path: str, query: str) -> list[str]:
    """The URLs a webhook's signature may have been made over: under ``--public-url`` when set (a proxy or a tunnel
    in front: Twilio signs the URL it called), else the request's own; each with and without the scheme's default port
    (Twilio's libraries accept either)."""
    from urllib.parse import urlsplit, urlunsplit

    if public_url:
        base = public_url.rstrip("/")
        for plain, secure in (("wss://", "https://"), ("ws://", "http://")):
            if base.startswith(plain):
                base = secure + base[len(plain):]
        url = base + path + ("?" + query if query else "")
    else:
        url = request_url
    parts = urlsplit(url)
    default = {"https": 443, "http": 80}.get(parts.scheme)
    if default is None or parts.port not in (None, default) or parts.username or parts.password:
        return [url]
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    other = host if parts.port else f"{host}:{default}"
    return [url, urlunsplit(parts._replace(netloc=other))]


class _CallSocket(SessionSocket):
    """The call's websocket as the server's session adapter sees a Realtime client's (``server.asgi.SessionSocket``, its base): what it
    sends is Realtime server events, turned into Twilio messages by the call's ``MediaStream``; what it reads is the
    call's messages, turned into Realtime client events."""

    def __init__(self, ws, stream: MediaStream, first: list[dict]):
        super().__init__(ws)
        self.stream = stream
        self._to_session: asyncio.Queue = asyncio.Queue()
        for ev in first:
            self._to_session.put_nowait(ev)
        self.turn_latency: list[dict] = []  # the session's turn.latency events (its figures, voice-to-voice on the call's clock)

    async def send(self, frame: str | bytes) -> None:
        if self.closed or isinstance(frame, bytes):
            return
        ev = json.loads(frame)
        if ev.get("type") == "turn.latency":
            self.turn_latency.append(ev)
        elif ev.get("type") == "error":
            log.info("%s: %s", self.stream.call_sid, ev.get("error", {}).get("message"))
        to_call, to_session = self.stream.from_session(ev)
        for msg in to_call:
            await super().send(json.dumps(msg))
        for msg in to_session:
            self._to_session.put_nowait(msg)

    async def messages(self):
        reader = asyncio.create_task(self._read())
        try:
            while True:
                ev = await self._to_session.get()
                if ev is None:
                    return
                yield json.dumps(ev)
        finally:
            reader.cancel()

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.receive()
                if msg is None:
                    return
                try:
                    evs = self.stream.from_call(msg)
                except StreamError as e:
                    log.info("%s: %s", self.stream.call_sid, e)
                    await self.close(e.code, str(e)[:120])
                    return
                for ev in evs:
                    self._to_session.put_nowait(ev)
                if self.stream.stopped:
                    await self.close(1000, "the call ended")
                    return
        finally:
            self._to_session.put_nowait(None)


class TwilioCalls:
    """The two routes of phone calls, on a ``VoiceServer``."""

    def __init__(self, server):
        self.server = server
        self.calls: list[_CallSocket] = []  # the calls in progress
        #: the last calls' records: ids, keys pressed, clears, and the session's turn.latency events (a test reads them)
        self.ended: deque[dict] = deque(maxlen=32)

    async def voice(self, request):
        """``POST /v1/twilio/voice``: the number's voice webhook.  TwiML that connects the call to our stream."""
        from starlette.responses import Response

        srv = self.server
        token = srv.opts.token
        query = parse_qs(request.url.query)
        if token and not _same(_offered_token(request.headers, query), token):
            srv.metrics.rejected.labels("token").inc()
            return Response("missing or wrong token: add ?token=<token> to the webhook's URL\n", 401, media_type="text/plain")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_VOICE_BODY:
                return Response("request body too large\n", 413, media_type="text/plain")
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        secret = srv.opts.twilio_auth_token
        if secret:  # only Twilio, which knows the account's auth token, gets TwiML
            offered = request.headers.get("X-Twilio-Signature", "")
            urls = signed_urls(srv.opts.public_url, str(request.url), request.url.path, request.url.query)
            if not any(_same(offered, signature(secret, url, form)) for url in urls):
                srv.metrics.rejected.labels("signature").inc()
                return Response("missing or wrong X-Twilio-Signature (the request is not from Twilio, or --public-url is "
                                "not the URL the number's webhook calls)\n", 403, media_type="text/plain")
        params = {"token": token} if token else {}
        if form.get("CallSid"):
            params["callSid"] = form["CallSid"][0][:64]
        url = stream_url(srv.opts.public_url, request.headers.get("Host", "localhost"), request.url.scheme)
        return Response(twiml(url, params), 200, media_type="text/xml", headers={"Cache-Control": "no-store"})

    async def stream(self, websocket) -> None:
        """``/v1/twilio/stream``: a call's Media Stream, run as one session of the server."""
        from starlette.websockets import WebSocketDisconnect

        srv = self.server
        origin = websocket.headers.get("Origin")
        if origin is not None and not srv._origin_ok(origin, websocket.headers.get("Host", "")):
            srv.metrics.rejected.labels("origin").inc()
            await websocket.close(1008)
            return
        token = srv.opts.token
        handshake_ok = not token or _same(_offered_token(websocket.headers, parse_qs(websocket.url.query)), token)
        await websocket.accept()
        stream, first = MediaStream(), []
        try:  # the prelude: 'connected', then 'start' with the token among its parameters
            async with asyncio.timeout(PRELUDE_TIMEOUT_S):
                for _ in range(MAX_PRELUDE_MESSAGES):
                    msg = await websocket.receive()
                    if msg["type"] == "websocket.disconnect":
                        return
                    first += stream.from_call(payload(msg))
                    if stream.started:
                        break
        except (TimeoutError, StreamError, WebSocketDisconnect) as e:
            await _close(websocket, 1008 if isinstance(e, TimeoutError) else getattr(e, "code", 1003), str(e) or "no 'start'")
            return
        if not stream.started:
            await _close(websocket, 1008, "no 'start' message")
            return
        if not handshake_ok and not _same(stream.parameters.get("token"), token):
            srv.metrics.rejected.labels("token").inc()
            await _close(websocket, 1008, "missing or wrong token (the stream's 'token' parameter)")
            return
        sock = _CallSocket(websocket, stream, first)
        self.calls.append(sock)
        log.info("call %s (stream %s) from %s", stream.call_sid, stream.stream_sid, sock.remote_address)
        try:
            await srv._handle(sock, "/v1/realtime", {"extensions": ["1"]})
        finally:
            self.calls.remove(sock)
            self.ended.append({"call_sid": stream.call_sid, "stream_sid": stream.stream_sid, "dtmf": list(stream.dtmf),
                               "clears": stream.clears, "turns": list(sock.turn_latency)})
            log.info("call %s ended: %d keys, %d clears, %s", stream.call_sid, len(stream.dtmf), stream.clears,
                     [t.get("client") for t in sock.turn_latency])


async def _close(websocket, code: int, reason: str) -> None:
    try:
        await websocket.close(code, reason[:120])
    except Exception:
        pass
