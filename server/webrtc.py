"""The Realtime API's WebRTC transport: ``POST /v1/realtime/calls`` with an SDP offer (``Content-Type: application/sdp``)
is answered ``201`` with the SDP answer; audio goes both ways as Opus over RTP, and the JSON events (client and server,
the same as on ``/v1/realtime``) travel as text on the data channel the client opened, ``oai-events``.

Only the adapter is ours: aiortc does ICE, DTLS, SRTP, SCTP and Opus.  A call is one ``RealtimeSession``, built and
run by the server exactly as a websocket's is (``VoiceServer._handle``: the same session count, idle limit, output
buffer and close), on the raw PCM16 path (``native``) at Opus's 48 kHz both ways (set by a ``session.update`` of the
adapter's before any of the client's; its ``session.updated`` is not forwarded; a client's audio formats are
dropped): its output audio comes here as bytes and goes out on the outbound track, paced in 20 ms frames; the inbound
track's frames, mixed down to mono, are handed over as bytes.  No resampling here (soxr's stream resampler holds
back ~30 ms each way; it is used only should a decoder give another rate).  ``_Call`` is what ``_handle`` talks to
in place of a websocket.

The output audio buffer (the outbound track's queue) is reported as the API does on WebRTC alone:
``output_audio_buffer.started`` when a response's audio first goes to the track, ``.stopped`` once the response is
done and its audio has all gone out, ``.cleared`` when a barge-in or a cancel drops what is queued; the client's
``output_audio_buffer.clear`` drops it too (the rest of that response's audio is not played).

The handshake's checks are the websocket's: the rate per client address (``_Front``), the Origin (a browser's), the
token (``Authorization: Bearer``, or ``?token=``), the session count; then the offer's size and type.  ICE gathers host
candidates only (no STUN server); a server bound to a loopback address offers 127.0.0.1 alone.
"""

from __future__ import annotations

import asyncio
import fractions
import hmac
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import parse_qs

import aioice.ice
import av
import numpy as np
import soxr
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError
from starlette.requests import Request
from starlette.responses import Response

from .asgi import wants_extensions
from .chat import ApiError
from .realtime.codec import IdSource

log = logging.getLogger("wafervox.server")
CALLS_PATH = "/v1/realtime/calls"
EVENTS_LABEL = "oai-events"
RATE = 48000  # Opus's clock, both ways
FRAME = RATE // 50  # 20 ms
MAX_SDP_BYTES = 64 << 10
CONNECT_TIMEOUT_S = 30.0  # from the answer to a connected peer; else the call is dropped
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# -- which host candidates ICE offers ---------------------------------------------------------------
# aioice gathers every interface's address but loopback's.  A server listening on loopback alone offers 127.0.0.1
# (and the tests' clients in this process do too): set by ``set_ice_hosts``, read where aioice gathers.
_default_host_addresses = aioice.ice.get_host_addresses
_ice_hosts: tuple[str, ...] | None = None


def _host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return list(_ice_hosts) if _ice_hosts is not None else _default_host_addresses(use_ipv4, use_ipv6)


aioice.ice.get_host_addresses = _host_addresses


def set_ice_hosts(bind_host: str) -> None:
    """The host candidates for a server bound to ``bind_host``: 127.0.0.1 alone for a loopback address, else every
    interface's (aioice's own choice)."""
    global _ice_hosts
    _ice_hosts = ("127.0.0.1",) if bind_host in LOOPBACK_HOSTS else None


def ice_config() -> RTCConfiguration:
    """No STUN or TURN server: host candidates only (aiortc's default would ask a public STUN server)."""
    return RTCConfiguration(iceServers=[])


def prefer_opus(pc: RTCPeerConnection) -> None:
    """Opus alone on every audio transceiver (aiortc also has G.711)."""
    opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
    for t in pc.getTransceivers():
        if t.kind == "audio":
            t.setCodecPreferences(opus)


# -- audio ------------------------------------------------------------------------------------------


