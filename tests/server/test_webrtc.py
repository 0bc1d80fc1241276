"""The WebRTC transport (``POST /v1/realtime/calls``) end to end on loopback, with the real engines: an aiortc peer
sends a recorded turn as its microphone track (Opus), and gets the Realtime events on ``oai-events`` and the answer's
audio on its inbound track; the handshake's refusals.  ICE: host candidates on 127.0.0.1, no STUN server."""

from __future__ import annotations

import asyncio
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from running_server import TOKEN, Running

from server.app import ServerOptions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from webrtc import post_offer, turn_pcm, webrtc_turn  # noqa: E402  (the client side, shared with bench/webrtc.py)

CALLS = "/v1/realtime/calls"
#: a well-formed offer with a data channel and no audio section
NO_AUDIO_OFFER = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _count(events, kind: str) -> int:
    return sum(e["type"] == kind for e in events)


def test_webrtc_call_holds_a_spoken_turn(server):
    pcm, end_s, info = turn_pcm("morning", 0)

    def answered(events):  # the answer done, its figures, and its audio drained from the track
        return all(_count(events, k) for k in ("response.done", "turn.latency", "output_audio_buffer.stopped"))

    res = asyncio.run(asyncio.wait_for(webrtc_turn(server.base, pcm, end_s, token=TOKEN, until=answered), 150))
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
    # the output audio buffer's events (WebRTC only): started with the answer's audio, stopped once it drained
    rid = done["response"]["id"]
    started, stopped = (next(e for e in res["events"] if e["type"] == k) for k in ("output_audio_buffer.started",
                                                                                    "output_audio_buffer.stopped"))
    assert started["response_id"] == rid == stopped["response_id"] and started["event_id"] != stopped["event_id"]
    assert types.index("response.created") < types.index("output_audio_buffer.started") < types.index("response.done") \
        < types.index("output_audio_buffer.stopped"), types
    assert "output_audio_buffer.cleared" not in types
    import pydantic
    from openai.types.realtime import RealtimeServerEvent

    for ev in (started, stopped):  # as the official SDK types them
        pydantic.TypeAdapter(RealtimeServerEvent).validate_python({k: v for k, v in ev.items() if k != "_t"})
    reply = "".join(e.get("delta", "") for e in res["events"] if e["type"] == "response.output_audio_transcript.delta")
    assert reply.strip(), types
    # the answer's audio came back on the track, as Opus decoded by the peer
    audio = res["audio"]
    assert audio["audible_frames"] >= 10 and audio["peak"] > 1000, audio
    assert res["client_v2v_ms"] is not None and 0 < res["client_v2v_ms"] < 10_000, res["client_v2v_ms"]
    assert res["report"] and res["report"]["latency_ms"]["voice_to_voice_ms"] is not None, res["report"]
    _hung_up(server)


def _hung_up(server) -> None:
    """The call is over: its session is gone from the server (its teardown runs on the server's loop)."""
    for _ in range(100):
        if not server.server._conns:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert not server.server._conns


