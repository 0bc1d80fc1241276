"""The WebRTC transport (``POST /v1/realtime/calls``) end to end on loopback, with the real engines: an aiortc peer
sends a recorded turn as its microphone track (Opus), and gets the Realtime events on ``oai-events`` and the answer's
audio on its inbound track; the handshake's refusals.  ICE: host candidates on 127.0.0.1, no STUN server."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from server.app import ServerOptions, VoiceServer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from webrtc import post_offer, turn_pcm, webrtc_turn  # noqa: E402  (the client side, shared with bench/webrtc.py)

TOKEN = "test-token-rtc"


class _Running:
    """A VoiceServer on its own event loop thread."""

    def __init__(self, shared, opts: ServerOptions):
        self.loop = asyncio.new_event_loop()
        self.server = VoiceServer(shared, opts)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.server.start())
        self.port = self.server.port
        self.base = f"http://127.0.0.1:{self.port}"

    def call(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server(shared):
    s = _Running(shared, ServerOptions(port=0, token=TOKEN))
    yield s
    s.close()


def test_webrtc_call_holds_a_spoken_turn(server):
    pcm, end_s, info = turn_pcm("morning", 0)
    res = asyncio.run(asyncio.wait_for(webrtc_turn(server.base, pcm, end_s, token=TOKEN), 150))
    types = [e["type"] for e in res["events"]]
    assert types[0] == "session.created", types[:5]
    assert res["location"] and res["location"].startswith("/v1/realtime/calls/"), res["location"]
    sdp = res["answer_sdp"]
    assert "opus/48000" in sdp.lower() and "m=audio" in sdp and "webrtc-datachannel" in sdp, sdp
    # host candidates on loopback only: no STUN (no srflx), no other interface
    cands = [line for line in sdp.splitlines() if line.startswith("a=candidate:")]
    assert cands and all(" 127.0.0.1 " in c and "typ host" in c for c in cands), cands
    # the spoken turn, as on /v1/realtime (but no audio deltas: the audio is on the track)
    for t in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
              "conversation.item.input_audio_transcription.completed", "response.created", "response.done"):
        assert t in types, (t, types)
    assert "response.output_audio.delta" not in types, "audio went over the data channel"
    assert "session.updated" not in types, "the adapter's own session.update (48 kHz PCM inside) was answered to the client"
    transcript = next(e["transcript"] for e in res["events"] if e["type"] == "conversation.item.input_audio_transcription.completed")
    words = set(transcript.lower().replace("?", "").replace(",", "").split())
    assert words & set(info["text"].lower().replace("?", "").replace(",", "").split()), transcript
    done = next(e for e in res["events"] if e["type"] == "response.done")
    assert done["response"]["status"] == "completed", done
    reply = "".join(e.get("delta", "") for e in res["events"] if e["type"] == "response.output_audio_transcript.delta")
    assert reply.strip(), types
    # the answer's audio came back on the track, as Opus decoded by the peer
    audio = res["audio"]
    assert audio["audible_frames"] >= 10 and audio["peak"] > 1000, audio
    assert res["client_v2v_ms"] is not None and 0 < res["client_v2v_ms"] < 10_000, res["client_v2v_ms"]
    assert res["report"] and res["report"]["latency_ms"]["voice_to_voice_ms"] is not None, res["report"]
    # the call is over: its session is gone from the server
    for _ in range(50):
        if not server.server._conns:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert not server.server._conns


@pytest.mark.parametrize("case", ["no_token", "wrong_type", "no_audio", "garbage", "get", "origin"])
def test_webrtc_handshake_refusals(server, case):
    import urllib.request

    offer = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
    if case == "get":
        req = urllib.request.Request(f"{server.base}/v1/realtime/calls", method="GET")
        try:
            urllib.request.urlopen(req, timeout=10)
            status = 200
        except urllib.error.HTTPError as e:
            status = e.code
        assert status == 405
        return
    if case == "no_token":
        status, body, _ = post_offer(f"{server.base}/v1/realtime/calls", offer, None)
        assert status == 401 and "invalid_api_key" in body, (status, body)
    elif case == "wrong_type":
        req = urllib.request.Request(f"{server.base}/v1/realtime/calls", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
        try:
            urllib.request.urlopen(req, timeout=10)
            status, body = 200, ""
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode()
        assert status == 415 and "application/sdp" in body, (status, body)
    elif case == "origin":  # a page of another site may not place calls here
        req = urllib.request.Request(f"{server.base}/v1/realtime/calls", data=offer.encode(), method="POST",
                                     headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {TOKEN}",
                                              "Origin": "http://elsewhere.example"})
        try:
            urllib.request.urlopen(req, timeout=10)
            status, body = 200, ""
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode()
        assert status == 403 and "origin" in body, (status, body)
    elif case == "no_audio":
        status, body, _ = post_offer(f"{server.base}/v1/realtime/calls", offer, TOKEN)
        assert status == 400 and "m=audio" in body, (status, body)
    else:
        status, body, _ = post_offer(f"{server.base}/v1/realtime/calls", "m=audio\r\nm=application\r\nnonsense", TOKEN)
        assert status == 400 and "invalid_offer" in body, (status, body)
    assert not server.server._conns


def test_webrtc_call_refused_when_full(shared):
    """The session count holds for calls as for sockets: a full server answers 503 (Retry-After) before any SDP work."""
    from server.session import Limits

    s = _Running(shared, ServerOptions(port=0, limits=Limits(max_sessions=0)))
    try:
        status, body, headers = post_offer(f"{s.base}/v1/realtime/calls", "m=audio\r\nm=application\r\n")
    finally:
        s.close()
    assert status == 503 and "server_full" in body and headers.get("retry-after") == "1", (status, body, headers)


def test_output_track_paces_frames_and_clears():
    """The outbound track alone: 20 ms frames at 48 kHz, the queued audio first, then silence; ``clear`` drops the rest."""
    from server.webrtc import FRAME, RATE, OutputTrack

    async def go():
        track = OutputTrack(24000, 1 << 20)
        track.feed((np.ones(4800, "<i2") * 1000).tobytes())  # 200 ms at 24 kHz
        frames = [await track.recv() for _ in range(3)]
        track.clear()
        after = await track.recv()
        return frames, after

    frames, after = asyncio.run(go())
    assert all(f.sample_rate == RATE and f.samples == FRAME for f in frames)
    assert [f.pts for f in frames] == [0, FRAME, 2 * FRAME] and after.pts == 3 * FRAME
    assert np.abs(frames[1].to_ndarray()).max() > 900
    assert np.abs(after.to_ndarray()).max() == 0
