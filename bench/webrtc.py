"""Voice-to-voice over WebRTC (``POST /v1/realtime/calls``, Opus both ways, events on ``oai-events``) against the
websocket path (``/v1/realtime``), on the same recording, in one run, measured on the client's clock.

    .venv/bin/python bench/webrtc.py [--turns morning:0 visit:1 ...] [--repeat 3] [--browser] [--json FILE]

Starts ``wafervox serve`` on a free loopback port (its own process), then for each recorded turn and repetition holds
one call over each transport, alternating which goes first: the recording is sent at real-time pace in 20 ms frames
(an aiortc peer with the recording as its microphone track; base64 ``input_audio_buffer.append`` events on the
websocket), followed by silence.  The client's figure: from the moment the recording's last voiced sample
(the manifest's ``speech_end_s``) was handed to the transport to the first audible sample of the answer received
(the inbound track's frame, or the first ``response.output_audio.delta``).  The server's own pipeline figure
(``turn.latency``) is printed beside it, with its stages.  Prints p50 of each per transport, the difference WebRTC -
websocket (pooled, and per turn: the same recording paired), held against a 50 ms bar, and each stage's p50 on both.

``--browser``: the same comparison through the demo page in headless chromium (``?transport=websocket`` and
``?transport=webrtc``, the recording as its fake microphone), on the page's own clock (``wafervox.pageV2V``: the
last microphone sample over a level to the answer's first sample over it).

The client side (``WavTrack``, ``webrtc_turn``, ``websocket_turn``) is imported by tests/server/test_webrtc.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import fractions
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RATE = 48000
FRAME = RATE // 50
AUDIBLE = 300  # int16 peak over which a received frame is the answer's audio (the track is silent between answers)
TRAIL_S = 6.0  # silence after the recording: the answer's time
BAR_MS = 50.0
STAGES = ("endpoint_ms", "asr_ms", "llm_first_token_ms", "first_phrase_ms", "tts_first_audio_ms", "hold_ms", "voice_to_voice_ms")


def turn_pcm(conv: str, i: int, rate: int = RATE) -> tuple[np.ndarray, float, dict]:
    """A recorded turn at ``rate`` with ``TRAIL_S`` of silence after it; its last voiced sample in seconds; its manifest entry."""
    from voice.audio import read_wav, resample
    from voice.replay import manifest

    m = manifest()
    name = m["conversations"][conv][i]
    x, src = read_wav(ROOT / "samples" / name)
    y = resample(x, src, rate)
    return np.concatenate([y, np.zeros(int(TRAIL_S * rate), np.int16)]), float(m["turns"][name]["speech_end_s"]), m["turns"][name]


def _new_track_class():
    from aiortc import MediaStreamTrack
    from aiortc.mediastreams import MediaStreamError

    class WavTrack(MediaStreamTrack):
        """A recording as a microphone: 20 ms frames of PCM16 at 48 kHz on the wall clock, then silence.  ``voiced_sent``
        is when the frame holding sample ``voiced_end`` went out, shifted to that sample (time.monotonic)."""

        kind = "audio"

        def __init__(self, pcm: np.ndarray, voiced_end: int):
            super().__init__()
            self.pcm, self.voiced_end = pcm.astype("<i2"), voiced_end
            self.pos = 0
            self.t0: float | None = None
            self.voiced_sent: float | None = None

        async def recv(self):
            import av

            if self.readyState != "live":
                raise MediaStreamError
            if self.t0 is None:
                self.t0 = time.monotonic()
            else:
                wait = self.t0 + self.pos / RATE - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            chunk = self.pcm[self.pos:self.pos + FRAME]
            if len(chunk) < FRAME:
                chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), "<i2")])
            if self.voiced_sent is None and self.pos <= self.voiced_end < self.pos + FRAME:
                self.voiced_sent = time.monotonic() + (self.voiced_end - self.pos) / RATE
            frame = av.AudioFrame.from_ndarray(chunk.reshape(1, FRAME), format="s16", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = RATE, self.pos, fractions.Fraction(1, RATE)
            self.pos += FRAME
            return frame

    return WavTrack


def post_offer(url: str, sdp: str, token: str | None = None, timeout_s: float = 30) -> tuple[int, str, dict]:
    """POST an SDP offer; (status, body, headers by their lower-case names), errors included."""
    headers = {"Content-Type": "application/sdp"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=sdp.encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), {k.lower(): v for k, v in e.headers.items()}


async def webrtc_turn(base: str, pcm: np.ndarray, speech_end_s: float, *, token: str | None = None, query: str = "?extensions=1",
                      timeout_s: float = 120, low_latency: bool = True, until=None, on_event=None) -> dict:
    """One call: send ``pcm`` (48 kHz) as the microphone until the first response is done and its ``turn.latency``
    came (or until ``until(events)`` is true); the events received (in order), the answer audio's peak and length, and
    the client's voice-to-voice.  ``on_event(event, channel)`` sees each event as it comes (to answer it).
    ``low_latency``: the peer's receiver hands each frame on as it arrives (``server.webrtc.AudioJitter``, as the
    server's does; a browser's adaptive buffer stays near one frame on a clean link), not after aiortc's four more."""
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError

    from server.webrtc import low_latency_audio

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("oai-events")
    mic = _new_track_class()(pcm, int(speech_end_s * RATE))
    pc.addTrack(mic)
    events: list[dict] = []
    done = asyncio.Event()
    opened = asyncio.Event()
    out = {"frames": 0, "audible_frames": 0, "peak": 0, "first_audible": None, "responding": False}
    readers: list[asyncio.Task] = []

    @channel.on("open")
    def on_open():
        opened.set()

    @channel.on("message")
    def on_message(msg):
        ev = json.loads(msg)
        ev["_t"] = time.monotonic()
        events.append(ev)
        if ev["type"] == "response.created":
            out["responding"] = True
        if on_event is not None:
            on_event(ev, channel)
        seen = {e["type"] for e in events}
        if until(events) if until is not None else "response.done" in seen and ("turn.latency" in seen or "extensions=1" not in query):
            done.set()

    async def read(track):
        try:
            while True:
                frame = await track.recv()
                t = time.monotonic()
                x = frame.to_ndarray().reshape(-1)
                out["frames"] += 1
                peak = int(np.abs(x.astype(np.int32)).max()) if len(x) else 0
                if peak > AUDIBLE:
                    out["audible_frames"] += 1
                    out["peak"] = max(out["peak"], peak)
                    if out["first_audible"] is None and out["responding"]:
                        ch = len(frame.layout.channels)
                        idx = int(np.argmax(np.abs(x.astype(np.int32)) > AUDIBLE)) // ch
                        out["first_audible"] = t + idx / frame.sample_rate
        except MediaStreamError:
            return

    @pc.on("track")
    def on_track(track):
        if track.kind == "audio":
            readers.append(asyncio.ensure_future(read(track)))

    try:
        await pc.setLocalDescription(await pc.createOffer())
        status, body, headers = await asyncio.to_thread(post_offer, f"{base}/v1/realtime/calls{query}", pc.localDescription.sdp, token)
        if status != 201:
            raise AssertionError(f"POST /v1/realtime/calls answered {status}: {body[:500]}")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
        if low_latency:
            low_latency_audio(pc)
        await asyncio.wait_for(opened.wait(), 30)
        await asyncio.wait_for(done.wait(), timeout_s)
        await asyncio.sleep(0.3)  # the answer's last frames
    finally:
        for r in readers:
            r.cancel()
        await pc.close()
    return {"events": events, "location": headers.get("location"), "answer_sdp": body, "audio": out,
            "voiced_sent": mic.voiced_sent, "client_v2v_ms": _ms(out["first_audible"], mic.voiced_sent), "report": _report(events)}