class AudioJitter:
    """The receiver's jitter stage for audio: each RTP packet is a whole Opus frame, handed to the decoder as it
    arrives; one older than the newest so far is dropped.  aiortc's own buffer holds four more frames before it
    releases one (80 ms of delay on the turn's end: the endpoint would be heard that much later).  Opus conceals
    a lost frame; on a link that reorders, a late frame is lost rather than waited for."""

    def __init__(self):
        self._last: int | None = None

    def add(self, packet) -> tuple[bool, JitterFrame | None]:
        seq = packet.sequence_number
        if self._last is not None and (seq - self._last) % 65536 >= 32768:  # (a repeat, or older than the newest)
            return False, None
        self._last = seq
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)


def low_latency_audio(pc: RTCPeerConnection) -> None:
    """Every audio receiver of ``pc`` on ``AudioJitter`` (set before the first packet: after the remote description).
    A no-op where aiortc keeps its buffer elsewhere."""
    for t in pc.getTransceivers():
        if t.kind == "audio" and hasattr(t.receiver, "_RTCRtpReceiver__jitter_buffer"):
            t.receiver._RTCRtpReceiver__jitter_buffer = AudioJitter()



class OutputTrack(MediaStreamTrack):
    """The session's output audio as a live track: 20 ms frames of mono PCM16 at 48 kHz on the wall clock, silence
    when nothing is queued.  ``feed`` takes PCM16 at ``rate`` (resampled here); at most ``limit`` bytes wait, the
    rest is dropped (the answer outruns playback only by what TTS is ahead of real time)."""

    kind = "audio"

    def __init__(self, rate: int, limit: int):
        super().__init__()
        self.limit = limit
        self._rs = None if rate == RATE else soxr.ResampleStream(rate, RATE, 1, dtype="int16")
        self._buf = bytearray()
        self._start: float | None = None
        self._pts = 0
        self.dropped = 0  # bytes dropped over the limit
        self.sent = 0  # output samples that went out (answer audio, not the silence between)
        self.paused = False  # the queue is kept, silence goes out (speech over the answer is judged)
        #: called (on the event loop) when the last queued audio has gone out
        self.on_drained: Callable[[], None] | None = None

    def feed(self, pcm: bytes) -> None:
        x = np.frombuffer(pcm, "<i2")
        if self._rs is not None:
            x = self._rs.resample_chunk(x)
        data = x.astype("<i2", copy=False).tobytes()
        if len(self._buf) + len(data) > self.limit:
            self.dropped += len(data)
            return
        self._buf += data

    def queued(self) -> int:
        """Bytes waiting to go out."""
        return len(self._buf)

    def clear(self) -> None:
        """A cancelled answer stops sounding now (what is queued is not sent)."""
        self.paused = False
        self._buf.clear()
        if self._rs is not None:
            self._rs.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME
            wait = self._start + self._pts / RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        n = 0 if self.paused else min(len(self._buf), 2 * FRAME)
        body = bytes(self._buf[:n]) + bytes(2 * FRAME - n)
        del self._buf[:n]
        self.sent += n // 2
        if n and not self._buf and self.on_drained is not None:
            self.on_drained()
        frame = av.AudioFrame.from_ndarray(np.frombuffer(body, "<i2").reshape(1, FRAME), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


class InputConverter:
    """Decoded frames (any layout, format and rate; Opus's decoder gives stereo PCM16 at 48 kHz) to mono PCM16 bytes at
    ``rate``."""

    def __init__(self, rate: int):
        self.rate = rate
        self._to_mono = av.AudioResampler(format="s16", layout="mono")
        self._rs: soxr.ResampleStream | None = None
        self._src = 0

    def __call__(self, frame: av.AudioFrame) -> bytes:
        parts = [f.to_ndarray().reshape(-1) for f in self._to_mono.resample(frame)]
        if not parts:
            return b""
        x = np.concatenate(parts).astype(np.int16, copy=False)
        src = frame.sample_rate
        if src != self.rate:
            if self._rs is None or self._src != src:
                self._rs, self._src = soxr.ResampleStream(src, self.rate, 1, dtype="int16"), src
            x = self._rs.resample_chunk(x)
        return x.astype("<i2", copy=False).tobytes()


def _event_type(msg: str) -> str | None:
    """A client event's ``type``, or None when the text is not a JSON object with one."""
    try:
        ev = json.loads(msg)
    except ValueError:
        return None
    return ev.get("type") if isinstance(ev, dict) else None


def _fixed_format(msg: str) -> str:
    """A client's ``session.update`` less its audio formats: over WebRTC the audio is Opus on the tracks, and the
    session's PCM rates stay what this adapter converts to and from."""
    if '"session.update"' not in msg:
        return msg
    try:
        ev = json.loads(msg)
        audio = ev["session"]["audio"]
        dropped = [audio[k].pop("format", None) for k in ("input", "output") if isinstance(audio.get(k), dict)]
    except (ValueError, KeyError, TypeError, AttributeError):
        return msg  # (the codec reports what is wrong with it)
    return json.dumps(ev) if any(d is not None for d in dropped) else msg


# -- one call ----------------------------------------------------------------------------------------


class _Call:
    """A peer connection, seen by the server as its websocket: ``messages()`` yields the client's JSON text (from
    ``oai-events``) and its audio (PCM16 bytes at the session's input rate) until the call ends; ``send`` takes the
    session's output (events to the data channel, queued until it opens; audio bytes to the outbound track);
    ``close`` ends the call."""

    def __init__(self, pc: RTCPeerConnection, input_rate: int, output_rate: int, limit: int, remote_address,
                 extensions: bool = False):
        self.pc = pc
        #: the client asked for our extension events; the session sends them either way, for ``output_audio.paused``
        #: and ``.resumed``, which pause the track here
        self.extensions = extensions
        self.remote_address = remote_address
        self.track = OutputTrack(output_rate, limit)
        self.input_rate = input_rate
        self.channel = None
        self.pending: deque[str] = deque()  # events before the data channel opened
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.closed = False
        self._own_update = True  # the adapter's session.update (48 kHz both ways) is answered first: not forwarded
        self.close_code: int | None = None
        self.close_reason = ""
        self._tasks: set[asyncio.Task] = set()
        # the output audio buffer (the track's queue), as the API's WebRTC events report it
        self._ids = IdSource()
        self._response: str | None = None  # the response whose audio the track is fed
        self._playing = False  # output_audio_buffer.started sent, and neither stopped nor cleared yet
        self._answered = False  # the response is done (completed): the buffer stops once drained
        self._cut = False  # the response's audio was cleared: what still comes of it is dropped
        self.track.on_drained = self._drained
        pc.on("datachannel", self._on_channel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_state)

    # events in, and the inbound track
    def _on_channel(self, channel) -> None:
        if channel.label != EVENTS_LABEL or self.channel is not None:
            return  # (only the events channel carries anything of ours)
        self.channel = channel

        @channel.on("message")
        def on_message(msg) -> None:
            if isinstance(msg, str) and '"output_audio_buffer.clear"' in msg and _event_type(msg) == "output_audio_buffer.clear":
                self._clear()  # (the transport's own event: the session never sees it)
            elif isinstance(msg, str):
                self.inbox.put_nowait(_fixed_format(msg))
            else:  # (bytes here would be taken for audio by the session's raw path)
                self._send_event({"type": "error", "error": {"type": "invalid_request_error", "code": "binary_not_supported",
                                                             "message": f"the {EVENTS_LABEL} channel takes JSON text events only",
                                                             "param": None}})

        @channel.on("open")
        def on_open() -> None:
            self._flush()

        @channel.on("close")
        def on_close() -> None:
            self._end(1000, "the data channel closed")

        if channel.readyState == "open":
            self._flush()

    def _on_track(self, track) -> None:
        if track.kind == "audio":
            self._spawn(self._read_audio(track))

    async def _read_audio(self, track) -> None:
        convert = InputConverter(self.input_rate)
        try:
            while True:
                frame = await track.recv()
                pcm = convert(frame)
                if pcm:
                    self.inbox.put_nowait(pcm)
        except MediaStreamError:
            return

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        if state == "failed":
            self._end(1006, "the peer connection failed")
        elif state == "closed":
            self._end(1000, "the peer connection closed")

    async def watch_connect(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)
        if self.pc.connectionState != "connected" and not self.closed:
            self._end(1006, f"the peer did not connect within {timeout_s:g} s")

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _end(self, code: int, reason: str) -> None:
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
        self.closed = True
        self.inbox.put_nowait(None)

    # what the server calls
    async def messages(self):
        rate = {"format": {"type": "audio/pcm", "rate": RATE}}
        try:
            yield json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": rate, "output": rate}}})
            while (msg := await self.inbox.get()) is not None:
                yield msg
        finally:
            await self._shutdown()

    async def send(self, frame: str | bytes) -> None:
        if self.closed:
            return
        if isinstance(frame, bytes):
            if self._cut:
                return  # the rest of an answer the client or a barge-in cut off
            if self._response is not None and not self._playing:
                self._playing = True
                self._buffer_event("output_audio_buffer.started")
            self.track.feed(frame)
            return
        if self._own_update and '"session.updated"' in frame[:80]:
            self._own_update = False
            return
        head = frame[:60]
        if '"output_audio.paused"' in head or '"output_audio.resumed"' in head:
            self.track.paused = '"output_audio.paused"' in head  # (a real interruption then clears the queue)
            if not self.extensions:
                return
        elif '"turn.latency"' in head and not self.extensions:
            return
        if '"response.created"' in head:
            self._response, self._playing, self._answered = json.loads(frame)["response"]["id"], False, False
            self._cut = False
        elif '"response.done"' in head and '"cancelled"' in frame:
            self._clear()  # a barge-in or response.cancel: what is queued is not played
        elif '"response.done"' in head:
            self.pending.append(frame)
            self._answered = True
            if not self.track.queued():
                self._drained()
            self._flush()
            return
        self.pending.append(frame)
        self._flush()

    def _buffer_event(self, kind: str) -> None:
        """``output_audio_buffer.started`` / ``.stopped`` / ``.cleared`` of the response whose audio the track plays
        (the API's WebRTC-only events)."""
        self._send_event({"type": kind, "event_id": self._ids("event_rtc"), "response_id": self._response})

    def _clear(self) -> None:
        """The track's queue dropped (a barge-in, a cancel, the client's ``output_audio_buffer.clear``)."""
        self.track.clear()
        self._cut = self._response is not None and not self._answered  # (a finished answer sends nothing more)
        if self._playing:
            self._playing = False
            self._buffer_event("output_audio_buffer.cleared")

    def _drained(self) -> None:
        """The last queued audio went out: the buffer has stopped once the response is done."""
        if self._playing and self._answered:
            self._playing = False
            self._buffer_event("output_audio_buffer.stopped")

    async def close(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self._end(code, reason)
        self._flush()  # the goodbye event, when the channel is open

    def _send_event(self, ev: dict) -> None:
        self.pending.append(json.dumps(ev))
        self._flush()

    def _flush(self) -> None:
        ch = self.channel
        while self.pending and ch is not None and ch.readyState == "open":
            try:
                ch.send(self.pending.popleft())
            except Exception:  # (the transport went away underneath)
                self.pending.clear()
                return

    async def _shutdown(self) -> None:
        self.closed = True
        self.track.stop()
        for task in list(self._tasks):
            task.cancel()
        try:
            await self.pc.close()
        except Exception:  # closing twice, or a transport already gone: nothing left to free
            log.debug("closing a peer connection", exc_info=True)


# -- the route ---------------------------------------------------------------------------------------


class WebRTCCalls:
    """``POST /v1/realtime/calls`` for a ``VoiceServer``: the checks, the answer, then the call runs as a session of
    the server's (``server._handle``) on a task of its own."""

    def __init__(self, server):
        self.server = server
        self.tasks: set[asyncio.Task] = set()
        self._n = 0
        set_ice_hosts(server.opts.host)

    def check(self, request: Request) -> ApiError | None:
        srv = self.server
        origin = request.headers.get("origin")
        if origin is not None and not srv._origin_ok(origin, request.headers.get("host", "")):
            srv.metrics.rejected.labels("origin").inc()
            return ApiError(403, f"origin {origin} is not allowed (allow it with --allow-origin)", code="origin_not_allowed")
        if srv.opts.token:
            auth = request.headers.get("authorization", "")
            offered = auth[7:].strip() if auth.lower().startswith("bearer ") else (parse_qs(request.url.query).get("token") or [None])[0]
            if offered is None or not hmac.compare_digest(offered.encode(), srv.opts.token.encode()):
                srv.metrics.rejected.labels("token").inc()
                what = "missing" if offered is None else "wrong"
                return ApiError(401, f"{what} token: send 'Authorization: Bearer <token>' or ?token=<token>", code="invalid_api_key")
        limits = srv.opts.limits
        in_use = len(srv._conns) + srv.chat.active
        if in_use >= limits.max_sessions:
            srv.metrics.rejected.labels("full").inc()
            return ApiError(503, f"server full: {in_use} of {limits.max_sessions} sessions (chat completions included) in use; "
                            "try again later", type="server_error", code="server_full", headers=(("Retry-After", "1"),))
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/sdp":
            return ApiError(415, f"send the SDP offer as the body with 'Content-Type: application/sdp' (got {ctype or 'none'!r})",
                            code="unsupported_media_type")
        length = request.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > MAX_SDP_BYTES:
            return ApiError(413 if length and length.isdigit() else 411,
                            f"the offer needs a Content-Length of at most {MAX_SDP_BYTES} bytes", code="request_too_large")
        return None

    async def answer(self, request: Request) -> Response:
        err = self.check(request)
        if err is not None:
            return _error(err)
        try:
            offer = (await asyncio.wait_for(request.body(), 10)).decode("utf-8")
        except (TimeoutError, UnicodeDecodeError):
            return _error(ApiError(400, "the offer did not arrive within 10 s as UTF-8 text", code="invalid_offer"))
        if "m=audio" not in offer:
            return _error(ApiError(400, "the offer has no audio (m=audio) section", code="invalid_offer"))
        if "m=application" not in offer:
            return _error(ApiError(400, f"the offer has no data channel (create '{EVENTS_LABEL}' before the offer)",
                                   code="invalid_offer"))
        pc = RTCPeerConnection(ice_config())
        remote = (request.client.host, request.client.port) if request.client else None
        query = parse_qs(request.url.query)
        call = _Call(pc, RATE, RATE, self.server.opts.limits.max_output_bytes, remote, extensions=wants_extensions(query))
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            pc.addTrack(call.track)
            for t in pc.getTransceivers():
                if t.kind == "audio":
                    t.direction = "sendrecv"
            prefer_opus(pc)
            low_latency_audio(pc)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as e:  # an SDP aiortc cannot take
            await pc.close()
            return _error(ApiError(400, f"the offer cannot be answered: {type(e).__name__}: {e}", code="invalid_offer"))
        self._n += 1
        call_id = f"rtc_{self._n}_{int(time.time() * 1000):x}"
        task = asyncio.create_task(self.server._handle(call, CALLS_PATH, {**query, "extensions": ["1"]}))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        call._spawn(call.watch_connect(CONNECT_TIMEOUT_S))
        return Response(pc.localDescription.sdp, 201, headers={"Content-Type": "application/sdp", "Cache-Control": "no-store",
                                                                "Location": f"{CALLS_PATH}/{call_id}"})


def _error(err: ApiError) -> Response:
    response = Response(err.body(), err.status, headers={"Content-Type": "application/json", "Cache-Control": "no-store"})
    for k, v in err.headers:
        response.headers[k] = v
    return response