def test_webrtc_barge_in_clears_the_output_buffer_and_the_next_answer_plays(server):
    """The barge-in recording as the microphone: the user asks, then cuts the answer off with a second question.  The
    cut answer's response ends as the API says (cancelled, turn_detected) with ``output_audio_buffer.cleared``; the
    second is answered and its buffer stops once drained."""
    from voice.audio import read_wav, resample
    from voice.replay import manifest

    barge = manifest()["barge_in"]
    x, src = read_wav(ROOT / "samples" / barge["file"])
    pcm = np.concatenate([resample(x, src, 48000), np.zeros(6 * 48000, np.int16)])

    def both(events):
        return _count(events, "response.done") >= 2 and _count(events, "output_audio_buffer.stopped") >= 1

    res = asyncio.run(asyncio.wait_for(webrtc_turn(server.base, pcm, barge["speech_end_s"], token=TOKEN, until=both), 150))
    evs, types = res["events"], [e["type"] for e in res["events"]]
    first, second = [e["response"] for e in evs if e["type"] == "response.done"][:2]
    assert (first["status"], first["status_details"]["reason"]) == ("cancelled", "turn_detected"), first
    assert second["status"] == "completed", second
    [cleared] = [e for e in evs if e["type"] == "output_audio_buffer.cleared"]
    assert cleared["response_id"] == first["id"]
    cut = types.index("output_audio_buffer.cleared")
    assert "input_audio_buffer.speech_started" in types[types.index("output_audio_buffer.started"):cut], types
    [stopped] = [e for e in evs if e["type"] == "output_audio_buffer.stopped"]
    assert stopped["response_id"] == second["id"]
    heard = [e["transcript"] for e in evs if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert len(heard) == 2 and "owner" in heard[1].lower(), heard
    _hung_up(server)


def test_webrtc_client_clears_the_output_buffer(server):
    """``output_audio_buffer.clear`` from the client (after its ``response.cancel``, as the API asks) cuts the answer
    on the track: ``output_audio_buffer.cleared`` for that response, and no ``stopped``."""
    pcm, end_s, _ = turn_pcm("morning", 0)

    def cut(ev, channel):
        if ev["type"] == "output_audio_buffer.started":
            channel.send('{"type": "response.cancel"}')
            channel.send('{"type": "output_audio_buffer.clear"}')

    def cleared(events):
        return _count(events, "output_audio_buffer.cleared") and _count(events, "response.done")

    res = asyncio.run(asyncio.wait_for(webrtc_turn(server.base, pcm, end_s, token=TOKEN, until=cleared, on_event=cut), 150))
    evs, types = res["events"], [e["type"] for e in res["events"]]
    started = next(e for e in evs if e["type"] == "output_audio_buffer.started")
    [clear] = [e for e in evs if e["type"] == "output_audio_buffer.cleared"]
    assert clear["response_id"] == started["response_id"]
    assert "output_audio_buffer.stopped" not in types and not any(e["type"] == "error" for e in evs), types
    _hung_up(server)


def _status(url: str, method: str = "POST", data: bytes | None = None, headers: dict | None = None) -> tuple[int, str]:
    """The status and body of a request the server should refuse (200 and no body where it answers it)."""
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        urllib.request.urlopen(req, timeout=10)
        return 200, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("send, want_status, want_in_body", [
    pytest.param(lambda url: post_offer(url, NO_AUDIO_OFFER, None)[:2], 401, "invalid_api_key", id="no_token"),
    pytest.param(lambda url: _status(url, data=b"{}", headers={"Content-Type": "application/json", **AUTH}),
                 415, "application/sdp", id="wrong_type"),
    pytest.param(lambda url: post_offer(url, NO_AUDIO_OFFER, TOKEN)[:2], 400, "m=audio", id="no_audio"),
    pytest.param(lambda url: post_offer(url, "m=audio\r\nm=application\r\nnonsense", TOKEN)[:2], 400, "invalid_offer", id="garbage"),
    pytest.param(lambda url: _status(url, method="GET"), 405, "", id="get"),
    pytest.param(lambda url: _status(url, data=NO_AUDIO_OFFER.encode(),  # a page of another site may not place calls here
                                     headers={"Content-Type": "application/sdp", **AUTH, "Origin": "http://elsewhere.example"}),
                 403, "origin", id="origin"),
])
def test_webrtc_handshake_refusals(server, send, want_status, want_in_body):
    status, body = send(server.base + CALLS)
    assert status == want_status and want_in_body in body, (status, body)
    assert not server.server._conns


def test_webrtc_call_refused_when_full(shared):
    """The session count holds for calls as for sockets: a full server answers 503 (Retry-After) before any SDP work."""
    from server.session import Limits

    s = Running(shared, ServerOptions(port=0, limits=Limits(max_sessions=0)))
    try:
        status, body, headers = post_offer(s.base + CALLS, "m=audio\r\nm=application\r\n")
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


def test_output_track_paused_sends_silence_and_keeps_its_queue():
    """Speech over the answer is judged (``output_audio.paused``): the track sends silence and keeps what is queued; on
    resume it goes on from there; a clear (a real interruption) drops it and unpauses."""
    from server.webrtc import OutputTrack

    async def go():
        track = OutputTrack(48000, 1 << 20)
        track.feed((np.arange(4800, dtype="<i2") % 100 + 1000).tobytes())  # 100 ms, never silent
        first = await track.recv()
        track.paused = True
        held = [await track.recv() for _ in range(2)]
        queued = track.queued()
        track.paused = False
        resumed = await track.recv()
        track.paused = True
        track.clear()
        return first, held, queued, resumed, track.paused, track.queued()

    first, held, queued, resumed, paused, left = asyncio.run(go())
    assert np.abs(first.to_ndarray()).min() >= 1000 and all(np.abs(f.to_ndarray()).max() == 0 for f in held)
    assert queued == 2 * (4800 - 960)  # nothing was taken while paused
    assert resumed.to_ndarray()[0, 0] == 1000 + 960 % 100  # the next sample after the first frame
    assert (paused, left) == (False, 0)