async def websocket_turn(ws_url: str, pcm24: np.ndarray, speech_end_s: float, *, timeout_s: float = 120) -> dict:
    """The same turn over ``/v1/realtime``: 20 ms base64 appends at real-time pace (24 kHz, the session's default)."""
    import websockets

    rate = 24000
    step = rate // 50
    voiced_end = int(speech_end_s * rate)
    events: list[dict] = []
    state = {"voiced_sent": None, "first_audio": None}
    async with websockets.connect(ws_url, max_size=None) as ws:
        async def send():
            t0 = time.monotonic()
            for i in range(0, len(pcm24), step):
                wait = t0 + i / rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                chunk = pcm24[i:i + step].astype("<i2")
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk.tobytes()).decode()}))
                if state["voiced_sent"] is None and i <= voiced_end < i + step:
                    state["voiced_sent"] = time.monotonic() + (voiced_end - i) / rate

        sender = asyncio.ensure_future(send())
        try:
            async with asyncio.timeout(timeout_s):
                async for msg in ws:
                    ev = json.loads(msg)
                    ev["_t"] = time.monotonic()
                    if ev["type"] == "response.output_audio.delta":
                        x = np.frombuffer(base64.b64decode(ev.pop("delta")), "<i2")
                        loud = np.flatnonzero(np.abs(x.astype(np.int32)) > AUDIBLE)
                        if state["first_audio"] is None and len(loud):
                            state["first_audio"] = ev["_t"] + loud[0] / rate
                    events.append(ev)
                    if {"response.done", "turn.latency"} <= {e["type"] for e in events}:
                        break
        finally:
            sender.cancel()
    return {"events": events, "voiced_sent": state["voiced_sent"], "client_v2v_ms": _ms(state["first_audio"], state["voiced_sent"]),
            "report": _report(events)}


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
                 "--use-fake-device-for-media-stream", "--allow-loopback-in-peer-connection",
                 "--disable-features=WebRtcHideLocalIpsWithMdns"]


