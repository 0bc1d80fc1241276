"""``wafervox serve`` end to end, over real sockets on loopback, with the real engines: the openai SDK
as a client, our native path and ``wafervox client``, two sessions at once, barge-in over the wire,
the handshake checks and the limits."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import websockets
from running_server import TOKEN
from running_server import Running as _Running  # the name the other server test modules import from here

from server.app import ServerOptions
from server.client import ClientOptions, run_client
from server.session import Limits
from voice.audio import read_wav, resample
from voice.replay import manifest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"


def pcm_at(path, rate=24000) -> np.ndarray:
    x, src = read_wav(path)
    return resample(x, src, rate)


def turn_file(conv="morning", i=0) -> Path:
    return SAMPLES / manifest()["conversations"][conv][i]


def turn_info(conv="morning", i=0) -> dict:
    m = manifest()
    return m["turns"][m["conversations"][conv][i]]


def b64(pcm: np.ndarray) -> str:
    return base64.b64encode(pcm.astype("<i2").tobytes()).decode()


def run(coro, timeout=120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ------------------------------------------------------------------ the openai SDK as a client


def test_openai_sdk_realtime_turn(server):
    from openai import AsyncOpenAI
    from openai.types.realtime import (
        ConversationItemInputAudioTranscriptionCompletedEvent,
        InputAudioBufferCommittedEvent,
        InputAudioBufferSpeechStartedEvent,
        InputAudioBufferSpeechStoppedEvent,
        RealtimeServerEvent,
        ResponseAudioDeltaEvent,
        ResponseAudioTranscriptDoneEvent,
        ResponseCreatedEvent,
        ResponseDoneEvent,
        SessionCreatedEvent,
        SessionUpdatedEvent,
    )
    from pydantic import TypeAdapter

    strict = TypeAdapter(RealtimeServerEvent)
    info = turn_info()
    audio = np.concatenate([pcm_at(turn_file()), np.zeros(24000 * 2, np.int16)])

    async def go():
        client = AsyncOpenAI(api_key=TOKEN, websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
        events, raw = [], []
        async with client.realtime.connect(model="wafervox") as conn:
            await conn.session.update(session={"type": "realtime", "instructions": "",
                                               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}})
            for i in range(0, len(audio), 2400):  # 100 ms appends, as fast as the SDK sends them
                await conn.input_audio_buffer.append(audio=b64(audio[i:i + 2400]))
            while True:
                data = await conn.recv_bytes()
                ev = conn.parse_event(data)
                events.append(ev)
                raw.append(json.loads(data))
                if raw[-1]["type"] == "response.done":
                    break
            try:  # anything sent after the answer (our turn.latency went here): nothing, for a client that did not ask
                while True:
                    data = await asyncio.wait_for(conn.recv_bytes(), 1.5)
                    events.append(conn.parse_event(data))
                    raw.append(json.loads(data))
            except TimeoutError:
                pass
        return events, raw

    events, raw = run(go())
    types = [r["type"] for r in raw]
    for kind, cls in [("session.created", SessionCreatedEvent), ("session.updated", SessionUpdatedEvent),
                      ("input_audio_buffer.speech_started", InputAudioBufferSpeechStartedEvent),
                      ("input_audio_buffer.speech_stopped", InputAudioBufferSpeechStoppedEvent),
                      ("input_audio_buffer.committed", InputAudioBufferCommittedEvent),
                      ("conversation.item.input_audio_transcription.completed", ConversationItemInputAudioTranscriptionCompletedEvent),
                      ("response.created", ResponseCreatedEvent), ("response.output_audio.delta", ResponseAudioDeltaEvent),
                      ("response.output_audio_transcript.done", ResponseAudioTranscriptDoneEvent),
                      ("response.done", ResponseDoneEvent)]:
        assert kind in types, f"no {kind} in {types}"
        ev = events[types.index(kind)]
        assert isinstance(ev, cls), (kind, type(ev))
    for r in raw:  # every event validates strictly against the SDK's models: no extension event without asking
        strict.validate_python(r)
    assert not {"turn.latency", "session.latency"} & set(types)
    order = [types.index(k) for k in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                                      "conversation.item.input_audio_transcription.completed", "response.created",
                                      "response.output_audio.delta", "response.done")]
    assert order == sorted(order)
    transcript = events[types.index("conversation.item.input_audio_transcription.completed")].transcript
    assert set(info["text"].lower().replace("?", "").split()) & set(transcript.lower().replace("?", "").replace(",", "").split())
    done = events[types.index("response.done")]
    assert done.response.status == "completed"
    reply = done.response.output[0].content[0].transcript
    assert any(k.lower() in reply.lower() for k in info["keywords"]), reply
    audio_out = sum(len(base64.b64decode(r["delta"])) for r in raw if r["type"] == "response.output_audio.delta")
    assert audio_out > 24000 * 2 * 0.5  # at least half a second of answer at 24 kHz


def test_openai_sdk_asks_for_the_extension_events(server):
    """``extra_query={"extensions": "1"}``: the same SDK session gets our ``turn.latency`` after the answer."""
    from openai import AsyncOpenAI

    audio = np.concatenate([pcm_at(turn_file()), np.zeros(24000 * 2, np.int16)])

    async def go():
        client = AsyncOpenAI(api_key=TOKEN, websocket_base_url=f"ws://127.0.0.1:{server.port}/v1")
        raw = []
        async with client.realtime.connect(model="wafervox", extra_query={"extensions": "1"}) as conn:
            await conn.session.update(session={"type": "realtime",
                                               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}})
            for i in range(0, len(audio), 2400):
                await conn.input_audio_buffer.append(audio=b64(audio[i:i + 2400]))
            while not raw or raw[-1]["type"] != "turn.latency":
                raw.append(json.loads(await asyncio.wait_for(conn.recv_bytes(), 60)))
        return raw

    raw = run(go())
    done = next(r for r in raw if r["type"] == "response.done")
    report = raw[-1]["report"]
    assert report["reply"] == done["response"]["output"][0]["content"][0]["transcript"]
    assert report["latency_ms"]["voice_to_voice_ms"] > 0 and report["budget_ms"] == 500.0
    assert isinstance(report["within_budget"], bool) and report["response_id"] == done["response"]["id"]


# ------------------------------------------------------------------ native path, our client, two sessions


def test_native_stream_with_our_client(server):
    info = turn_info("visit", 0)
    turns = []
    summary = run(run_client([turn_file("visit", 0)], ClientOptions(url=server.url("/v1/stream"), token=TOKEN, tail_s=2.0),
                             on_turn=turns.append))
    assert summary["turns"] == 1 and len(turns) == 1
    t = turns[0]
    assert any(k.lower() in t["reply"].lower() for k in info["keywords"]), t
    v2v, own = t["latency_ms"]["voice_to_voice_ms"], t["server_voice_to_voice_ms"]
    assert v2v is not None and own is not None and v2v > 0
    assert -50 < t["overhead_ms"] < 1000  # loopback: the client's figure is the server's plus transport
    # output_audio.played put the same figure on the client's audio clock (samples sent), in turn.latency
    assert t["reported_client_voice_to_voice_ms"] is not None
    assert abs(t["reported_client_voice_to_voice_ms"] - v2v) < 100


def test_two_sessions_at_once_no_cross_talk(server):
    a_info, b_info = turn_info("morning", 1), turn_info("visit", 1)

    async def both():
        ta, tb = [], []
        await asyncio.gather(
            run_client([turn_file("morning", 1)], ClientOptions(url=server.url(), token=TOKEN, tail_s=2.0), on_turn=ta.append),
            run_client([turn_file("visit", 1)], ClientOptions(url=server.url(), token=TOKEN, tail_s=2.0), on_turn=tb.append))
        return ta, tb

    ta, tb = run(both())
    assert len(ta) == 1 and len(tb) == 1
    for t, info in ((ta[0], a_info), (tb[0], b_info)):
        words = set(t["transcript"].lower().replace("?", "").replace(",", "").split())
        own = set(info["text"].lower().replace("?", "").split())
        assert len(words & own) >= len(own) // 2, (t["transcript"], info["text"])
        assert any(k.lower() in t["reply"].lower() for k in info["keywords"]), t
        assert t["latency_ms"]["voice_to_voice_ms"] is not None


def test_cli_client_json(server):
    out = subprocess.run([sys.executable, "-m", "server.cli", "client", str(turn_file("morning", 2)), "--url", server.url(),
                          "--token", TOKEN, "--json", "--tail-s", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert "summary" in lines[-1] and lines[-1]["summary"]["turns"] == 1
    t = lines[0]
    for key in ("turn", "transcript", "reply", "latency_ms", "budget_ms", "within_budget", "mitigation", "server_voice_to_voice_ms"):
        assert key in t
    assert t["latency_ms"]["voice_to_voice_ms"] > 0


def test_cli_client_without_the_token_is_refused_in_one_line(server):
    out = subprocess.run([sys.executable, "-m", "server.cli", "client", str(turn_file()), "--url", server.url()],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("wafervox: error: ") and "401" in out.stderr
    assert "Traceback" not in out.stderr


def test_input_buffer_limit(shared):
    """An utterance longer than --max-input-s is cleared with an error; the session goes on."""
    s = _Running(shared, ServerOptions(port=0, limits=Limits(max_input_s=1.0)))
    try:
        async def go():
            async with websockets.connect(s.url()) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                    "turn_detection": None}}}}))
                await _events_until(ws, lambda e: e["type"] == "session.updated")
                noise = (np.random.default_rng(0).standard_normal(2400) * 3000).astype(np.int16)
                for _ in range(11):  # 1.1 s: the 11th append overflows the 1 s limit
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(noise)}))
                err = await _events_until(ws, lambda e: e["type"] == "error")
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                after = await _events_until(ws, lambda e: e["type"] == "error")
                return err[-1]["error"], after[-1]["error"]

        err, after = run(go(), 60)
        assert err["code"] == "input_audio_buffer_overflow" and "1 s" in err["message"]
        assert after["code"] == "input_audio_buffer_commit_empty"  # the buffer was cleared
    finally:
        s.close()


# ------------------------------------------------------------------ barge-in, text turns, cancel


async def _events_until(ws, pred, timeout=60):
    got = []
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.recv()
            ev = json.loads(msg)
            got.append(ev)
            if pred(ev):
                return got


def test_barge_in_over_the_wire(server):
    """The owner interrupts the answer: the response is cancelled (turn_detected), the client truncates
    the item to what it played, the server confirms, and the turn is reported as a barge-in."""
    bi = manifest()["barge_in"]
    audio = pcm_at(SAMPLES / bi["file"])
    audio = np.concatenate([audio, np.zeros(24000 * 3, np.int16)])

    async def go():
        async with websockets.connect(server.url(), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            await _events_until(ws, lambda e: e["type"] == "session.created")
            events = []

            async def feed():
                for i in range(0, len(audio), 480):  # real time, 20 ms
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(audio[i:i + 480])}))
                    await asyncio.sleep(0.02)

            feeder = asyncio.create_task(feed())
            events += await _events_until(ws, lambda e: e["type"] == "response.done" and e["response"]["status"] == "cancelled", 90)
            done = events[-1]
            events += await _events_until(ws, lambda e: e["type"] == "turn.latency", 30)
            assert events[-1]["report"]["barge_in"] is True
            item = done["response"]["output"][0]["id"]
            await ws.send(json.dumps({"type": "conversation.item.truncate", "item_id": item, "content_index": 0, "audio_end_ms": 200}))
            events += await _events_until(ws, lambda e: e["type"] == "conversation.item.truncated", 30)
            feeder.cancel()
            return events, done

    events, done = run(go(), 150)
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    types = [e["type"] for e in events]
    assert "response.output_audio.delta" in types[:types.index("response.done")]
    truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
    assert truncated["audio_end_ms"] == 200
    assert "input_audio_buffer.speech_started" in types[types.index("response.created"):]


def test_text_turn_and_cancel(server):
    async def go():
        async with websockets.connect(server.url(), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            await _events_until(ws, lambda e: e["type"] == "session.created")
            await ws.send(json.dumps({"type": "response.create"}))
            err = await _events_until(ws, lambda e: e["type"] == "error")
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "How much is a croissant?"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            first = await _events_until(ws, lambda e: e["type"] == "turn.latency")
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Where can I find you?"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            await _events_until(ws, lambda e: e["type"] == "response.output_audio.delta")
            await ws.send(json.dumps({"type": "response.cancel"}))
            second = await _events_until(ws, lambda e: e["type"] == "response.done")
            await ws.send(json.dumps({"type": "session.latency"}))
            summary = await _events_until(ws, lambda e: e["type"] == "session.latency")
            return err, first, second, summary

    err, first, second, summary = run(go())
    assert err[-1]["error"]["code"] == "no_user_input"
    done = next(e for e in first if e["type"] == "response.done")
    assert done["response"]["status"] == "completed" and "2" in done["response"]["output"][0]["content"][0]["transcript"]
    assert first[-1]["report"]["latency_ms"]["voice_to_voice_ms"] is None  # a typed turn has no voice stages
    assert second[-1]["response"]["status"] == "cancelled"
    assert second[-1]["response"]["status_details"]["reason"] == "client_cancelled"
    assert summary[-1]["summary"]["turns"] == 0  # typed turns stay out of the voice figures


def test_manual_turns_with_commit(server):
    """turn_detection null: no VAD events on the wire; the client commits, and the turn is answered."""
    info = turn_info("visit", 2)
    audio = pcm_at(turn_file("visit", 2), 16000)

    async def go():
        async with websockets.connect(server.url(), additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            await _events_until(ws, lambda e: e["type"] == "session.created")
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}}}}))
            upd = await _events_until(ws, lambda e: e["type"] == "session.updated")
            for i in range(0, len(audio), 3200):
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(audio[i:i + 3200])}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            return upd, await _events_until(ws, lambda e: e["type"] == "turn.latency", 60)

    upd, events = run(go())
    assert upd[-1]["session"]["audio"]["input"]["turn_detection"] is None
    assert upd[-1]["session"]["audio"]["input"]["format"]["rate"] == 16000
    types = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" not in types and "input_audio_buffer.speech_stopped" not in types
    assert types.index("input_audio_buffer.committed") < types.index("response.created")
    done = next(e for e in events if e["type"] == "response.done")
    reply = done["response"]["output"][0]["content"][0]["transcript"]
    assert any(k.lower() in reply.lower() for k in info["keywords"]), reply


# ------------------------------------------------------------------ handshake, HTTP routes, limits


def _http(port, path, headers=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read()


def test_token_origin_and_http_routes(server):
    async def attempt(**kw):
        try:
            async with websockets.connect(server.url(), open_timeout=10, **kw) as ws:
                return json.loads(await ws.recv())["type"]
        except websockets.InvalidStatus as e:
            return e.response.status_code

    assert run(attempt()) == 401
    assert run(attempt(additional_headers={"Authorization": "Bearer wrong"})) == 401
    assert run(attempt(additional_headers={"Authorization": f"Bearer {TOKEN}"})) == "session.created"
    assert run(attempt(subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"])) == "session.created"
    assert run(attempt(additional_headers={"Authorization": f"Bearer {TOKEN}"}, origin="http://evil.example")) == 403
    assert run(attempt(additional_headers={"Authorization": f"Bearer {TOKEN}"},
                       origin=f"http://127.0.0.1:{server.port}")) == "session.created"
    status, ctype, body = _http(server.port, "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, ctype, body = _http(server.port, "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    text = body.decode()
    for name in ("wafervox_turn_stage_seconds_bucket", "wafervox_budget_hit_rate", "wafervox_sessions_active", "wafervox_errors_total"):
        assert name in text
    assert _http(server.port, "/nope")[0] == 404
    assert _http(server.port, "/static/../app.py")[0] == 404


def test_limits_bad_input_and_full_server(shared):
    s = _Running(shared, ServerOptions(port=0, limits=Limits(max_sessions=1, max_message_bytes=4096, idle_timeout_s=1.5)))
    try:
        async def go():
            async with websockets.connect(s.url()) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                # a second connection while full: refused with a clear close reason
                async with websockets.connect(s.url()) as ws2:
                    with pytest.raises(websockets.ConnectionClosed) as closed:
                        await ws2.recv()
                assert closed.value.rcvd.code == 1013 and "server full" in closed.value.rcvd.reason
                bad = ["not json", json.dumps([1, 2]), json.dumps({"type": "nope"}), json.dumps({"type": "input_audio_buffer.append"}),
                       json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}),
                       json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 6000})]
                for m in bad:
                    await ws.send(m)
                await ws.send(b"\x00\x01")  # binary frames are for /v1/stream
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))  # nothing to commit
                codes = []
                for _ in range(len(bad) + 2):
                    ev = (await _events_until(ws, lambda e: e["type"] == "error"))[-1]
                    codes.append(ev["error"]["code"])
                # ... and the session goes on
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
                upd = await _events_until(ws, lambda e: e["type"] == "session.updated")
                # idle: closed by the server after a session.latency summary
                rest = []
                with pytest.raises(websockets.ConnectionClosed) as idle:
                    while True:
                        rest.append(json.loads(await ws.recv()))
                return codes, upd, rest, idle.value.rcvd

        codes, upd, rest, close = run(go(), 60)
        assert codes == ["invalid_json", "invalid_event", "unknown_event_type", "missing_required_parameter", "invalid_audio",
                         "message_too_large", "binary_not_supported", "input_audio_buffer_commit_empty"]
        assert upd[-1]["session"]["instructions"] == "Be brief."
        assert rest and rest[-1]["type"] == "session.latency"
        assert close.code == 1000 and "idle" in close.reason
        # the slot is free again
        assert run(_first_type(s.url())) == "session.created"
    finally:
        s.close()


async def _first_type(url):
    async with websockets.connect(url) as ws:
        return json.loads(await ws.recv())["type"]


def test_output_backpressure_drops_audio_with_an_error(shared):
    """A client that stops reading: its output is buffered up to the limit, then audio is dropped
    with one error event, and memory stays bounded."""
    s = _Running(shared, ServerOptions(port=0, limits=Limits(max_output_bytes=32 << 10)))
    try:
        async def go():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", s.port))
            async with websockets.connect(s.url(), sock=sock, max_queue=1, max_size=None) as ws:
                await _events_until(ws, lambda e: e["type"] == "session.created")
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                    "output": {"format": {"type": "audio/pcm", "rate": 48000}}}}}))
                await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "What are your hours?"}]}}))
                await ws.send(json.dumps({"type": "response.create"}))
                dropped, end = s.server.metrics.dropped, asyncio.get_running_loop().time() + 120
                while dropped._value.get() == 0:  # not reading while the answer is produced, until it had to drop some
                    assert asyncio.get_running_loop().time() < end, "the server never dropped output for the client"
                    await asyncio.sleep(0.05)
                return await _events_until(ws, lambda e: e["type"] == "turn.latency", 60)

        events = run(go(), 120)
        errors = [e for e in events if e["type"] == "error"]
        assert errors and {e["error"]["code"] for e in errors} == {"output_buffer_full"}  # one per overflow episode
        assert any(e["type"] == "response.done" for e in events)  # the events themselves still arrive
        assert s.server.metrics.dropped._value.get() > 0
    finally:
        s.close()