def browser_turn(port: int, wav: Path, transport: str, timeout_s: float = 90) -> dict:
    """The demo page in headless chromium, ``?transport=`` websocket or webrtc, with ``wav`` as its fake microphone
    (chromium loops it: it holds one turn and a long silence); the page's own voice-to-voice (``wafervox.pageV2V``:
    the last microphone sample over its level to the answer's first sample over it, on the AudioContext's clock) and
    the server's figure for the same turn."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={wav}"])
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/?autostart=1&transport={transport}", wait_until="load", timeout=30_000)
            page.wait_for_function("() => window.wafervox && window.wafervox.pageV2V.length > 0 && "
                                   "window.wafervox.turns.some(r => r.latency_ms && r.latency_ms.voice_to_voice_ms != null)",
                                   timeout=timeout_s * 1000, polling=100)
            state = page.evaluate("() => ({v2v: window.wafervox.pageV2V[0], turn: window.wafervox.turns[0]})")
        finally:
            browser.close()
    rep = state["turn"] or {}
    return {"client_v2v_ms": state["v2v"], "report": rep}


def browser_wav(pcm48: np.ndarray, path: Path) -> Path:
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm48.astype("<i2").tobytes())
    return path


def _ms(t: float | None, t0: float | None) -> float | None:
    return None if t is None or t0 is None else round((t - t0) * 1000, 1)


def _report(events: list[dict]) -> dict | None:
    return next((e["report"] for e in events if e["type"] == "turn.latency"), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", nargs="+", default=["morning:0", "visit:1", "morning:2"], help="conversation:index of the manifest")
    ap.add_argument("--repeat", type=int, default=2, help="calls per turn and transport")
    ap.add_argument("--json", help="write every call's figures here")
    ap.add_argument("--browser", action="store_true", help="the demo page in chromium in each mode, in place of Python peers "
                    "(voice-to-voice on the page's clock)")
    args = ap.parse_args()

    from _serve import start_server, stop_server  # beside this script: its folder is on sys.path

    from decode import qint

    print(f"kernel path: {qint.select().name} (this CPU runs {', '.join(qint.available())})", flush=True)
    proc, port = start_server([])
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        for spec in args.turns:
            conv, i = spec.split(":")
            pcm48, end_s, info = turn_pcm(conv, int(i), RATE)
            pcm24, _, _ = turn_pcm(conv, int(i), 24000)
            for r in range(args.repeat):
                order = ("webrtc", "websocket") if r % 2 == 0 else ("websocket", "webrtc")
                for how in order:
                    if args.browser:
                        import tempfile

                        with tempfile.TemporaryDirectory() as tmp:
                            res = browser_turn(port, browser_wav(pcm48, Path(tmp) / "mic.wav"), how)
                    elif how == "webrtc":
                        res = asyncio.run(webrtc_turn(base, pcm48, end_s))
                    else:
                        res = asyncio.run(websocket_turn(f"ws://127.0.0.1:{port}/v1/realtime?extensions=1", pcm24, end_s))
                    rep = res["report"] or {}
                    lat = rep.get("latency_ms") or {}
                    row = {"turn": spec, "transport": how, "client_v2v_ms": res["client_v2v_ms"],
                           "server_v2v_ms": lat.get("voice_to_voice_ms"), "transcript": rep.get("transcript"),
                           "stages_ms": {k: lat.get(k) for k in STAGES}}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    time.sleep(1.0)
    finally:
        stop_server(proc)

    def p50(how, key):
        v = [r[key] for r in rows if r["transport"] == how and r[key] is not None]
        return round(float(statistics.median(v)), 1) if v else None

    summary = {k: {"client_v2v_p50_ms": p50(k, "client_v2v_ms"), "server_v2v_p50_ms": p50(k, "server_v2v_ms")}
               for k in ("webrtc", "websocket")}
    a, b = summary["webrtc"]["client_v2v_p50_ms"], summary["websocket"]["client_v2v_p50_ms"]
    diff = None if a is None or b is None else round(a - b, 1)
    summary["webrtc_minus_websocket_ms"] = diff
    # the same recording, paired: per turn, the p50 over WebRTC less the p50 over the websocket; their median
    per_turn = {}
    for spec in args.turns:
        med = {how: [r["client_v2v_ms"] for r in rows if r["turn"] == spec and r["transport"] == how and r["client_v2v_ms"] is not None]
               for how in ("webrtc", "websocket")}
        if med["webrtc"] and med["websocket"]:
            per_turn[spec] = round(float(statistics.median(med["webrtc"]) - statistics.median(med["websocket"])), 1)
    summary["per_turn_webrtc_minus_websocket_ms"] = per_turn
    summary["paired_median_ms"] = round(float(statistics.median(per_turn.values())), 1) if per_turn else None
    # the transport's own share, less noisy than either figure: the client's figure less the server's for the same call
    # (the server's starts at its endpointer's last voiced sample and ends when the answer's first sample is handed over)
    for how in ("webrtc", "websocket"):
        d = [r["client_v2v_ms"] - r["server_v2v_ms"] for r in rows
             if r["transport"] == how and r["client_v2v_ms"] is not None and r["server_v2v_ms"] is not None]
        summary[how]["client_less_server_p50_ms"] = round(float(statistics.median(d)), 1) if d else None
    a_, b_ = summary["webrtc"]["client_less_server_p50_ms"], summary["websocket"]["client_less_server_p50_ms"]
    summary["transport_overhead_ms"] = None if a_ is None or b_ is None else round(a_ - b_, 1)
    for stage in STAGES:  # where a difference comes from: each stage's p50 on both (the server's reports)
        v = {how: [r["stages_ms"][stage] for r in rows if r["transport"] == how and r["stages_ms"][stage] is not None]
             for how in ("webrtc", "websocket")}
        summary.setdefault("stage_p50_ms", {})[stage] = {how: round(float(statistics.median(x)), 1) if x else None for how, x in v.items()}
    summary["bar_ms"] = BAR_MS
    summary["within_bar"] = bool(diff is not None and diff <= BAR_MS)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
